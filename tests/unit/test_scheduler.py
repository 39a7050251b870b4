"""The scheduler with real worker threads and small in-process model instances."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from appliance.common.errors import InferenceFailed, InvalidInput, QueueFull
from appliance.scheduling.batcher import DynamicScheduler, QueueTimeout
from appliance.scheduling.instances import (
    CPU_SAMPLE_EVERY,
    CPU_WARMUP_RUNS,
    BatchResult,
    InstanceWorker,
    Job,
)
from appliance.scheduling.policy import BatchPolicy
from appliance.scheduling.queues import QueuePolicy
from appliance.scheduling.stats import ModelStats
from edge_backends.api import ExecutionError, InputRejected, InstanceBase
from tests.unit.scheduling_doubles import Doubler, job, make

DYNAMIC = BatchPolicy(max_batch_size=8, dynamic=True, max_queue_delay_ns=50_000_000)


async def test_batched_requests_get_their_own_rows() -> None:
    model = Doubler()
    scheduler, stats = make(model, DYNAMIC, max_queue_size=100)
    results = await asyncio.gather(*(scheduler.submit(job(i)) for i in range(5)))
    for i, out in enumerate(results):
        np.testing.assert_array_equal(out["y"], np.full((1, 2), 2 * i))
    assert model.batches == [5]
    assert stats.execution_count == 1
    assert stats.inference_count == 5
    await scheduler.stop(1, "was unloaded")
    scheduler.release(1)


async def test_a_rejected_input_fails_only_its_own_request() -> None:
    scheduler, _ = make(Doubler(), DYNAMIC, max_queue_size=100)
    results = await asyncio.gather(
        scheduler.submit(job(1)),
        scheduler.submit(job(-1)),
        scheduler.submit(job(3)),
        return_exceptions=True,
    )
    np.testing.assert_array_equal(results[0]["y"], np.full((1, 2), 2))
    assert isinstance(results[1], InvalidInput)
    assert "model 'm' version 1: negative input" in str(results[1])
    np.testing.assert_array_equal(results[2]["y"], np.full((1, 2), 6))
    await scheduler.stop(1, "was unloaded")
    scheduler.release(1)


async def test_an_unexpected_exception_is_logged_once_with_traceback_model_and_version(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gate = threading.Event()
    scheduler, _ = make(Doubler(gate), DYNAMIC, max_queue_size=100)
    with caplog.at_level(logging.ERROR, logger="appliance.scheduling.outcome"):
        pending = [asyncio.ensure_future(scheduler.submit(job(77))) for _ in range(3)]
        await asyncio.sleep(0)
        gate.set()
        results = await asyncio.gather(*pending, return_exceptions=True)
    for result in results:  # every request of the batch fails, saying where to look
        assert isinstance(result, InferenceFailed)
        assert str(result) == (
            "model 'm' version 1 failed: internal error (KeyError); see the server log"
        )
    records = [r for r in caplog.records if r.name == "appliance.scheduling.outcome"]
    assert len(records) == 1  # one execution, one line, not one per request
    assert "model 'm' version 1" in records[0].getMessage()
    assert records[0].exc_info is not None
    assert records[0].exc_info[0] is KeyError
    assert 'return {}["y"]' in caplog.text  # the traceback reaches the log
    await scheduler.stop(1, "was unloaded")
    scheduler.release(1)


async def test_a_model_failure_is_reported_as_internal() -> None:
    scheduler, _ = make(Doubler(), BatchPolicy(max_batch_size=8), max_queue_size=100)
    with pytest.raises(InferenceFailed, match="model 'm' version 1 failed: model crashed"):
        await scheduler.submit(job(99))
    out = await scheduler.submit(job(1))  # the instance still serves
    np.testing.assert_array_equal(out["y"], np.full((1, 2), 2))
    await scheduler.stop(1, "was unloaded")
    scheduler.release(1)


async def test_full_queue_rejects_at_once() -> None:
    gate = threading.Event()
    scheduler, _ = make(Doubler(gate), BatchPolicy(max_batch_size=8), max_queue_size=2)
    running = asyncio.ensure_future(scheduler.submit(job(1)))  # occupies the instance
    await asyncio.sleep(0)
    queued = [asyncio.ensure_future(scheduler.submit(job(2))) for _ in range(2)]
    await asyncio.sleep(0)
    with pytest.raises(QueueFull, match=r"queue is full \(2 requests waiting\)"):
        await scheduler.submit(job(3))
    gate.set()
    await asyncio.gather(running, *queued)
    await scheduler.stop(1, "was unloaded")
    scheduler.release(1)


async def test_cancelled_queued_request_never_executes() -> None:
    gate = threading.Event()
    model = Doubler(gate)
    scheduler, _ = make(model, BatchPolicy(max_batch_size=8), max_queue_size=10)
    first = asyncio.ensure_future(scheduler.submit(job(1)))
    await asyncio.sleep(0)
    doomed = asyncio.ensure_future(scheduler.submit(job(5, rows=3)))
    await asyncio.sleep(0)
    doomed.cancel()
    gate.set()
    await first
    await scheduler.submit(job(2))
    assert 3 not in model.batches  # the cancelled 3-row request was dropped from the queue
    await scheduler.stop(1, "was unloaded")
    scheduler.release(1)


async def test_preserve_ordering_with_two_instances() -> None:
    slow_gate = threading.Event()
    slow, fast = Doubler(slow_gate), Doubler()
    stats = ModelStats()
    workers = [InstanceWorker("slow", slow, True), InstanceWorker("fast", fast, True)]
    scheduler = DynamicScheduler(
        "m",
        workers,
        BatchPolicy(max_batch_size=1),
        stats,
        max_queue_size=10,
        preserve_ordering=True,
    )
    scheduler.start()
    done: list[int] = []

    async def tracked(i: int) -> None:
        await scheduler.submit(job(i))
        done.append(i)

    first = asyncio.ensure_future(tracked(0))  # goes to the slow instance
    await asyncio.sleep(0)
    second = asyncio.ensure_future(tracked(1))  # the fast one finishes it first ...
    await asyncio.sleep(0.1)
    assert done == []  # ... but its response waits for the earlier request
    slow_gate.set()
    await asyncio.gather(first, second)
    assert done == [0, 1]
    await scheduler.stop(1, "was unloaded")
    scheduler.release(1)


async def test_drain_refuses_new_work() -> None:
    scheduler, _ = make(Doubler(), DYNAMIC, max_queue_size=10)
    await scheduler.stop(1, "was unloaded")
    with pytest.raises(Exception, match="unloading"):
        await scheduler.submit(job(1))
    scheduler.release(1)


class ThreadRecorder(Doubler):
    def __init__(self) -> None:
        super().__init__()
        self.threads: list[int] = []

    def execute(self, inputs: Any, output_names: Sequence[str]) -> dict[str, np.ndarray]:
        self.threads.append(threading.get_ident())
        return super().execute(inputs, output_names)


async def test_cheap_batches_run_inline_after_warm_up_and_big_ones_do_not() -> None:
    model = ThreadRecorder()
    stats = ModelStats()
    worker = InstanceWorker("w", model, batching=True)
    scheduler = DynamicScheduler(
        "m",
        [worker],
        BatchPolicy(max_batch_size=100_000),
        stats,
        max_queue_size=10,
        inline_budget_ns=10_000_000,  # 10 ms: any tiny batch qualifies
    )
    scheduler.start()
    loop_thread = threading.get_ident()
    for i in range(20):
        out = await scheduler.submit(job(i))
        np.testing.assert_array_equal(out["y"], np.full((1, 2), 2 * i))
    assert model.threads[0] != loop_thread  # warm-up on the worker thread
    assert model.threads[-1] == loop_thread  # then inline
    await scheduler.submit(job(1, rows=50_000))  # 400 KB: predicted over budget
    assert model.threads[-1] != loop_thread
    await scheduler.stop(1, "was unloaded")
    scheduler.release(1)


async def test_inline_execution_can_be_turned_off() -> None:
    model = ThreadRecorder()
    worker = InstanceWorker("w", model, batching=True)
    scheduler = DynamicScheduler(
        "m",
        [worker],
        BatchPolicy(max_batch_size=8),
        ModelStats(),
        max_queue_size=10,
        inline_budget_ns=0,
    )
    scheduler.start()
    for i in range(20):
        await scheduler.submit(job(i))
    assert threading.get_ident() not in model.threads
    await scheduler.stop(1, "was unloaded")
    scheduler.release(1)


def prioritized(value: float, priority: int, timeout_us: int = 0) -> Job:
    j = job(value)
    j.priority, j.timeout_us = priority, timeout_us
    return j


async def test_high_priority_overtakes_queued_low_priority_work() -> None:
    gate = threading.Event()
    model = Doubler(gate)
    stats = ModelStats()
    scheduler = DynamicScheduler(
        "m",
        [InstanceWorker("w", model, True)],
        BatchPolicy(max_batch_size=1),
        stats,
        max_queue_size=10,
        priority_levels=2,
        default_priority_level=2,
    )
    scheduler.start()
    order: list[float] = []

    async def tracked(value: float, priority: int) -> None:
        out = await scheduler.submit(prioritized(value, priority))
        order.append(float(out["y"][0, 0]) / 2)

    busy = asyncio.ensure_future(tracked(0, 2))  # occupies the instance
    await asyncio.sleep(0)
    low = [asyncio.ensure_future(tracked(v, 2)) for v in (1, 2)]
    await asyncio.sleep(0)
    high = asyncio.ensure_future(tracked(9, 1))
    await asyncio.sleep(0)
    gate.set()
    await asyncio.gather(busy, *low, high)
    assert order == [0, 9, 1, 2]
    await scheduler.stop(1, "was unloaded")
    scheduler.release(1)


async def test_queue_timeout_rejects_while_the_instance_is_busy() -> None:
    gate = threading.Event()
    scheduler = DynamicScheduler(
        "model 'm' version 1",
        [InstanceWorker("w", Doubler(gate), True)],
        BatchPolicy(max_batch_size=1),
        ModelStats(),
        max_queue_size=10,
        queue_policies={1: QueuePolicy(allow_timeout_override=True)},
    )
    scheduler.start()
    busy = asyncio.ensure_future(scheduler.submit(job(1)))
    await asyncio.sleep(0)
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(QueueTimeout, match=r"^Request timeout expired .*timed out while queued"):
        await scheduler.submit(prioritized(2, 0, timeout_us=20_000))
    assert loop.time() - started < 1.0  # failed at its deadline, not when the instance freed
    gate.set()
    await busy
    await scheduler.stop(1, "was unloaded")
    scheduler.release(1)


async def test_cancelled_request_is_counted() -> None:
    gate = threading.Event()
    stats = ModelStats()
    scheduler = DynamicScheduler(
        "m",
        [InstanceWorker("w", Doubler(gate), True)],
        BatchPolicy(max_batch_size=1),
        stats,
        max_queue_size=10,
    )
    scheduler.start()
    busy = asyncio.ensure_future(scheduler.submit(job(1)))
    await asyncio.sleep(0)
    doomed = asyncio.ensure_future(scheduler.submit(job(2)))
    await asyncio.sleep(0)
    assert scheduler.pending == 1
    doomed.cancel()
    await asyncio.sleep(0)
    assert stats.cancelled == 1
    assert scheduler.pending == 0
    gate.set()
    await busy
    await scheduler.stop(1, "was unloaded")
    scheduler.release(1)


class Sleeper(InstanceBase):
    """y = x after `delay_s`, waiting first for `gate` while it is clear."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.gate = threading.Event()
        self.gate.set()

    def execute(self, inputs: Any, output_names: Sequence[str]) -> dict[str, np.ndarray]:
        self.gate.wait(5)
        time.sleep(self.delay_s)
        return {"y": inputs["x"]}

    def close(self) -> None:
        pass


