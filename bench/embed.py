"""The embedding API's round trip against the same model over Unix-socket HTTP and gRPC
(issue 38).

    python -m bench.embed [--requests 20000] [--rounds 5] [--core 0] [--points ...]

One process, pinned to `--core`, starts the embedded server (`appliance.tritonserver`) on the
example `simple` model, with this server's HTTP and gRPC front ends on Unix sockets
(`appliance.tritonfrontend`), and calls it one request at a time, `--requests` per round:

- `embed`: `server.model("simple").infer(inputs={...})` with numpy inputs, the response's
  OUTPUT0 read with `numpy.from_dlpack`: the public API, as an application calls it.
- `http-unix`: tritonclient's binary-tensor request bytes written to the HTTP front end's Unix
  socket over one keep-alive connection, the answer read whole (a minimal client: no
  tritonclient on the measured path, whose own Python costs more than the server's).
- `grpc-unix`: a serialized `ModelInferRequest` through a grpc channel to `unix:PATH`
  (raw bytes in and out: no protobuf work in the client).

Per point: the median round's p50 and p99 round-trip latency, and CPU per call: the whole
process's CPU time (the caller's thread, the server's loop and grpc's threads alike) over the
round's calls. Client and server share the one core, as an application embedding the server
would.

Measured (issue 38, 2026-12-06 22:15 UTC, AMD EPYC, this 2-core VM shared with other
sessions, load about 4; `--requests 5000 --rounds 5 --core 0 --points embed`, five runs of
each alternating, medians): before the plain lane (main at 96d6540) embed p50 21.9 us, p99
39.6 us, 22.9 us CPU a call; with it p50 13.6 us, p99 20.5 us, 14.5 us CPU, within the issue's
15 us. HTTP over the Unix socket is unchanged (p50 67-69 us both). A request like one already
validated for its version (same input names in the same order, numpy dtypes and shapes, no
parameters: services/plain.py) skips the request objects and validation; anything else takes
the general path. Where the 13.6 us go, each piece timed alone in the same process (warm, the
least of 7 x 5000): ONNX Runtime's run of `simple` through the instance 3.4 us; the instance's
`run` around it 1.3 (timestamps, its `BatchResult`, the sampled CPU clock); the job 0.8; the
scheduler's thread lane around the run 2.5 (two rounds of its lock, the instance's
bookkeeping, the execution statistics 0.5, the cost learning of one run in 8); the inference
service's plain lane around that 1.9 (the signature check 0.4, the response 0.7, the success
statistics 0.2); `Model.infer` around the service 3.0 (the request and response objects: the
`InferenceResponse` and its tensors 0.9, the version lookup 0.2, the iterator); reading the
answer 0.6 (`numpy.from_dlpack` 0.4). Earlier (20:02 UTC, load 4-5, before this change and
others since): embed p50 77.7 us, HTTP 256 us, gRPC over the Unix socket 947 us (grpc's
threads hand each call over on the one core).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

POINTS = ("embed", "http-unix", "grpc-unix")
WARM_UP = 2000


def _rounds(call: Callable[[], Any], requests: int, rounds: int) -> dict[str, float]:
    """Each round's p50 / p99 latency (us) and process CPU per call (us); the median round."""
    for _ in range(WARM_UP):
        call()
    p50s, p99s, cpus = [], [], []
    clock = time.perf_counter_ns
    for _ in range(rounds):
        latencies = np.empty(requests, dtype=np.int64)
        cpu = time.process_time_ns()
        for i in range(requests):
            start = clock()
            call()
            latencies[i] = clock() - start
        cpus.append((time.process_time_ns() - cpu) / requests / 1e3)
        p50s.append(float(np.percentile(latencies, 50)) / 1e3)
        p99s.append(float(np.percentile(latencies, 99)) / 1e3)
    return {
        "p50_us": statistics.median(p50s),
        "p99_us": statistics.median(p99s),
        "cpu_us": statistics.median(cpus),
    }


