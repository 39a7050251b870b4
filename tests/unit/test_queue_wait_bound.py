"""The default queue-wait bound: the longer of --max-queue-wait-ms's default and 16 of the
model's measured executions; a bound the operator sets stays fixed."""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path

import pytest

from appliance.common.errors import QueueFull
from appliance.common.settings import SchedulingSettings
from appliance.flags.serve import add_serve_flags, settings_from_args
from appliance.scheduling.batcher import DynamicScheduler
from appliance.scheduling.policy import BatchPolicy, queue_wait_bound_ns
from tests.unit.scheduling_doubles import job, make
from tests.unit.test_scheduler import Sleeper


def test_the_bound_grows_with_the_measured_execution() -> None:
    assert queue_wait_bound_ns(1_000_000_000, 16, 20e6) == 1_000_000_000  # fast: 1 s
    assert queue_wait_bound_ns(1_000_000_000, 16, 250e6) == 4_000_000_000  # 16 x 250 ms
    assert queue_wait_bound_ns(1_000_000_000, 16, 0.0) == 1_000_000_000  # nothing measured


def test_a_bound_the_operator_sets_is_fixed() -> None:
    assert queue_wait_bound_ns(300_000_000, 0, 250e6) == 300_000_000
    assert queue_wait_bound_ns(0, 16, 250e6) == 0  # 0: no limit, whatever the model


def test_the_flag_fixes_the_bound_and_its_absence_lets_it_grow(tmp_path: Path) -> None:
    def scheduling(*argv: str) -> SchedulingSettings:
        parser = argparse.ArgumentParser()
        add_serve_flags(parser)
        args = parser.parse_args(["--model-repository", str(tmp_path), *argv])
        return settings_from_args(args).scheduling

    default = scheduling()
    assert (default.max_queue_wait_ms, default.max_queue_wait_executions) == (1000, 16)
    given = scheduling("--max-queue-wait-ms", "1000")
    assert (given.max_queue_wait_ms, given.max_queue_wait_executions) == (1000, 0)
    off = scheduling("--max-queue-wait-ms=0")
    assert off.max_queue_wait_ms == 0


async def _learned(
    delay_s: float, max_wait_ms: int, executions: int
) -> tuple[DynamicScheduler, Sleeper]:
    model = Sleeper(delay_s)
    scheduler, _ = make(
        model,
        BatchPolicy(max_batch_size=0),
        max_queue_size=100,
        max_queue_wait_ns=max_wait_ms * 1_000_000,
        queue_wait_executions=executions,
    )
    for _ in range(2):
        await scheduler.submit(job(1))
    return scheduler, model


async def _queue_behind_a_held_instance(
    scheduler: DynamicScheduler, model: Sleeper, count: int
) -> tuple[list[asyncio.Future[object]], list[BaseException]]:
    """Hold the instance, submit `count` jobs; the futures admitted and the refusals."""
    model.gate.clear()
    admitted: list[asyncio.Future[object]] = []
    refused: list[BaseException] = []
    for i in range(count):
        task = asyncio.ensure_future(scheduler.submit(job(i)))
        await asyncio.sleep(0)
        if task.done() and task.exception() is not None:
            refused.append(task.exception())  # type: ignore[arg-type]
        else:
            admitted.append(task)
    return admitted, refused


@pytest.mark.parametrize(("executions", "admitted_at_least"), [(0, 2), (16, 12)])
async def test_a_queue_within_16_executions_is_admitted(
    executions: int, admitted_at_least: int
) -> None:
    """A 20 ms model, a 50 ms bound: fixed, 2-3 queued requests fit; growing (16 executions,
    320 ms), 12 queued requests (about 240 ms) are all admitted."""
    scheduler, model = await _learned(0.02, 50, executions)
    admitted, refused = await _queue_behind_a_held_instance(scheduler, model, 12)
    assert len(admitted) >= admitted_at_least
    if executions:
        assert not refused
    else:
        assert refused
        assert "--max-queue-wait-ms 50" in str(refused[0])
    model.gate.set()
    await asyncio.gather(*admitted)
    await scheduler.stop(1, "was unloaded")
    scheduler.release(1)


async def test_past_16_executions_the_default_still_refuses() -> None:
    scheduler, model = await _learned(0.02, 50, 16)
    admitted, refused = await _queue_behind_a_held_instance(scheduler, model, 40)
    assert 12 <= len(admitted) <= 24, len(admitted)
    assert refused
    assert isinstance(refused[0], QueueFull)
    assert "the longer of 50 ms and 16 executions" in str(refused[0])
    model.gate.set()
    await asyncio.gather(*admitted)
    await scheduler.stop(1, "was unloaded")
    scheduler.release(1)


@pytest.mark.parametrize("executions", [16, 0])
async def test_either_bound_counts_the_time_spent_arriving(executions: int) -> None:
    """A body that took a minute to arrive, behind a short queue of a 20 ms model, is over
    either bound (stale work would delay the fresh requests behind it)."""
    scheduler, model = await _learned(0.02, 1000, executions)
    model.gate.clear()
    ahead = [asyncio.ensure_future(scheduler.submit(job(i))) for i in range(3)]
    await asyncio.sleep(0)
    late = job(9)
    late.arrival_ns = time.monotonic_ns() - 60_000_000_000
    with pytest.raises(QueueFull, match="60000 ms of it arriving"):
        await scheduler.submit(late)
    model.gate.set()
    await asyncio.gather(*ahead)
    await scheduler.stop(1, "was unloaded")
    scheduler.release(1)
