"""gRPC front end (grpc.aio): Triton's GRPCInferenceService."""