async def _learned(model: Sleeper, max_queue_wait_ms: int) -> DynamicScheduler:
    """A one-instance scheduler that has measured a few executions of `model`."""
    scheduler, _ = make(
        model,
        BatchPolicy(max_batch_size=0),
        max_queue_size=100,
        max_queue_wait_ns=max_queue_wait_ms * 1_000_000,
    )
    for _ in range(2):
        await scheduler.submit(job(1))
    return scheduler


async def test_requests_admitted_before_their_body_arrives_count_as_work_ahead() -> None:
    scheduler = await _learned(Sleeper(0.05), max_queue_wait_ms=60)
    scheduler.admit()  # nothing ahead
    scheduler.admit()  # one ahead: one waiting request per instance is always admitted
    # Two arriving requests of >= 50 ms each: over 60 ms, though the queue itself is empty.
    with pytest.raises(QueueFull, match=r"overloaded: 2 requests ahead.*--max-queue-wait-ms 60"):
        scheduler.admit()
    scheduler.arrived()
    scheduler.admit()  # one of them was queued or failed: room again
    scheduler.arrived()
    scheduler.arrived()
    await scheduler.stop(1, "was unloaded")
    scheduler.release(1)


async def test_time_spent_arriving_counts_against_the_bound() -> None:
    model = Sleeper(0.02)
    scheduler = await _learned(model, max_queue_wait_ms=200)
    model.gate.clear()
    busy = asyncio.ensure_future(scheduler.submit(job(1)))
    queued = asyncio.ensure_future(scheduler.submit(job(2)))
    await asyncio.sleep(0)
    late = job(3)
    late.arrival_ns = time.monotonic_ns() - 500_000_000  # its body took 500 ms to arrive
    with pytest.raises(QueueFull, match=r"2 requests ahead.* ms of it arriving"):
        await scheduler.submit(late)
    model.gate.set()
    await asyncio.gather(busy, queued)
    await scheduler.stop(1, "was unloaded")
    scheduler.release(1)