def _http_call(path: str) -> Callable[[], Any]:
    from bench.inprocess import http_request

    request = http_request(binary=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)

    def call() -> bytes:
        sock.sendall(request)
        data = b""
        while b"\r\n\r\n" not in data:
            data += sock.recv(65536)
        head, _, body = data.partition(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length:", 1)[1].split(b"\r\n", 1)[0])
        while len(body) < length:
            body += sock.recv(65536)
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(head.decode(errors="replace"))
        return body

    return call


def _grpc_call(path: str) -> Callable[[], Any]:
    import grpc

    from appliance.common.protocol import service_pb2 as pb
    from bench.inprocess import INPUT0, INPUT1, MODEL

    message = pb.ModelInferRequest(model_name=MODEL)
    for name, data in (("INPUT0", INPUT0), ("INPUT1", INPUT1)):
        tensor = message.inputs.add(name=name, datatype="INT32")
        tensor.shape.extend([1, 16])
        message.raw_input_contents.append(np.asarray(data, np.int32).tobytes())
    raw = message.SerializeToString()
    channel = grpc.insecure_channel(f"unix:{path}")
    infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
    answer = pb.ModelInferResponse.FromString(infer(raw))
    out = np.frombuffer(answer.raw_output_contents[0], np.int32)
    if out.tolist() != [a + b for a, b in zip(INPUT0, INPUT1, strict=True)]:
        raise RuntimeError(f"gRPC OUTPUT0 wrong: {out}")
    return lambda: infer(raw)


def run(points: Sequence[str], requests: int, rounds: int, core: int) -> dict[str, Any]:
    os.sched_setaffinity(0, {core})
    from appliance import tritonfrontend, tritonserver
    from bench.inprocess import INPUT0, INPUT1, MODEL
    from bench.mlserver import write_simple

    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="edge-embed-") as work:
        repository = write_simple(Path(work) / "models")
        server = tritonserver.Server(
            model_repository=str(repository),
            server_args=["--model-store-dir", str(Path(work) / "store")],
        ).start(wait_until_ready=True)
        http_path, grpc_path = str(Path(work) / "http.sock"), str(Path(work) / "grpc.sock")
        http = tritonfrontend.KServeHttp(
            server, tritonfrontend.KServeHttp.Options(port=-1, unix_socket=http_path)
        )
        grpc_front = tritonfrontend.KServeGrpc(
            server, tritonfrontend.KServeGrpc.Options(port=-1, unix_socket=grpc_path)
        )
        http.start()
        grpc_front.start()
        try:
            model = server.model(MODEL)
            inputs = {
                "INPUT0": np.asarray(INPUT0, np.int32).reshape(1, 16),
                "INPUT1": np.asarray(INPUT1, np.int32).reshape(1, 16),
            }

            def embed() -> Any:
                for response in model.infer(inputs=inputs):
                    return np.from_dlpack(response.outputs["OUTPUT0"])
                raise RuntimeError("no response")

            calls = {
                "embed": lambda: embed,
                "http-unix": lambda: _http_call(http_path),
                "grpc-unix": lambda: _grpc_call(grpc_path),
            }
            for point in points:
                results[point] = _rounds(calls[point](), requests, rounds)
                print(point, json.dumps(results[point]), flush=True)
        finally:
            http.stop()
            grpc_front.stop()
            server.stop()
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.embed")
    parser.add_argument("--points", default=",".join(POINTS))
    parser.add_argument("--requests", type=int, default=20000, help="per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--core", type=int, default=0)
    args = parser.parse_args(argv)
    points = [p for p in args.points.split(",") if p]
    unknown = set(points) - set(POINTS)
    if unknown:
        parser.error(f"unknown points {sorted(unknown)}; known: {', '.join(POINTS)}")
    results = run(points, args.requests, args.rounds, args.core)
    print("\n| point | p50 us | p99 us | CPU us / call |")
    print("|---|---:|---:|---:|")
    for point, r in results.items():
        print(f"| {point} | {r['p50_us']:.1f} | {r['p99_us']:.1f} | {r['cpu_us']:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
