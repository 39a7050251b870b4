"""The face: the `edge-appliance` command (cli.py), its signal handlers; may import every layer.

gRPC core's settings that only its environment carries are set here, before any module of the
command imports grpc (core reads them once, at that import; set later they do nothing):
`GRPC_EXPERIMENTS` turns off core's EventEngine listener, so that the connections it accepts
are served by the thread polling the completion queue instead of handing each read and write
to EventEngine's own threads. For the synchronous gRPC server that is two thread wake-ups less
per unary call: grpcio's server doing nothing but the protocol for add_sub's tensors measured
143 -> 105 us of CPU per ModelInfer at c=8 and 198 -> 174 at c=1 (docs/benchmarks.md,
2026-12-07). A GRPC_EXPERIMENTS the environment already has is kept as it is.
"""

import os

GRPC_EXPERIMENTS = "-event_engine_listener"

os.environ.setdefault("GRPC_EXPERIMENTS", GRPC_EXPERIMENTS)
