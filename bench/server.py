"""The server under test: `python -m appliance serve`, pinned with taskset, on free ports."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from bench.common import ROOT, free_port

READY_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 30.0


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    http_url: str
    grpc_url: str
    log_path: Path
    log_file: IO[bytes]

    def log_tail(self, lines: int = 40) -> str:
        self.log_file.flush()
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def alive(self) -> bool:
        return self.proc.poll() is None


def server_command(
    repository: Path,
    core: int | None,
    http_port: int,
    grpc_port: int,
    extra: Sequence[str] = (),
) -> list[str]:
    """The serve command line; `core` pins it with taskset (None: not pinned)."""
    pin = ["taskset", "-c", str(core)] if core is not None else []
    return [
        *pin,
        sys.executable,
        "-m",
        "appliance",
        "serve",
        "--model-repository",
        str(repository),
        "--http-port",
        str(http_port),
        "--grpc-port",
        str(grpc_port),
        "--metrics-port",
        str(free_port()),
        *extra,
    ]


def start_server(
    repository: Path, core: int | None, log_path: Path, extra: Sequence[str] = ()
) -> Server:
    http_port, grpc_port = free_port(), free_port()
    log_file = log_path.open("wb")
    proc = subprocess.Popen(
        server_command(repository, core, http_port, grpc_port, extra),
        cwd=ROOT,
        stdout=log_file,
        stderr=subprocess.STDOUT,
    )
    return Server(proc, f"127.0.0.1:{http_port}", f"127.0.0.1:{grpc_port}", log_path, log_file)


def _ready(http_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{http_url}/v2/health/ready", timeout=1) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


def wait_ready(server: Server, timeout_s: float = READY_TIMEOUT_S) -> float:
    """Seconds until GET /v2/health/ready answered 200; raises with the log tail otherwise."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if not server.alive():
            raise RuntimeError(f"server exited with {server.proc.returncode}:\n{server.log_tail()}")
        if _ready(server.http_url):
            return time.monotonic() - started
        time.sleep(0.1)
    raise TimeoutError(f"server not ready within {timeout_s:.0f}s:\n{server.log_tail()}")


def stop_server(server: Server) -> int:
    if server.alive():
        server.proc.terminate()
        try:
            server.proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            server.proc.kill()
            server.proc.wait()
    server.log_file.close()
    return int(server.proc.returncode)
