"""Idle memory per process and cold start, from source, serving the example repository.

    python -m bench.idle_memory [--trials 5] [--idle-s 6] [--repository configs/models]

Starts the README's serve command (`.venv/bin/edge-appliance serve --model-repository ...`) on
free ports, times process start to `GET /v2/health/ready` answering 200, waits `--idle-s`
(6 s: past the heap trimmer's first pass at 5 s, appliance/ops/memory.py; at 2-3 s the server still
holds 0-12 MiB of start-up heap, so samples taken then vary), then reads every process of its
tree from /proc: VmRSS (status) and Pss, Private (smaps_rollup). RSS counts pages shared
between the processes (the Python interpreter, numpy) once per process; PSS splits them, so
the PSS column adds up to what the tree costs the machine. The built binary has its own
script (bench.binary).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from bench.common import ROOT, free_port, process_tree, wait_ready


def _kib(path: Path, fields: tuple[str, ...]) -> dict[str, int]:
    found = dict.fromkeys(fields, 0)
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        key, _, rest = line.partition(":")
        if key in found:
            found[key] += int(rest.split()[0])
    return found


def sample(pid: int) -> tuple[str, float, float, float]:
    """(name, RSS MiB, PSS MiB, private MiB) of one process."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        name = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ("gone", 0.0, 0.0, 0.0)
    text = " ".join(a.decode(errors="replace") for a in argv if a)
    if "resource_tracker" in text:
        name = "resource tracker"
    elif "spawn_main" in text or "edge_backends.python" in text:
        name = "python model"
    elif "serve" in text:
        name = "server"
    status = _kib(Path(f"/proc/{pid}/status"), ("VmRSS",))
    rollup = _kib(Path(f"/proc/{pid}/smaps_rollup"), ("Pss", "Private_Clean", "Private_Dirty"))
    private = rollup["Private_Clean"] + rollup["Private_Dirty"]
    return (name, status["VmRSS"] / 1024, rollup["Pss"] / 1024, private / 1024)


def one_start(
    command: list[str], repo: Path, tmp: Path, idle_s: float
) -> tuple[float, list[tuple[str, float, float, float]]]:
    http = free_port()
    args = [
        *command,
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
    ]
    started = time.monotonic()
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    try:
        ready = wait_ready(proc, http, started)
        time.sleep(idle_s)
        return ready, [sample(pid) for pid in process_tree(proc.pid)]
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--idle-s", type=float, default=6.0)
    parser.add_argument("--repository", type=Path, default=None, help="default: generated")
    parser.add_argument(
        "--command",
        action="append",
        help="the server's command line before --model-repository (default: the venv's "
        "edge-appliance serve); give it twice or more for an A/B run, starts interleaved",
    )
    args = parser.parse_args()
    commands = [c.split() for c in args.command or [f"{ROOT / '.venv/bin/edge-appliance'} serve"]]
    runs: list[list[tuple[float, list[tuple[str, float, float, float]]]]] = [[] for _ in commands]
    with tempfile.TemporaryDirectory() as tmp:
        repo = args.repository
        if repo is None:
            from configs.generate import write_repository

            repo = write_repository(Path(tmp) / "models")
        for _ in range(args.trials):
            for command, done in zip(commands, runs, strict=True):
                done.append(one_start(command, repo, Path(tmp), args.idle_s))
    for command, done in zip(commands, runs, strict=True):
        report(" ".join(command), done)


def report(command: str, runs: list[tuple[float, list[tuple[str, float, float, float]]]]) -> None:
    ready = [r[0] for r in runs]
    print(f"\n{command}")
    print(
        f"cold start to ready: median {statistics.median(ready):.2f} s "
        f"({min(ready):.2f}-{max(ready):.2f}, {len(runs)} starts; os.cpu_count() "
        f"{os.cpu_count()}, load average {os.getloadavg()[0]:.1f})"
    )
    print("| start | process | RSS MiB | PSS MiB | private MiB |")
    print("|---|---|---:|---:|---:|")
    for trial, (_, rows) in enumerate(runs, 1):
        for name, rss, pss, private in rows:
            print(f"| {trial} | {name} | {rss:.1f} | {pss:.1f} | {private:.1f} |")
        print(
            f"| {trial} | **tree ({len(rows)} processes)** | **{sum(r[1] for r in rows):.1f}** "
            f"| **{sum(r[2] for r in rows):.1f}** | {sum(r[3] for r in rows):.1f} |"
        )


if __name__ == "__main__":
    main()
