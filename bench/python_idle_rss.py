"""Idle memory of a Python model's process: edge-appliance's against tritonserver's stub.

    python -m bench.python_idle_rss [--trees .] [--idle-s 8] [--rounds 2]

Serves bench.python_vs_triton's repository (three Python models: add_sub, bls, repeat, one
instance each) from each tree's `appliance serve` and from tritonserver 2.51
(../shared/tools/tritonserver.sh; skipped with the reason where it cannot run), answers one
request per model (so each model's process has run its `execute` once), waits `--idle-s`, then
reads every process of the server's tree from /proc: VmRSS, and Pss and private memory from
smaps_rollup (bench.idle_memory's `sample`). A model process is one running a model: Triton's
`triton_python_backend_stub`, here a spawned model process. RSS counts the pages shared
between processes once per process, PSS splits them: the tree's PSS is what it costs the
machine. Rounds alternate which server goes first; medians over rounds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from bench.common import process_tree
from bench.cpu_per_request import Target, start_tree
from bench.idle_memory import sample
from bench.perf import DEFAULT_TOOL
from bench.python_vs_triton import TRITON, build, start_triton

# One request per model: INPUT0/INPUT1 FP32 [4] (add_sub, bls); repeat gets its own IN.
_FOUR = {"name": "", "shape": [4], "datatype": "FP32", "data": [1.0, 2.0, 3.0, 4.0]}


def _touch(http: str) -> None:
    """One request to each unary model (the decoupled repeat is not called over HTTP)."""
    body = {"inputs": [dict(_FOUR, name="INPUT0"), dict(_FOUR, name="INPUT1")]}
    for model in ("add_sub", "bls"):
        request = urllib.request.Request(
            f"http://{http}/v2/models/{model}/infer",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            response.read()


def _is_model_process(pid: int) -> bool:
    try:
        text = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return False
    return b"triton_python_backend_stub" in text or b"spawn_main" in text


def measure(target: Target, idle_s: float) -> dict[str, float]:
    """Per model process (mean) and for the whole tree: RSS, PSS, private MiB."""
    _touch(target.http)
    time.sleep(idle_s)
    pids = process_tree(target.proc.pid)
    models = [sample(p) for p in pids if _is_model_process(p)]
    everything = [sample(p) for p in pids]
    if not models:
        raise RuntimeError(f"{target.name}: no model process in its tree {pids}")
    return {
        "model_processes": len(models),
        "model_rss": statistics.mean(m[1] for m in models),
        "model_pss": statistics.mean(m[2] for m in models),
        "model_private": statistics.mean(m[3] for m in models),
        "tree_rss": sum(s[1] for s in everything),
        "tree_pss": sum(s[2] for s in everything),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.python_idle_rss", description=__doc__)
    parser.add_argument("--trees", default=".")
    parser.add_argument("--idle-s", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--tritonserver", type=Path, default=DEFAULT_TOOL.parent / "tritonserver.sh"
    )
    args = parser.parse_args(argv)
    trees = [str(Path(t).resolve()) for t in args.trees.split(",") if t]
    names = [*trees, TRITON]
    results: dict[str, list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-pyrss-") as work:
        repository = build(Path(work) / "models")
        for round_index in range(args.rounds):
            for name in names if round_index % 2 == 0 else names[::-1]:
                if name == TRITON:
                    started = start_triton(args.tritonserver, repository, Path(work) / "t.log")
                    if isinstance(started, str):
                        print(f"tritonserver skipped: {started}", flush=True)
                        continue
                    target = started
                else:
                    target = start_tree(Path(name), repository)
                try:
                    measured = measure(target, args.idle_s)
                finally:
                    target.stop()
                results.setdefault(name, []).append(measured)
                print(name, json.dumps(measured), flush=True)
    print("\n| server | model processes | RSS MiB / model process | PSS | private ", end="")
    print("| tree RSS | tree PSS |")
    print("|---|--:|--:|--:|--:|--:|--:|")
    for name, runs in results.items():
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        print(
            f"| {Path(name).name or name} | {med['model_processes']:.0f} | {med['model_rss']:.1f} "
            f"| {med['model_pss']:.1f} | {med['model_private']:.1f} | {med['tree_rss']:.0f} "
            f"| {med['tree_pss']:.0f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