async def test_an_admitted_request_still_waiting_one_execution_past_the_bound_is_refused() -> None:
    model = Sleeper(0.02)
    scheduler = await _learned(model, max_queue_wait_ms=50)
    model.gate.clear()  # the model slows down after the admission: the running request hangs
    busy = asyncio.ensure_future(scheduler.submit(job(1)))
    await asyncio.sleep(0)
    started = time.monotonic()
    with pytest.raises(QueueFull, match=r"overloaded: waited \d+ ms for an instance"):
        await scheduler.submit(job(2))  # admitted: one waiting request per instance
    # Refused at about the bound plus one execution (50 + ~20 ms), not when the instance freed.
    assert 0.05 <= time.monotonic() - started < 1.0
    model.gate.set()
    await busy
    await scheduler.stop(1, "was unloaded")
    scheduler.release(1)


async def _warmed_inline() -> tuple[DynamicScheduler, ModelStats, ThreadRecorder]:
    """A scheduler whose tiny batches run on the loop (past the warm-up on the thread)."""
    model = ThreadRecorder()
    stats = ModelStats()
    worker = InstanceWorker("w", model, batching=True)
    scheduler = DynamicScheduler(
        "m", [worker], BatchPolicy(max_batch_size=8), stats, max_queue_size=10,
        inline_budget_ns=10_000_000,
    )  # fmt: skip
    scheduler.start()
    for i in range(20):
        await scheduler.submit(job(i))
    assert model.threads[-1] == threading.get_ident()
    return scheduler, stats, model


