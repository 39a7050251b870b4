"""Small in-process model instances and jobs for the scheduler's unit tests (test_scheduler,
test_grpc_lane, test_queue_wait_bound): real worker threads, no backend."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from appliance.scheduling.batcher import DynamicScheduler
from appliance.scheduling.instances import InstanceWorker, Job
from appliance.scheduling.policy import BatchPolicy
from appliance.scheduling.stats import ModelStats
from edge_backends.api import ExecutionError, InputRejected, InstanceBase

ALONE = BatchPolicy(max_batch_size=0)


class Doubler(InstanceBase):
    """y = 2x, on the thread that calls it. Rejects negative input as a request error, fails on
    99, has a bug on 77. Waits for `gate` while it is clear (`entered` says it is waiting);
    records each execution's batch size, thread and first input value."""

    def __init__(self, gate: threading.Event | None = None, runs_inline: bool = True) -> None:
        self.runs_inline = runs_inline
        if gate is None:
            gate = threading.Event()
            gate.set()
        self.gate = gate
        self.entered = threading.Event()
        self.batches: list[int] = []
        self.threads: list[int] = []
        self.values: list[float] = []

    def execute(self, inputs: Any, output_names: Sequence[str]) -> dict[str, np.ndarray]:
        x = inputs["x"]
        self.threads.append(threading.get_ident())
        self.values.append(float(x.flat[0]))
        self.entered.set()
        self.gate.wait(10)
        if (x < 0).any():
            raise InputRejected("negative input")
        if (x == 99).any():
            raise ExecutionError("model crashed")
        if (x == 77).any():
            return {}["y"]  # a bug: KeyError
        self.batches.append(int(x.shape[0]))
        return {"y": x * 2}

    def close(self) -> None:
        pass


def job(value: float, rows: int = 1, loop: asyncio.AbstractEventLoop | None = None) -> Job:
    """`rows` rows of [value, value]; its future belongs to `loop` (default: the running one;
    a thread that is not the loop's passes it)."""
    x = np.full((rows, 2), value, dtype=np.float32)
    return Job(
        inputs={"x": x},
        nbytes=x.nbytes,
        batch_size=rows,
        shape_key=((2,),),
        output_names=("y",),
        future=(loop or asyncio.get_running_loop()).create_future(),
    )


def make(
    instance: InstanceBase,
    policy: BatchPolicy = ALONE,
    instances: int = 1,
    max_queue_size: int = 100,
    **kwargs: Any,
) -> tuple[DynamicScheduler, ModelStats]:
    """A started scheduler for 'm' version 1 with `instances` workers on `instance`."""
    stats = ModelStats()
    batching = policy.max_batch_size > 0
    workers = [InstanceWorker(f"w{i}", instance, batching=batching) for i in range(instances)]
    scheduler = DynamicScheduler(
        "model 'm' version 1", workers, policy, stats, max_queue_size, **kwargs
    )
    scheduler.start()
    return scheduler, stats
