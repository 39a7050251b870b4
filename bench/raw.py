"""Raw ONNX Runtime, in-process, batch 1, one thread, pinned to one core: the ceiling.

    python -m bench.raw --model MODEL.onnx [--seconds 4] [--core 0]

Prints one JSON line: bench.common.Stats and cpu_us, the process's CPU per inference. The session
matches what the server is asked to do on one core: intra-op 1 thread, inter-op 1 thread, no
spinning, all graph optimizations.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from bench.common import Stats, pin_to_core, summarize

ORT_TYPES: dict[str, type[np.generic]] = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(double)": np.float64,
    "tensor(int8)": np.int8,
    "tensor(int16)": np.int16,
    "tensor(int32)": np.int32,
    "tensor(int64)": np.int64,
    "tensor(uint8)": np.uint8,
    "tensor(bool)": np.bool_,
}
WARMUP_S = 0.5
WARMUP_RUNS = 3


def open_session(model: str) -> Any:
    import onnxruntime as ort  # imported after pinning, so ORT's threads inherit the affinity

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.add_session_config_entry("session.inter_op.allow_spinning", "0")
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.log_severity_level = 3
    return ort.InferenceSession(model, sess_options=opts, providers=["CPUExecutionProvider"])


def batch1_feed(session: Any, seed: int = 0) -> dict[str, np.ndarray]:
    """Random batch-1 inputs: every symbolic dimension becomes 1."""
    rng = np.random.default_rng(seed)
    feed: dict[str, np.ndarray] = {}
    for arg in session.get_inputs():
        shape = [d if isinstance(d, int) else 1 for d in arg.shape]
        dtype = ORT_TYPES[arg.type]
        if np.issubdtype(dtype, np.floating):
            feed[arg.name] = rng.random(shape).astype(dtype)
        else:
            feed[arg.name] = rng.integers(0, 100, size=shape).astype(dtype)
    return feed


def measure(session: Any, feed: dict[str, np.ndarray], seconds: float) -> tuple[Stats, float]:
    """Stats and the process's CPU per inference (us)."""
    warm_until = time.perf_counter() + WARMUP_S
    runs = 0
    while runs < WARMUP_RUNS or time.perf_counter() < warm_until:
        session.run(None, feed)
        runs += 1
    latencies: list[float] = []
    cpu0 = time.process_time()
    start = time.perf_counter()
    end = start
    while end - start < seconds:
        t0 = time.perf_counter()
        session.run(None, feed)
        end = time.perf_counter()
        latencies.append(end - t0)
    cpu_us = 1e6 * (time.process_time() - cpu0) / max(1, len(latencies))
    return summarize(latencies, end - start), cpu_us


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.raw")
    parser.add_argument("--model", required=True, help="path to the .onnx file")
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--core", type=int, default=0)
    args = parser.parse_args(argv)
    pin_to_core(args.core)
    session = open_session(args.model)
    stats, cpu_us = measure(session, batch1_feed(session), args.seconds)
    print(json.dumps({**stats.as_dict(), "cpu_us": cpu_us}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