async def test_an_inline_batch_is_settled_before_submit_would_wait() -> None:
    """The caller of an inline batch gets its outputs without a round of the loop: its
    future is done when the dispatch returns, so awaiting it does not suspend."""
    scheduler, stats, _ = await _warmed_inline()
    before = (stats.execution_count, stats.inference_count, stats.queue.count)
    coroutine = scheduler.submit(job(7))
    with pytest.raises(StopIteration) as finished:
        coroutine.send(None)
    np.testing.assert_array_equal(finished.value.value["y"], np.full((1, 2), 14))
    after = (stats.execution_count, stats.inference_count, stats.queue.count)
    assert after == (before[0] + 1, before[1] + 1, before[2] + 1)
    assert stats.by_batch_size[1].compute_infer.count == before[0] + 1
    assert not scheduler.busy
    # A rejected input is settled the same way, as the request's own error.
    with pytest.raises(InvalidInput, match="negative input"):
        scheduler.submit(job(-1)).send(None)
    await scheduler.stop(1, "was unloaded")
    scheduler.release(1)


async def test_an_inline_batch_that_ends_the_drain_lets_stop_return() -> None:
    """An inline batch dispatched by the batching timer during a stop is settled there and
    the drain completes (nothing is left waiting for a loop hop)."""
    model = Doubler()
    stats = ModelStats()
    worker = InstanceWorker("w", model, batching=True)
    policy = BatchPolicy(max_batch_size=8, dynamic=True, max_queue_delay_ns=20_000_000)
    scheduler = DynamicScheduler(
        "m", [worker], policy, stats, max_queue_size=10, inline_budget_ns=10_000_000
    )
    scheduler.start()
    for i in range(20):
        await scheduler.submit(job(i))
    waiting = [asyncio.ensure_future(scheduler.submit(job(i))) for i in range(3)]
    await asyncio.sleep(0)
    assert scheduler.pending == 3  # in the batching window
    assert await scheduler.stop(2, "was unloaded") == 0
    assert [w.result()["y"][0, 0] for w in waiting] == [0, 2, 4]
    assert model.batches[-1] == 3
    scheduler.release(1)


