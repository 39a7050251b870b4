"""Server CPU per request, A/B between source trees and the ceilings, interleaved (issue 20).

    python -m bench.cpu_per_request --trees /tmp/old,. [--ceilings http,aio,sync[,sync-ort]]
        [--points simple:http,simple:grpc,simple:grpc-stream,squeezenet_onnx:grpc] [--rounds 4]
        [--seconds 3]

A point is MODEL:PROTOCOL, the protocol http, grpc or grpc-stream (perf_analyzer --streaming:
ModelStreamInfer, one stream per concurrent request).

Each tree (a checkout, e.g. `git worktree add /tmp/old <commit>`) serves the example models
(`configs.generate`, only the points' models) pinned to core 0; Triton's perf_analyzer drives it
from core 1 at concurrency 8. A point's figure is the server process's CPU time (utime + stime
of all its threads, from /proc) over the run, divided by the requests perf_analyzer counted: the
microseconds of CPU the server spends per request, which another process on the machine
disturbs far less than it disturbs throughput. Rounds alternate the order of the trees; the
table gives each point's median over the rounds, and the ceilings (bench.ceiling_http,
bench.ceiling_grpc) measured in the same rounds.

The ceilings: http (aiohttp), aio (grpc.aio), sync (synchronous grpc), each computing `simple`
with numpy; and http-ort, aio-ort, sync-ort, the same servers with `--simple-compute ort`, running
`simple`'s model.onnx through ONNX Runtime as the server does (measured on `simple` points only:
the other models run through ONNX Runtime in every ceiling). The -ort ones say how much of the
server's cost on `simple` is ONNX Runtime's own; issue 20's ratios are against the numpy ones.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

from bench.ceilings import MODULE_ARGS
from bench.ceilings import ORT_SUFFIX as ORT
from bench.common import ROOT, free_port
from bench.perf import DEFAULT_TOOL

HZ = os.sysconf("SC_CLK_TCK")
# This tool's short names for bench.ceilings' kinds; each also with ORT (`simple` computed
# with ONNX Runtime).
_KINDS = {"http": "aiohttp", "aio": "grpc-aio", "sync": "grpc-sync"}
CEILING_ARGS = {
    short + suffix: ["-m", *MODULE_ARGS[kind + suffix]]
    for suffix in ("", ORT)
    for short, kind in _KINDS.items()
}
READY_S = 120.0


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / HZ


def _wait(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{what} did not start within {READY_S:.0f} s")


class Target:
    """A server under test: a tree's `appliance serve`, or a ceiling."""

    def __init__(self, name: str, command: list[str], cwd: Path, http: str, grpc: str) -> None:
        self.name, self.http, self.grpc = name, http, grpc
        self.proc = subprocess.Popen(
            command, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def start_tree(tree: Path, repository: Path, extra: Sequence[str] = ()) -> Target:
    """A tree's `appliance serve` on the repository (more `serve` arguments: `extra`), ready."""
    http, grpc = free_port(), free_port()
    command = [
        "taskset", "-c", "0", sys.executable, "-m", "appliance", "serve",
        "--model-repository", str(repository), "--http-port", str(http),
        "--grpc-port", str(grpc), "--allow-metrics", "false", *extra,
    ]  # fmt: skip
    target = Target(str(tree), command, tree, f"127.0.0.1:{http}", f"127.0.0.1:{grpc}")

    def ready() -> bool:
        url = f"http://{target.http}/v2/health/ready"
        with urllib.request.urlopen(url, timeout=1) as response:
            return bool(response.status == 200)

    _wait(ready, str(tree))
    return target


def start_ceiling(kind: str, repository: Path, models: str) -> Target:
    port = free_port()
    command = [
        "taskset", "-c", "0", sys.executable, *CEILING_ARGS[kind],
        "--model-repository", str(repository), "--models", models, "--port", str(port),
    ]  # fmt: skip
    url = f"127.0.0.1:{port}"
    target = Target(f"ceiling-{kind}", command, ROOT, url, url)

    def listening() -> bool:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True

    _wait(listening, kind)
    time.sleep(0.5)  # listening is not yet serving: let it finish loading
    return target


def perf_analyzer(tool: Path, model: str, url: str, protocol: str, seconds: float) -> int:
    """Requests perf_analyzer counted (0 if it failed), at concurrency 8 from core 1."""
    streaming = ["--streaming"] if protocol == "grpc-stream" else []
    command = [
        "taskset", "-c", "1", str(tool), "-m", model, "-u", url,
        "-i", protocol.removesuffix("-stream"), *streaming,
        "--concurrency-range", "8:8", "--measurement-interval", str(round(seconds * 1000 / 3)),
        "--stability-percentage", "1000", "--max-trials", "3", "--warmup-request-count", "16",
    ]  # fmt: skip
    out = subprocess.run(command, capture_output=True, text=True, check=False).stdout
    count = re.search(r"Request count: (\d+)", out)
    return int(count.group(1)) if count else 0


def point_us(tool: Path, target: Target, model: str, protocol: str, seconds: float) -> float:
    url = target.http if protocol == "http" else target.grpc
    perf_analyzer(tool, model, url, protocol, 1.0)  # warm-up (ORT, the inline-cost estimate)
    before = cpu_s(target.proc.pid)
    count = perf_analyzer(tool, model, url, protocol, seconds)
    return (cpu_s(target.proc.pid) - before) / count * 1e6 if count else float("nan")


Points = list[tuple[str, str]]  # (model, protocol)
Results = dict[tuple[str, str, str], list[float]]  # (server, model, protocol) -> us by round


def run_rounds(
    names: Sequence[str],
    rounds: int,
    start: Callable[[str], tuple[Target, Points] | None],
    tool: Path,
    seconds: float,
) -> Results:
    """Each round starts every server `start` names (None: none for that name) and measures
    its points; the order reverses every other round."""
    results: Results = {}
    for round_index in range(rounds):
        for name in names if round_index % 2 == 0 else names[::-1]:
            started = start(name)
            if started is None:
                continue
            target, wanted = started
            try:
                for model, protocol in wanted:
                    us = point_us(tool, target, model, protocol, seconds)
                    results.setdefault((name, model, protocol), []).append(us)
                    print(f"round {round_index} {name} {model} {protocol}: {us:.1f} us",
                          flush=True)  # fmt: skip
            finally:
                target.stop()
    return results


def print_table(names: Sequence[str], points: Points, results: Results, by_round: bool) -> None:
    """Medians per point and server (with each round's figure when `by_round`)."""
    print("\n| point | " + " | ".join(names) + " |")
    print("|---|" + "---:|" * len(names))
    for model, protocol in points:
        cells = []
        for name in names:
            values = results.get((name, model, protocol))
            if not values:
                cells.append("")
                continue
            rounds = " (" + "/".join(f"{v:.0f}" for v in values) + ")" if by_round else ""
            cells.append(f"{statistics.median(values):.0f}{rounds}")
        print(f"| {model} {protocol} | " + " | ".join(cells) + " |")


def ceiling_points(kind: str, points: Points) -> Points:
    """The points a ceiling kind is measured on: its protocol's; an -ort one only `simple`'s."""
    http = kind.removesuffix(ORT) == "http"
    wanted = [(m, p) for m, p in points if (p == "http") == http]
    return [(m, p) for m, p in wanted if m == "simple"] if kind.endswith(ORT) else wanted


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cpu_per_request")
    parser.add_argument("--trees", required=True, help="comma-separated checkouts")
    parser.add_argument(
        "--ceilings",
        default="http,aio,sync",
        help="of http, aio, sync (numpy computes `simple`) and http-ort, aio-ort, sync-ort "
        "(ONNX Runtime computes it, as in the server); '' none",
    )
    parser.add_argument("--points", default="simple:http,simple:grpc")
    parser.add_argument(
        "--rounds", type=int, default=4, help="even: each server first as often as last"
    )
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--perf-analyzer", type=Path, default=DEFAULT_TOOL)
    args = parser.parse_args(argv)
    trees = [Path(t).resolve() for t in args.trees.split(",") if t]
    ceilings = [c for c in args.ceilings.split(",") if c]
    unknown = [c for c in ceilings if c not in CEILING_ARGS]
    if unknown:
        parser.error(f"unknown ceiling(s) {unknown}; choose from {', '.join(CEILING_ARGS)}")
    points = [tuple(p.split(":")) for p in args.points.split(",") if p]
    models = sorted({model for model, _ in points})

    from configs.generate import main as generate  # the example repository, as bench.run

    with tempfile.TemporaryDirectory(prefix="edge-cpu-") as work:
        everything = Path(work) / "all"
        generate([str(everything)])
        repository = Path(work) / "models"
        repository.mkdir()
        for model in models:
            shutil.copytree(everything / model, repository / model)  # no links: path safety
        names = [str(t) for t in trees] + [f"ceiling-{c}" for c in ceilings]

        def start(name: str) -> tuple[Target, Points] | None:
            if not name.startswith("ceiling-"):
                return start_tree(Path(name), repository), list(points)
            kind = name.removeprefix("ceiling-")
            wanted = ceiling_points(kind, points)
            if not wanted:
                return None
            return start_ceiling(kind, repository, ",".join(models)), wanted

        results = run_rounds(names, args.rounds, start, args.perf_analyzer, args.seconds)
        print_table(names, points, results, by_round=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
