"""max_inflight_requests (ensemble_scheduling): each step's requests in flight, across every
request of the ensemble, never exceed the limit; a decoupled producer faster than its consumer
is held back (it takes its next response only once the consumer's step has a slot), so what
waits stays bounded; 0 is no limit."""

from __future__ import annotations

import asyncio

import numpy as np

from appliance.scheduling.ensemble import (
    EnsemblePlan,
    EnsembleScheduler,
    EnsembleStep,
    StepEmit,
    StepRequest,
    StepTensor,
)
from appliance.scheduling.instances import Job

PRODUCE = EnsembleStep(0, "produce", "", {"x": "IN"}, {"y": "MID"})
CONSUME = EnsembleStep(1, "consume", "", {"x": "MID"}, {"y": "OUT"})
RESPONSES = 40


class Pipeline:
    """A decoupled producer that sends RESPONSES responses as fast as it may, and a consumer
    much slower; counts the consumer's requests in flight and how far the producer got
    ahead of it."""

    def __init__(self) -> None:
        self.consuming = 0
        self.peak_consuming = 0
        self.sent = 0
        self.consumed = 0
        self.peak_ahead = 0

    async def run_step(
        self,
        step: EnsembleStep,
        inputs: dict[str, StepTensor],
        request: StepRequest,
        each: StepEmit | None = None,
    ) -> dict[str, StepTensor]:
        x = inputs["x"].data
        if each is not None:
            for i in range(RESPONSES):
                # No wait of its own: a timer of 0.1 ms is as slow as the consumer's on a
                # loaded machine, and the producer would not run ahead.
                await asyncio.sleep(0)
                self.sent += 1
                self.peak_ahead = max(self.peak_ahead, self.sent - self.consumed)
                await each({"y": StepTensor(x + i, 0)})
            return {}
        self.consuming += 1
        self.peak_consuming = max(self.peak_consuming, self.consuming)
        try:
            await asyncio.sleep(0.002)
        finally:
            self.consuming -= 1
        self.consumed += 1
        return {"y": StepTensor(x * 2, 0)}


def scheduler(pipeline: Pipeline, limit: int) -> EnsembleScheduler:
    plan = EnsemblePlan(
        "e",
        (PRODUCE, CONSUME),
        ("IN",),
        ("OUT",),
        decoupled_steps=frozenset({0}),
        max_inflight_requests=limit,
    )
    return EnsembleScheduler("ensemble 'e'", plan, pipeline.run_step)


async def run(ensemble: EnsembleScheduler, requests: int) -> list[list[float]]:
    answers: list[list[float]] = [[] for _ in range(requests)]

    def job(index: int) -> Job:
        return Job(
            inputs={"IN": np.array([float(index)])},
            batch_size=1,
            shape_key=(),
            output_names=("OUT",),
            future=asyncio.get_running_loop().create_future(),
            emit=lambda made: answers[index].append(float(made["OUT"][0])),
        )

    await asyncio.gather(*(ensemble.submit(job(i)) for i in range(requests)))
    return answers


async def test_a_steps_requests_in_flight_never_exceed_the_limit_across_requests() -> None:
    pipeline = Pipeline()
    answers = await run(scheduler(pipeline, 3), requests=4)
    assert pipeline.peak_consuming <= 3
    assert pipeline.peak_consuming == 3  # the limit is reached, not undershot
    # Every response still arrives, in order.
    assert answers == [[2.0 * (r + i) for i in range(RESPONSES)] for r in range(4)]


async def test_a_fast_producer_is_held_back_by_its_consumer() -> None:
    pipeline = Pipeline()
    await run(scheduler(pipeline, 2), requests=1)
    # The producer is never more than the consumer's slots, plus the response waiting for
    # one, ahead of what was consumed.
    assert pipeline.peak_ahead <= 3


async def test_zero_means_no_limit() -> None:
    pipeline = Pipeline()
    await run(scheduler(pipeline, 0), requests=2)
    assert pipeline.peak_consuming > 3  # the producer ran ahead: every response in flight
    assert pipeline.peak_ahead > 3
