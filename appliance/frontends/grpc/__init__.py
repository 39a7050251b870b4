"""gRPC front end (the synchronous grpc.server): Triton's GRPCInferenceService."""
