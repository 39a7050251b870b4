"""The Python backend alone: CPU of one execute between the server and a model process.

    python -m bench.python_ipc [--calls 3000] [--model add_sub|repeat|bls] [--profile]

No front end, no scheduler: a PythonInstance of bench.python_vs_triton's model is created here
(this process is the server side) and called `--calls` times from one thread, as an instance
thread calls it. Prints the CPU (utime + stime) of this process and of the model process per
call, and the wall time per call. `bls` calls add_sub through a host that runs a second
instance in this process. `--profile` prints cProfile's top functions of this side.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import resource
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench.cpu import process_cpu_s
from bench.python_vs_triton import build
from edge_backends.api import HostRequest, InstanceSpec, RequestInfo
from edge_backends.python.backend import PythonInstance


class _Host:
    """BLS calls to add_sub, answered by an instance of it in this process."""

    def __init__(self, instance: PythonInstance) -> None:
        self._instance = instance

    def infer(self, request: HostRequest) -> Any:
        return self._instance.execute(request.inputs, request.output_names or ())

    def infer_stream(self, request: HostRequest, emit: Any) -> None:
        raise NotImplementedError

    def load_model(self, *args: Any) -> None:
        raise NotImplementedError

    def unload_model(self, *args: Any) -> None:
        raise NotImplementedError

    def is_model_ready(self, *args: Any) -> bool:
        return True


def _spec(root: Path, model: str, host: Any = None) -> InstanceSpec:
    return InstanceSpec(
        model_name=model,
        model_version=1,
        model_path=root / model / "1" / "model.py",
        instance_name=f"{model}_0",
        model_config={"name": model},
        host=host,
    )


def _self_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.python_ipc", description=__doc__)
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--model", default="add_sub", choices=("add_sub", "repeat", "bls"))
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-pyipc-") as work:
        root = build(Path(work) / "models")
        helpers: list[PythonInstance] = []
        host = None
        if args.model == "bls":
            helpers.append(PythonInstance(_spec(root, "add_sub")))
            host = _Host(helpers[0])
        instance = PythonInstance(_spec(root, args.model, host))
        pids = [os.getpid(), instance._process.pid, *(h._process.pid for h in helpers)]
        a = np.arange(4, dtype=np.float32)
        inputs = {"INPUT0": a} if args.model == "repeat" else {"INPUT0": a, "INPUT1": a}
        responses: list[Any] = []

        def once() -> None:
            if args.model == "repeat":
                pending = instance.execute_decoupled(
                    inputs, ["OUTPUT0"], responses.append, RequestInfo()
                )
                if pending is not None:
                    pending.result()
            else:
                instance.execute_requests(inputs, ["OUTPUT0", "OUTPUT1"], [RequestInfo()])

        for _ in range(200):
            once()
        profile = cProfile.Profile() if args.profile else None
        before = [_self_cpu_s(), *(process_cpu_s(p) for p in pids[1:])]
        started = time.perf_counter()
        if profile:
            profile.enable()
        for _ in range(args.calls):
            once()
        if profile:
            profile.disable()
        wall = time.perf_counter() - started
        after = [_self_cpu_s(), *(process_cpu_s(p) for p in pids[1:])]
        used = [(b - a) / args.calls * 1e6 for a, b in zip(before, after, strict=True)]
        names = ["server side", "model process", *("add_sub process" for _ in helpers)]
        print(
            f"{args.model}: "
            + ", ".join(f"{n} {u:.0f} us" for n, u in zip(names, used, strict=True))
            + f"; total {sum(used):.0f} us CPU, {wall / args.calls * 1e6:.0f} us wall per call"
        )
        if profile:
            pstats.Stats(profile).sort_stats("tottime").print_stats(25)
        instance.close()
        for helper in helpers:
            helper.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
