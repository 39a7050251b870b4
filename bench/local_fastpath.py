"""Local fast path benchmark: one FP32 identity model, each way a local client can reach it.

    python -m bench.local_fastpath [--seconds 3] [--sizes 600KB,8MB]

Transports: HTTP JSON, HTTP binary, gRPC raw, system shared memory with HTTP or gRPC control
(inputs and outputs in shared memory), and HTTP binary / gRPC over Unix sockets. The client is
tritonclient (sync, concurrency 1) pinned to core 1; the server is pinned to core 0. Every
iteration starts from a numpy array in client memory, so the shared memory rows include the
client's copy of the frame into its region (a camera pipeline would write frames there
directly). The ceiling is raw onnxruntime running the same model in-process on one core.
Prints a markdown table.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import pin_to_core
from bench.server import start_server, stop_server, wait_ready

SIZES = {"600KB": 224 * 224 * 3, "8MB": 2 * 1024 * 1024}  # FP32 elements
CONFIG = """name: "identity"
backend: "onnxruntime"
max_batch_size: 0
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
"""


def build_repository(root: Path) -> Path:
    from onnx import TensorProto

    from configs.generate import identity_model, save

    save(identity_model(TensorProto.FLOAT, ["n"]), root / "identity" / "1" / "model.onnx")
    (root / "identity" / "config.pbtxt").write_text(CONFIG)
    return root


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(
    step: Callable[[], None], seconds: float, pid: int | None = None
) -> tuple[float, float, float, float]:
    """(requests/s, p50 ms, p99 ms, server CPU ms per request) of `step` run back to back."""
    step()  # warm up
    latencies = []
    cpu0 = cpu_seconds(pid) if pid else 0.0
    end = time.monotonic() + seconds
    while time.monotonic() < end or len(latencies) < 5:
        t0 = time.perf_counter()
        step()
        latencies.append(time.perf_counter() - t0)
    cpu = (cpu_seconds(pid) - cpu0) / len(latencies) * 1e3 if pid else float("nan")
    latencies.sort()
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
    return len(latencies) / sum(latencies), statistics.median(latencies) * 1e3, p99 * 1e3, cpu


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=60)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self._path)


def transports(
    server: dict[str, str], data: np.ndarray
) -> tuple[Callable[[], None], dict[str, Callable[[], None]]]:
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    import tritonclient.utils.shared_memory as shm

    n = data.size
    http_client = httpclient.InferenceServerClient(server["http"], network_timeout=120)
    grpc_client = grpcclient.InferenceServerClient(server["grpc"])
    uds_grpc = grpcclient.InferenceServerClient(f"unix://{server['grpc_sock']}")

    def check(out: Any) -> None:
        assert out is not None
        assert out.shape == (n,), out.shape

    def http_step(binary: bool) -> Callable[[], None]:
        def step() -> None:
            inp = httpclient.InferInput("INPUT0", [n], "FP32")
            inp.set_data_from_numpy(data, binary_data=binary)
            out = httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)
            check(http_client.infer("identity", [inp], outputs=[out]).as_numpy("OUTPUT0"))

        return step

    def grpc_step(client: Any) -> Callable[[], None]:
        def step() -> None:
            inp = grpcclient.InferInput("INPUT0", [n], "FP32")
            inp.set_data_from_numpy(data)
            check(client.infer("identity", [inp]).as_numpy("OUTPUT0"))

        return step

    tag = uuid.uuid4().hex[:8]
    nbytes = data.nbytes
    in_region = shm.create_shared_memory_region("in", f"/bench_in_{tag}", nbytes)
    out_region = shm.create_shared_memory_region("out", f"/bench_out_{tag}", nbytes)
    http_client.register_system_shared_memory("in", f"/bench_in_{tag}", nbytes)
    http_client.register_system_shared_memory("out", f"/bench_out_{tag}", nbytes)

    def shm_step(module: Any, client: Any) -> Callable[[], None]:
        def step() -> None:
            shm.set_shared_memory_region(in_region, [data])
            inp = module.InferInput("INPUT0", [n], "FP32")
            inp.set_shared_memory("in", nbytes)
            out = module.InferRequestedOutput("OUTPUT0")
            out.set_shared_memory("out", nbytes)
            client.infer("identity", [inp], outputs=[out])
            check(shm.get_contents_as_numpy(out_region, np.float32, [n]))

        return step

    def uds_http_step() -> None:
        header = json.dumps(
            {
                "inputs": [
                    {
                        "name": "INPUT0",
                        "datatype": "FP32",
                        "shape": [n],
                        "parameters": {"binary_data_size": nbytes},
                    }
                ],
                "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
            }
        ).encode()
        body = header + data.tobytes()
        conn = UnixHTTPConnection(server["http_sock"])
        headers = {"Inference-Header-Content-Length": str(len(header))}
        conn.request("POST", "/v2/models/identity/infer", body=body, headers=headers)
        resp = conn.getresponse()
        payload = resp.read()
        header_len = int(resp.getheader("Inference-Header-Content-Length"))
        conn.close()
        assert resp.status == 200, payload[:200]
        check(np.frombuffer(payload, np.float32, offset=header_len))

    def release() -> None:
        http_client.unregister_system_shared_memory()
        shm.destroy_shared_memory_region(in_region)
        shm.destroy_shared_memory_region(out_region)

    return release, {
        "HTTP JSON": http_step(False),
        "HTTP binary": http_step(True),
        "gRPC raw": grpc_step(grpc_client),
        "shared memory, HTTP control": shm_step(httpclient, http_client),
        "shared memory, gRPC control": shm_step(grpcclient, grpc_client),
        "HTTP binary, Unix socket": uds_http_step,
        "gRPC raw, Unix socket": grpc_step(uds_grpc),
    }


def raw_ceiling(repo: Path, data: np.ndarray, seconds: float) -> tuple[float, float, float, float]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(
        str(repo / "identity" / "1" / "model.onnx"), options, providers=["CPUExecutionProvider"]
    )
    rate, p50, p99, _ = measure(lambda: session.run(None, {"INPUT0": data}), seconds)
    return rate, p50, p99, 1e3 / rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--sizes", default="600KB,8MB")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        repo = build_repository(Path(tmp) / "models")
        socks = {"http_sock": f"{tmp}/http.sock", "grpc_sock": f"{tmp}/grpc.sock"}
        big = str(256 * 2**20)
        proc = start_server(
            repo,
            0,
            Path(tmp) / "server.log",
            [
                "--http-unix-socket", socks["http_sock"],
                "--grpc-unix-socket", socks["grpc_sock"],
                "--max-request-bytes", big,
                "--grpc-max-message-bytes", big,
                "--allow-client-shm", "true",  # the shm point registers regions
            ],
        )  # fmt: skip
        try:
            wait_ready(proc)  # gRPC, and its socket, start before HTTP answers
            server = {"http": proc.http_url, "grpc": proc.grpc_url, **socks}
            pin_to_core(1)
            for size in args.sizes.split(","):
                data = np.random.default_rng(0).random(SIZES[size], dtype=np.float32)
                ceiling = raw_ceiling(repo, data, args.seconds)
                rows.append((size, "raw onnxruntime in-process (ceiling)", *ceiling))
                release, steps = transports(server, data)
                try:
                    for name, step in steps.items():
                        rows.append((size, name, *measure(step, args.seconds, proc.proc.pid)))
                finally:
                    release()
        finally:
            stop_server(proc)
    print("| tensor | transport | infer/s | MB/s in | p50 ms | p99 ms | server CPU ms/req |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for size, name, rate, p50, p99, cpu in rows:
        mbs = rate * SIZES[size] * 4 / 1e6
        print(f"| {size} | {name} | {rate:,.1f} | {mbs:,.0f} | {p50:.2f} | {p99:.2f} | {cpu:.2f} |")


if __name__ == "__main__":
    main()
