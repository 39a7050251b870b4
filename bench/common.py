"""Pieces shared by the benchmark processes: the result record, percentiles, CPU pinning."""

from __future__ import annotations

import os
import socket
import subprocess
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Stats:
    """Throughput and latency of one measured point."""

    infer_per_s: float
    p50_ms: float
    p99_ms: float
    requests: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_dict(data: dict[str, Any]) -> Stats:
        return Stats(
            infer_per_s=float(data["infer_per_s"]),
            p50_ms=float(data["p50_ms"]),
            p99_ms=float(data["p99_ms"]),
            requests=int(data["requests"]),
        )


def summarize(latencies_s: list[float], window_s: float) -> Stats:
    """Stats from the latencies (seconds) of the requests that completed inside the window."""
    if not latencies_s or window_s <= 0:
        return Stats(0.0, float("nan"), float("nan"), 0)
    ms = np.asarray(latencies_s) * 1000.0
    return Stats(
        infer_per_s=len(latencies_s) / window_s,
        p50_ms=float(np.percentile(ms, 50)),
        p99_ms=float(np.percentile(ms, 99)),
        requests=len(latencies_s),
    )


def pin_to_core(core: int) -> None:
    """Pin this process (and the threads it starts from now on) to one CPU core."""
    os.sched_setaffinity(0, {core})


_GIVEN: set[int] = set()


def free_port() -> int:
    """A free loopback port, never one this process was given before: the kernel may hand the
    same ephemeral port out twice in a row (CI once got one port for HTTP and gRPC). The tests
    take theirs from here too (tests/serverproc.py)."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port not in _GIVEN:
            _GIVEN.add(port)
            return port


def last_json_line(stdout: str) -> str:
    """The last line of a child's stdout that looks like a JSON object."""
    for line in reversed(stdout.splitlines()):
        if line.startswith("{"):
            return line
    raise ValueError(f"no JSON result in output:\n{stdout[-2000:]}")


def process_tree(pid: int) -> list[int]:
    """pid and all its descendants (children of every thread: threads spawn processes too)."""
    found, frontier = [pid], [pid]
    while frontier:
        parent = frontier.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            try:
                children = (task / "children").read_text().split()
            except OSError:
                continue
            for child in map(int, children):
                found.append(child)
                frontier.append(child)
    return found


def rss_mib(pid: int) -> float:
    """Resident memory of one process (0 once it is gone)."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return 0.0
    for line in lines:
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def wait_ready(proc: subprocess.Popen[bytes], http_port: int, started: float) -> float:
    """Seconds from `started` (monotonic) until the server `proc` answers
    GET /v2/health/ready with 200 on `http_port` (at most 60 s; it must not exit first)."""
    url = f"http://127.0.0.1:{http_port}/v2/health/ready"
    while True:
        try:
            with urllib.request.urlopen(url, timeout=1) as resp:
                if resp.status == 200:
                    return time.monotonic() - started
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() - started > 60:
            raise RuntimeError(f"{proc.args!r} did not become ready")
        time.sleep(0.01)
