"""Start and stop the ceiling servers (bench.ceiling_http, bench.ceiling_grpc) as subprocesses
pinned like the server under test, and say which ceiling stands for which protocol.

    aiohttp    bench.ceiling_http               for http-json and http-binary
    grpc-aio   bench.ceiling_grpc --mode aio    for grpc and grpc-stream
    grpc-sync  bench.ceiling_grpc --mode sync   for grpc and grpc-stream (the best gRPC one counts)

and, as references only (ORT_CEILINGS), the same servers with `--simple-compute ort`: they run
`simple`'s model.onnx through ONNX Runtime as the server does, instead of numpy's add/sub, and
show how much of the server's cost on `simple` is ONNX Runtime's own. They are measured and shown
beside the others but never stand for a protocol (for_protocol leaves them out), so the server's
`x ceiling` and issue 20's targets are always against the numpy ceilings:

    aiohttp-ort, grpc-aio-ort, grpc-sync-ort
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

import grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc

from bench.common import ROOT, free_port
from bench.server import READY_TIMEOUT_S, Server

CEILINGS = ("aiohttp", "grpc-aio", "grpc-sync")  # the ones the ratios and targets use
ORT_SUFFIX = "-ort"
ORT_CEILINGS = tuple(kind + ORT_SUFFIX for kind in CEILINGS)  # references only
KINDS = (*CEILINGS, *ORT_CEILINGS)
ORT_MODELS = ("simple",)  # the models an ORT reference computes differently (the rest: ORT anyway)
_BASE_ARGS = {
    "aiohttp": ["bench.ceiling_http"],
    "grpc-aio": ["bench.ceiling_grpc", "--mode", "aio"],
    "grpc-sync": ["bench.ceiling_grpc", "--mode", "sync"],
}
MODULE_ARGS = {
    **_BASE_ARGS,
    **{k + ORT_SUFFIX: [*args, "--simple-compute", "ort"] for k, args in _BASE_ARGS.items()},
}
_BASE_PROTOCOLS = {
    "aiohttp": ("http-json", "http-binary"),
    "grpc-aio": ("grpc", "grpc-stream"),
    "grpc-sync": ("grpc", "grpc-stream"),
}
PROTOCOLS_OF = {
    **_BASE_PROTOCOLS,
    **{k + ORT_SUFFIX: protocols for k, protocols in _BASE_PROTOCOLS.items()},
}


def is_ort(kind: str) -> bool:
    """A reference ceiling that computes `simple` with ONNX Runtime (never a ratio's ceiling)."""
    return kind in ORT_CEILINGS


def for_protocol(protocol: str, measured: Sequence[str]) -> list[str]:
    """The measured ceilings that speak this protocol and count for its ratio: never an ORT
    reference."""
    return [k for k in measured if not is_ort(k) and protocol in PROTOCOLS_OF[k]]


def ort_for_protocol(protocol: str, measured: Sequence[str]) -> list[str]:
    """The measured ORT references that speak this protocol (shown, never a ratio's ceiling)."""
    return [k for k in measured if is_ort(k) and protocol in PROTOCOLS_OF[k]]


def ceiling_command(
    kind: str, repository: Path, models: Sequence[str], port: int, core: int | None
) -> list[str]:
    pin = ["taskset", "-c", str(core)] if core is not None else []
    return [
        *pin,
        sys.executable,
        "-m",
        *MODULE_ARGS[kind],
        "--model-repository",
        str(repository),
        "--models",
        ",".join(models),
        "--port",
        str(port),
    ]


def start_ceiling(
    kind: str, repository: Path, models: Sequence[str], core: int | None, log_path: Path
) -> Server:
    """The ceiling as a Server whose http_url and grpc_url are its one address."""
    port = free_port()
    log_file = log_path.open("wb")
    proc = subprocess.Popen(
        ceiling_command(kind, repository, models, port, core),
        cwd=ROOT,
        stdout=log_file,
        stderr=subprocess.STDOUT,
    )
    url = f"127.0.0.1:{port}"
    return Server(proc, url, url, log_path, log_file)


def _listening(url: str) -> bool:
    host, port = url.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=1):
            return True
    except OSError:
        return False


def wait_listening(server: Server, timeout_s: float = READY_TIMEOUT_S) -> float:
    """Seconds until the ceiling accepts connections (it listens once its models are loaded)."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if not server.alive():
            code = server.proc.returncode
            raise RuntimeError(f"ceiling exited with {code}:\n{server.log_tail()}")
        if _listening(server.http_url):
            return time.monotonic() - started
        time.sleep(0.1)
    raise TimeoutError(f"ceiling not listening within {timeout_s:.0f}s:\n{server.log_tail()}")


def inference_count(kind: str, server: Server, model: str) -> int | None:
    """The model's inference_count from the server's (or a ceiling's) statistics: over gRPC for
    the gRPC ceilings, over HTTP for the others; None when it cannot be read."""
    try:
        if kind.startswith("grpc-"):
            return _grpc_count(server.grpc_url, model)
        url = f"http://{server.http_url}/v2/models/{model}/stats"
        with urllib.request.urlopen(url, timeout=10) as resp:
            rows = json.loads(resp.read())["model_stats"]
        return sum(int(row.get("inference_count", 0)) for row in rows)
    except (OSError, ValueError, KeyError, grpc.RpcError):
        return None


def _grpc_count(url: str, model: str) -> int:
    with grpc.insecure_channel(url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        reply = stub.ModelStatistics(service_pb2.ModelStatisticsRequest(name=model), timeout=10)
    return sum(int(row.inference_count) for row in reply.model_stats)
