"""Triton's perf_analyzer as the load generator for http-binary and grpc.

perf_analyzer's stabilization is waived on purpose (stability 1000%, 3 trials): each point is
exactly three measurement windows of seconds/3, merged, after 2 x concurrency warm-up requests,
so a point always takes the same time and never aborts as "unstable" on a noisy machine.
"""

from __future__ import annotations

import csv
import io
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from bench.common import Stats

# The project's shared/ folder sits beside the checkout.
DEFAULT_TOOL = Path(__file__).resolve().parents[2] / "shared" / "tools" / "perf_analyzer.sh"
PROTOCOL_FLAGS = {"http-binary": "http", "grpc": "grpc", "grpc-stream": "grpc"}
# Only perf_analyzer can drive these (ModelStreamInfer: one bidirectional stream per client).
PERF_ONLY = ("grpc-stream",)
WINDOWS = 3
SETUP_TIMEOUT_S = 600.0
REQUEST_COUNT = re.compile(r"^\s*Request count: (\d+)", re.MULTILINE)


@dataclass(frozen=True)
class PerfAnalyzer:
    tool: Path
    version: str


def find_perf_analyzer(tool: Path) -> tuple[PerfAnalyzer | None, str]:
    """Set perf_analyzer up (its wrapper does that on first call); None and why, if it can't."""
    if not tool.exists():
        return None, f"{tool} does not exist"
    try:
        proc = subprocess.run(
            [str(tool), "--version"],
            capture_output=True,
            text=True,
            timeout=SETUP_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"{tool} --version: {exc}"
    if proc.returncode != 0:
        return None, f"{tool} --version exited {proc.returncode}: {proc.stderr.strip()[-500:]}"
    lines = (proc.stdout + proc.stderr).strip().splitlines()  # this build prints to stderr
    version = next((line for line in lines if "Version" in line), "version unknown")
    return PerfAnalyzer(tool, version.strip()), ""


def base_command(
    pa: PerfAnalyzer,
    model: str,
    url: str,
    interface: str,
    load: list[str],
    window_ms: int,
    csv_path: Path,
) -> list[str]:
    """perf_analyzer with this benchmark's fixed windows; `load` says how requests arrive."""
    return [
        str(pa.tool),
        "-m",
        model,
        "-u",
        url,
        "-i",
        interface,
        *load,
        "--measurement-interval",
        str(window_ms),
        "--stability-percentage",
        "1000",
        "--max-trials",
        str(WINDOWS),
        "-f",
        str(csv_path),
    ]


def command(
    pa: PerfAnalyzer,
    model: str,
    url: str,
    protocol: str,
    concurrency: int,
    seconds: float,
    csv_path: Path,
) -> list[str]:
    load = [
        "--concurrency-range",
        f"{concurrency}:{concurrency}",
        "--warmup-request-count",
        str(2 * concurrency),
        *(["--streaming"] if protocol == "grpc-stream" else []),
    ]
    window_ms = max(200, round(seconds * 1000 / WINDOWS))
    return base_command(pa, model, url, PROTOCOL_FLAGS[protocol], load, window_ms, csv_path)


def parse_result(csv_text: str, stdout: str) -> Stats:
    """perf_analyzer's -f file (latencies in microseconds) and its client request count."""
    rows = list(csv.DictReader(io.StringIO(csv_text)))
    if not rows:
        raise ValueError("perf_analyzer wrote no result rows")
    row = rows[-1]
    counts = REQUEST_COUNT.findall(stdout)
    return Stats(
        infer_per_s=float(row["Inferences/Second"]),
        p50_ms=float(row["p50 latency"]) / 1000.0,
        p99_ms=float(row["p99 latency"]) / 1000.0,
        requests=int(counts[0]) if counts else 0,
    )
