"""The rate limiter alone, and two models' schedulers sharing one resource."""

from __future__ import annotations

import asyncio
import threading

import numpy as np

from appliance.scheduling.batcher import DynamicScheduler
from appliance.scheduling.instances import InstanceWorker, Job
from appliance.scheduling.policy import BatchPolicy
from appliance.scheduling.rate_limiter import RateLimiter
from appliance.scheduling.stats import ModelStats
from edge_backends.api import InstanceBase


def test_acquire_release_and_wake_in_priority_order() -> None:
    limiter = RateLimiter(enabled=True, declared={"npu": 1})
    assert limiter.try_acquire({"npu": 1})
    assert not limiter.try_acquire({"npu": 1})
    woken: list[str] = []
    limiter.wait(lambda: woken.append("low"), priority=5)
    limiter.wait(lambda: woken.append("high"), priority=1)
    limiter.release({"npu": 1})
    assert woken == ["high", "low"]
    assert limiter.available("npu") == 1


def test_undeclared_resources_get_the_largest_request() -> None:
    limiter = RateLimiter(enabled=True)
    limiter.register({"mem": 2})
    limiter.register({"mem": 3})
    assert limiter.available("mem") == 3


def test_disabled_limiter_never_holds_back() -> None:
    limiter = RateLimiter(enabled=False, declared={"npu": 0})
    assert limiter.try_acquire({"npu": 5})


class Recorder(InstanceBase):
    def __init__(self, name: str, log: list[str], gate: threading.Event) -> None:
        self.name, self.log, self.gate = name, log, gate

    def execute(self, inputs, output_names):  # type: ignore[no-untyped-def]
        self.log.append(f"{self.name} start")
        self.gate.wait(5)
        self.log.append(f"{self.name} end")
        return {"y": inputs["x"]}

    def close(self) -> None:
        pass


def job() -> Job:
    return Job(
        inputs={"x": np.zeros((1, 1))},
        batch_size=1,
        shape_key=(),
        output_names=("y",),
        future=asyncio.get_running_loop().create_future(),
    )


async def test_two_models_sharing_one_resource_take_turns() -> None:
    limiter = RateLimiter(enabled=True, declared={"npu": 1})
    log: list[str] = []
    gate_a, gate_b = threading.Event(), threading.Event()
    schedulers = [
        DynamicScheduler(
            name,
            [InstanceWorker(name, Recorder(name, log, gate), True, {"npu": 1})],
            BatchPolicy(max_batch_size=1),
            ModelStats(),
            max_queue_size=4,
            rate_limiter=limiter,
        )
        for name, gate in (("a", gate_a), ("b", gate_b))
    ]
    for scheduler in schedulers:
        scheduler.start()
    first = asyncio.ensure_future(schedulers[0].submit(job()))
    await asyncio.sleep(0.05)
    second = asyncio.ensure_future(schedulers[1].submit(job()))
    await asyncio.sleep(0.05)
    assert log == ["a start"]  # b waits for the resource although its instance is idle
    gate_a.set()
    await first
    gate_b.set()
    await second
    assert log == ["a start", "a end", "b start", "b end"]
    for scheduler in schedulers:
        await scheduler.stop(1, "was unloaded")
        scheduler.release(1)