def test_a_batch_of_one_is_timed_and_answered_like_any_batch() -> None:
    seen: list[Sequence[str]] = []

    class Recorder(Doubler):
        def execute(self, inputs: Any, output_names: Sequence[str]) -> dict[str, np.ndarray]:
            seen.append(list(output_names))
            return super().execute(inputs, output_names)

    async def main() -> None:
        worker = InstanceWorker("w", Recorder(), batching=True)
        one = job(3)
        one.output_names = ("y", "y")
        result = worker.run([one])
        assert seen[-1] == ["y"]  # duplicates asked for once, as for a batch
        outputs = result.outcomes[0]
        assert isinstance(outputs, dict)
        np.testing.assert_array_equal(outputs["y"], np.full((1, 2), 6))
        assert result.batch_size == 1
        assert result.started_ns > 0
        assert result.infer_ns > 0
        assert min(result.input_ns, result.output_ns) >= 0
        assert result.cpu_ns > 0
        rejected = worker.run([job(-1)])
        assert isinstance(rejected.outcomes[0], InputRejected)
        assert rejected.batch_size == 0
        crashed = worker.run([job(99)])
        assert isinstance(crashed.outcomes[0], ExecutionError)
        assert crashed.batch_size == 0

    asyncio.run(main())


def test_the_cpu_clock_is_sampled_after_the_warm_up() -> None:
    async def main() -> list[int]:
        worker = InstanceWorker("w", Doubler(), batching=True)
        return [worker.run([job(1)]).cpu_ns for _ in range(CPU_WARMUP_RUNS + 2 * CPU_SAMPLE_EVERY)]

    cpu = asyncio.run(main())
    assert all(ns > 0 for ns in cpu[:CPU_WARMUP_RUNS])
    sampled = [i + 1 for i, ns in enumerate(cpu) if ns >= 0 and i >= CPU_WARMUP_RUNS]
    assert sampled == [CPU_WARMUP_RUNS + CPU_SAMPLE_EVERY, CPU_WARMUP_RUNS + 2 * CPU_SAMPLE_EVERY]
    unsampled = [ns for i, ns in enumerate(cpu) if i >= CPU_WARMUP_RUNS and i + 1 not in sampled]
    assert set(unsampled) == {-1}


async def test_an_unsampled_batch_leaves_the_learned_cost_per_byte() -> None:
    scheduler, _, _ = await _warmed_inline()
    cost = scheduler._costs.per_byte_ns
    result = BatchResult(jobs=[job(1)], outcomes=[{}], batch_size=1, infer_ns=1000, cpu_ns=-1)
    scheduler._learn_cost(result)
    assert scheduler._costs.per_byte_ns == cost
    result.cpu_ns = int(cost * 8 * 100)  # 8 input bytes at 100x the cost
    scheduler._learn_cost(result)
    assert scheduler._costs.per_byte_ns > cost
    await scheduler.stop(1, "was unloaded")
    scheduler.release(1)
