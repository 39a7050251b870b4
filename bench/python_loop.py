"""The model process's request loop alone: its time for one execute message, in this process.

    python -m bench.python_loop [--calls 20000] [--rounds 5] [--model add_sub|identity]
                                [--profile]

The model (bench.python_vs_triton's add_sub, or an identity of one FP32 [4] input) is loaded
as a model process loads it, and `worker.Serving` answers execute messages that are the
server's own (an input arena and request infos as backend.py writes them), read through a
real Link from a pipe written here and answered on a pipe drained here. Prints, for the least
of the rounds, the time per call of the model process's part (the link's read, the message,
execute() and the answer's write): one thread's wall time, so its CPU on an idle core; the
pipe writes and reads that stand in for the server are not in it. A model process under load
costs more (cold caches, context switches): this is its Python, to cut. `--profile` prints
cProfile's top functions of that part.
"""

from __future__ import annotations

import argparse
import cProfile
import multiprocessing
import os
import pickle
import pstats
import struct
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from bench.python_overhead import IDENTITY_PY
from bench.python_vs_triton import build
from edge_backends.api import RequestInfo
from edge_backends.python import triton_python_backend_utils as pb_utils
from edge_backends.python.backend import _fields
from edge_backends.python.channel import Channel, Link
from edge_backends.python.shm import Arena, Reader
from edge_backends.python.worker import Runner, Serving, _load_model


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.python_loop", description=__doc__)
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--model", default="add_sub", choices=("add_sub", "identity"))
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-pyloop-") as work:
        root = build(Path(work) / "models")
        model_file = root / "add_sub" / "1" / "model.py"
        if args.model == "identity":
            model_file = Path(work) / "identity" / "model.py"
            model_file.parent.mkdir(parents=True)
            model_file.write_text(IDENTITY_PY)
        requests_in, requests = multiprocessing.Pipe(duplex=False)
        _answers, answers_out = multiprocessing.Pipe(duplex=False)
        loop_answers, loop_answers_out = multiprocessing.Pipe(duplex=False)
        parent, child = multiprocessing.Pipe()
        link = Link(requests_in, answers_out, loop_answers_out)
        channel = Channel(child, link)
        pb_utils._install(channel, str(model_file.parent))
        model = _load_model(model_file)
        serving = Serving(Runner(model, args.model, channel, None), channel, link)
        a = np.arange(4, dtype=np.float32)
        tensors = {"INPUT0": a} if args.model == "identity" else {"INPUT0": a, "INPUT1": a + 1}
        outputs = ["OUTPUT0"] if args.model == "identity" else ["OUTPUT0", "OUTPUT1"]
        arena = Arena("in")
        metas = arena.write(tensors)
        data = pickle.dumps(
            ("execute", arena.name, metas, outputs, None, _fields([RequestInfo()]), True),
            protocol=pickle.HIGHEST_PROTOCOL,
        )
        framed = struct.pack("<I", len(data)) + data
        write_fd, read_fd = requests.fileno(), loop_answers.fileno()

        def once() -> int:
            os.write(write_fd, framed)
            started = time.perf_counter_ns()
            serving.serve(link.recv())
            took = time.perf_counter_ns() - started
            os.read(read_fd, 1 << 16)
            return took

        # The answer is right (the bench measures the real thing).
        os.write(write_fd, framed)
        serving.serve(link.recv())
        kind, out_arena, out_metas, errors = pickle.loads(os.read(read_fd, 1 << 16)[4:])
        got = Reader().read(out_arena, out_metas, copy=True)
        assert kind == "result", (kind, errors)
        assert not errors, errors
        expected = a if args.model == "identity" else a + a + 1
        np.testing.assert_array_equal(got["0:OUTPUT0"], expected)
        for _ in range(2000):
            once()
        best = float("inf")
        for _ in range(args.rounds):
            total = sum(once() for _ in range(args.calls))
            best = min(best, total / args.calls / 1000)
        print(f"{args.model}: model process's loop {best:.2f} us per call (least of {args.rounds})")
        if args.profile:
            profile = cProfile.Profile()
            profile.enable()
            for _ in range(args.calls):
                once()
            profile.disable()
            pstats.Stats(profile).sort_stats("tottime").print_stats(30)
        serving.close()
        arena.close()
        link.close()
        parent.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
