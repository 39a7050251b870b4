"""Models on demand under a memory budget (docs/memory.md): 20 real ONNX models of 5 to 100 MiB,
a budget that holds about 5 of them, a random-access client mix.

    python -m bench.memory_budget [--duration-s 300] [--clients 4] [--models 20]

Writes the models (OUTPUT0 = W[INDEX], W a constant of the model's size: ONNX Runtime keeps it
in memory), starts the server twice on free ports: with `--model-memory-budget` (and
`--model-load-on-demand`), then with on-demand loads and no budget. Each client picks a model
at random (uniformly) for each request; a request whose model was not ready just before
(`GET /v2/models/M/ready`) is one that waited for a load. Reports requests, failures (and how
many said the memory budget refused them), the p50 / p99 of the requests that waited for a load
and of the others, and the peak memory of the server's whole process tree (the sum of the
processes' PSS, sampled every 0.2 s) against the budget plus the server's own base (the tree
before any model loaded). One JSON line per run on stdout; 300 s is the documented setting.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

from appliance.ops.memory import tree_bytes
from bench.common import ROOT, free_port, wait_ready

MiB = 1 << 20


def _sizes(count: int) -> list[float]:
    """`count` sizes from 5 to 100 MiB, spread evenly."""
    if count == 1:
        return [5.0]
    return [5 + 95 * i / (count - 1) for i in range(count)]


def _write(repo: Path, count: int) -> list[float]:
    sys.path.insert(0, str(ROOT))
    from tests.integration.models import write_sized_model

    sizes = _sizes(count)
    for i, size in enumerate(sizes):
        write_sized_model(repo, f"m{i:02d}", size, float(i))
    return sizes


def _percentile(values: list[float], share: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def _run(
    repo: Path, flags: list[str], names: list[str], duration_s: float, clients: int
) -> dict[str, Any]:
    http, grpc, metrics = free_port(), free_port(), free_port()
    state = tempfile.mkdtemp(prefix="bench-memory-state-")
    args = [
        sys.executable, "-m", "appliance", "serve", "--model-repository", str(repo),
        "--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics),
        "--model-load-on-demand", *flags,
    ]
    env = dict(os.environ, PYTHONPATH=str(ROOT), XDG_STATE_HOME=state)
    env.pop("STATE_DIRECTORY", None)
    log = open(Path(state) / "server.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        wait_ready(proc, http, time.monotonic())
        time.sleep(6)  # past the heap trimmer's first pass: the idle base
        base = tree_bytes(proc.pid)
        peak = [base]
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                peak[0] = max(peak[0], tree_bytes(proc.pid))
                time.sleep(0.2)

        cold: list[float] = []
        warm: list[float] = []
        failures: list[str] = []
        lock = threading.Lock()
        deadline = time.monotonic() + duration_s

        def client(seed: int) -> None:
            import tritonclient.http as httpclient

            rng = random.Random(seed)
            triton = httpclient.InferenceServerClient(f"127.0.0.1:{http}", network_timeout=120)
            index = httpclient.InferInput("INDEX", [1], "INT64")
            index.set_data_from_numpy(np.array([0], dtype=np.int64))
            while time.monotonic() < deadline:
                name = rng.choice(names)
                try:
                    ready = triton.is_model_ready(name)
                except Exception:
                    ready = False
                started = time.monotonic()
                try:
                    triton.infer(name, [index])
                except Exception as exc:
                    with lock:
                        failures.append(str(exc))
                    continue
                took = time.monotonic() - started
                with lock:
                    (warm if ready else cold).append(took)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        stop.set()
        sampler.join()
        with urllib.request.urlopen(f"http://127.0.0.1:{http}/status.json", timeout=10) as r:
            memory = json.loads(r.read())["memory"]
    finally:
        proc.terminate()
        proc.wait(60)
        log.close()
    text = (Path(state) / "server.log").read_text()
    shutil.rmtree(state, ignore_errors=True)
    ms = lambda v: None if v is None else round(v * 1000, 1)  # noqa: E731
    return {
        "flags": flags,
        "requests": len(cold) + len(warm) + len(failures),
        "failed": len(failures),
        "failed_for_memory": sum("load refused" in f for f in failures),
        "failures_sample": sorted(set(failures))[:3],
        "loads_on_demand": memory["loads_on_demand"],
        "unloads": memory["unloads"],
        "refusals": memory["refusals"],
        "reload_requests": len(cold),
        "reload_p50_ms": ms(_percentile(cold, 0.5)),
        "reload_p99_ms": ms(_percentile(cold, 0.99)),
        "warm_p50_ms": ms(_percentile(warm, 0.5)),
        "warm_p99_ms": ms(_percentile(warm, 0.99)),
        "base_mib": round(base / MiB, 1),
        "peak_mib": round(peak[0] / MiB, 1),
        "budget_mib": round(memory["budget_bytes"] / MiB, 1),
        "peak_over_base_plus_budget_mib": round((peak[0] - base - memory["budget_bytes"]) / MiB, 1)
        if memory["budget_bytes"]
        else None,
        "unload_lines": text.count("unloading model"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration-s", type=float, default=300.0, help="per run (default 300)")
    parser.add_argument("--clients", type=int, default=4, help="client threads (default 4)")
    parser.add_argument("--models", type=int, default=20, help="how many models (default 20)")
    parser.add_argument(
        "--hold", type=int, default=5, help="how many average models the budget holds (default 5)"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as folder:
        repo = Path(folder) / "repo"
        sizes = _write(repo, args.models)
        names = [f"m{i:02d}" for i in range(args.models)]
        # What `hold` models of the mean size cost loaded, room to load the largest (a load
        # holds twice its files more while it runs: docs/memory.md), and ONNX Runtime's
        # one-time start-up memory (about 40 MiB).
        budget = int((statistics.mean(sizes) * args.hold * 1.1 + 2 * max(sizes) + 40) * MiB)
        for flags in ([f"--model-memory-budget={budget}"], []):
            result = _run(repo, flags, names, args.duration_s, args.clients)
            result["models"] = args.models
            result["model_mib"] = [round(sizes[0], 1), round(sizes[-1], 1)]
            result["duration_s"] = args.duration_s
            print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
