"""The built binary: size on disk, cold start to ready, idle memory.

    python -m bench.binary [--binary dist/edge-appliance/edge-appliance] [--trials 5]

Serves the example repository (configs.generate) on free ports. Cold start is the time from
exec to `GET /v2/health/ready` answering 200. Memory is VmRSS after IDLE_S idle: the server
process alone, and its whole process tree (the onefile bootloader parent and each Python
model's process included).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from bench.common import ROOT, free_port, process_tree, rss_mib, wait_ready

# Idle this long before memory is read: past the heap trimmer's first pass (appliance/ops/memory.py,
# about 5 s after start), which returns the start-up heap (at 2 s the server read up to 46 MiB
# higher: 187 against 141 MiB for the same binary).
IDLE_S = 6.0


def disk_mib(binary: Path) -> float:
    folder = binary.parent if (binary.parent / "_internal").is_dir() else None
    if folder is None:
        return binary.stat().st_size / 2**20
    files = [p for p in folder.rglob("*") if p.is_file() and not p.is_symlink()]
    return sum(p.stat().st_size for p in files) / 2**20


def one_start(binary: Path, repo: Path, tmp: Path) -> tuple[float, float, float]:
    http = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    started = time.monotonic()
    proc = subprocess.Popen(
        [
            str(binary),
            "--model-repository",
            str(repo),
            "--http-port",
            str(http),
            "--grpc-port",
            str(free_port()),
            "--metrics-port",
            str(free_port()),
            "--model-store-dir",
            str(tmp / "store"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
        cwd=tmp,
    )
    try:
        ready = wait_ready(proc, http, started)
        time.sleep(IDLE_S)
        pids = process_tree(proc.pid)
        server = max(pids, key=rss_mib)  # onefile: the child, not the bootloader
        return ready, rss_mib(server), sum(rss_mib(p) for p in pids)
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--binary", type=Path, default=ROOT / "dist/edge-appliance/edge-appliance")
    parser.add_argument("--trials", type=int, default=5)
    args = parser.parse_args()
    from configs.generate import write_repository

    with tempfile.TemporaryDirectory() as tmp:
        repo = write_repository(Path(tmp) / "models")
        runs = [one_start(args.binary, repo, Path(tmp)) for _ in range(args.trials)]
    ready = [r[0] for r in runs]
    print(
        f"| binary | on disk | cold start to ready (median of {args.trials}, min-max) "
        "| idle RSS server | idle RSS process tree |"
    )
    print("|---|---|---|---|---|")
    print(
        f"| {args.binary.relative_to(ROOT) if args.binary.is_relative_to(ROOT) else args.binary}"
        f" | {disk_mib(args.binary):.0f} MiB"
        f" | {statistics.median(ready):.2f} s ({min(ready):.2f}-{max(ready):.2f})"
        f" | {statistics.median(r[1] for r in runs):.0f} MiB"
        f" | {statistics.median(r[2] for r in runs):.0f} MiB |"
    )


if __name__ == "__main__":
    main()
