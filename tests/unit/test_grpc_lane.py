"""The dynamic scheduler's thread lane (batcher.py, `DynamicScheduler.run_here`), which the
gRPC front end's handler threads run ModelInfer on: when it takes a request, when it leaves it
to the loop, and its bookkeeping shared with the loop (real worker threads, small in-process
instances; the server end to end: tests/integration/test_grpc_lane.py)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Coroutine
from typing import Any

from appliance.common.errors import InferenceFailed, InvalidInput, ServerUnavailable
from appliance.scheduling.batcher import DynamicScheduler
from appliance.scheduling.costs import WARMUP_EXECUTIONS
from appliance.scheduling.instances import Job
from appliance.scheduling.policy import BatchPolicy
from appliance.scheduling.rate_limiter import RateLimiter
from tests.unit.scheduling_doubles import Doubler, job, make


async def here(scheduler: DynamicScheduler, the_job: Job) -> Any:
    """`run_here` from a thread that is not the loop's."""
    return await asyncio.to_thread(scheduler.run_here, the_job)


async def held(model: Doubler, call: Coroutine[Any, Any, Any]) -> asyncio.Future[Any]:
    """`call` (a coroutine: the lane or the loop) held in the model until `model.gate` is set."""
    model.gate.clear()
    model.entered.clear()
    running = asyncio.ensure_future(call)
    await asyncio.to_thread(model.entered.wait, 10)
    return running


async def _running_in_lane(scheduler: DynamicScheduler, model: Doubler) -> asyncio.Future[Any]:
    """A lane request held in the model (until `model.gate` is set)."""
    return await held(model, here(scheduler, job(1.0)))


async def test_an_idle_instance_runs_the_request_on_the_calling_thread() -> None:
    model = Doubler()
    scheduler, stats = make(model)
    loop = asyncio.get_running_loop()
    callers: list[int] = []

    def call() -> Any:
        callers.append(threading.get_ident())
        return scheduler.run_here(job(3.0, loop=loop))

    outputs = await asyncio.to_thread(call)
    assert outputs["y"].tolist() == [[6.0, 6.0]]
    assert model.threads == callers  # not the instance's thread, not the loop's
    assert (stats.execution_count, stats.inference_count, stats.queue.count) == (1, 1, 1)
    assert stats.compute_infer.count == 1
    assert stats.by_batch_size[1].compute_infer.count == 1
    assert scheduler.in_flight == 0
    # Its errors come back as the loop path's: a request's bad input, the model's failure.
    assert isinstance(await here(scheduler, job(-1.0, loop=loop)), InvalidInput)
    assert isinstance(await here(scheduler, job(99.0, loop=loop)), InferenceFailed)
    assert stats.execution_count == 1  # failed executions are not counted, as on the loop
    await scheduler.stop(1, "test")


async def test_a_busy_instance_or_waiting_work_leaves_the_request_to_the_loop() -> None:
    model = Doubler()
    scheduler, _ = make(model)
    loop = asyncio.get_running_loop()
    running = await held(model, scheduler.submit(job(1.0, loop=loop)))
    queued = asyncio.ensure_future(scheduler.submit(job(2.0, loop=loop)))
    await asyncio.sleep(0)
    assert scheduler.pending == 1
    assert await here(scheduler, job(3.0, loop=loop)) is None  # busy, and work waits
    model.gate.set()
    assert (await running)["y"].tolist() == [[2.0, 2.0]]
    assert (await queued)["y"].tolist() == [[4.0, 4.0]]
    assert await here(scheduler, job(3.0, loop=loop)) is not None  # idle again
    await scheduler.stop(1, "test")


async def test_what_the_loop_must_order_or_wait_for_is_not_taken() -> None:
    loop = asyncio.get_running_loop()
    not_taken = [
        make(Doubler(), BatchPolicy(8, dynamic=True, max_queue_delay_ns=10**9))[0],
        make(Doubler(), preserve_ordering=True)[0],
        make(Doubler(), rate_limiter=RateLimiter(enabled=True))[0],
    ]
    for scheduler in not_taken:
        assert await here(scheduler, job(1.0, loop=loop)) is None
    batching = make(Doubler(), BatchPolicy(8, dynamic=True, max_queue_delay_ns=0))[0]
    assert (await here(batching, job(1.0, rows=2, loop=loop)))["y"].shape == (2, 2)
    closing = make(Doubler())[0]
    await closing.stop(1, "test")
    assert await here(closing, job(1.0, loop=loop)) is None
    for scheduler in [*not_taken, batching]:
        await scheduler.stop(1, "test")


async def test_statistics_stay_exact_with_the_lane_and_the_loop_at_once() -> None:
    scheduler, stats = make(Doubler(), instances=2)
    loop = asyncio.get_running_loop()
    taken = [0]

    def lane(count: int) -> None:
        for _ in range(count):
            the_job = job(1.0, loop=loop)
            if scheduler.run_here(the_job) is not None:
                taken[0] += 1
            else:  # as the front end does: the loop runs what the lane did not take
                asyncio.run_coroutine_threadsafe(scheduler.submit(the_job), loop).result(10)

    async def on_loop(count: int) -> None:
        for _ in range(count):
            await scheduler.submit(job(1.0, rows=1, loop=loop))

    threads = [asyncio.to_thread(lane, 300) for _ in range(4)]
    await asyncio.gather(*threads, on_loop(300), on_loop(300))
    assert taken[0] > 0
    assert stats.execution_count == 1800
    assert stats.inference_count == 1800
    assert stats.queue.count == 1800
    assert stats.compute_infer.count == 1800
    assert scheduler.in_flight == 0
    await scheduler.stop(1, "test")


async def test_a_stop_waits_for_a_lane_request_and_fails_it_at_the_deadline() -> None:
    model = Doubler()
    scheduler, _ = make(model)
    lane = await _running_in_lane(scheduler, model)
    assert scheduler.in_flight == 1
    assert scheduler.busy
    stopping = asyncio.ensure_future(scheduler.stop(10, "unloading"))
    await asyncio.sleep(0.1)
    assert not stopping.done()  # draining: the lane's request runs
    model.gate.set()
    assert (await lane)["y"].tolist() == [[2.0, 2.0]]
    assert await asyncio.wait_for(stopping, 5) == 0  # the lane woke the drain

    scheduler, stats = make(model)
    lane = await _running_in_lane(scheduler, model)
    assert await scheduler.stop(0.05, "server is shutting down") == 1
    model.gate.set()
    failed = await lane
    assert isinstance(failed, ServerUnavailable)
    assert "shutting down" in failed.message
    assert stats.cancelled == 1


async def test_work_queued_while_the_lane_runs_is_dispatched_after_it() -> None:
    model = Doubler()
    scheduler, _ = make(model)
    loop = asyncio.get_running_loop()
    lane = await _running_in_lane(scheduler, model)
    queued = asyncio.ensure_future(scheduler.submit(job(5.0, loop=loop)))
    await asyncio.sleep(0.05)
    assert scheduler.pending == 1  # the only instance is in the lane
    model.gate.set()
    assert (await lane)["y"].tolist() == [[2.0, 2.0]]
    assert (await asyncio.wait_for(queued, 5))["y"].tolist() == [[10.0, 10.0]]
    await scheduler.stop(1, "test")


async def _until(condition: Any) -> None:
    for _ in range(500):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not met in time")


async def test_a_request_waits_in_the_lane_for_the_busy_instance_and_runs_after_it() -> None:
    model = Doubler()
    scheduler, stats = make(model)
    loop = asyncio.get_running_loop()
    first = await _running_in_lane(scheduler, model)
    second = asyncio.ensure_future(here(scheduler, job(2.0, loop=loop)))
    await _until(lambda: scheduler.pending == 1)  # waiting: pending, as in the queue
    assert scheduler.in_flight == 2
    model.gate.set()
    assert (await first)["y"].tolist() == [[2.0, 2.0]]
    assert (await second)["y"].tolist() == [[4.0, 4.0]]
    assert len(set(model.threads)) == 2  # each on its own caller's thread
    assert stats.queue.count == 2
    assert stats.queue.ns > 0  # the second one's wait
    assert scheduler.pending == 0
    await scheduler.stop(1, "test")


async def test_work_queued_on_the_loop_goes_first_and_the_lane_waiter_to_the_loop() -> None:
    model = Doubler()
    scheduler, _ = make(model)
    loop = asyncio.get_running_loop()
    first = await _running_in_lane(scheduler, model)
    waiter = asyncio.ensure_future(here(scheduler, job(2.0, loop=loop)))
    await _until(lambda: scheduler.pending == 1)
    queued = asyncio.ensure_future(scheduler.submit(job(3.0, loop=loop)))
    await _until(lambda: scheduler.pending == 2)
    model.gate.set()
    await first
    assert (await asyncio.wait_for(queued, 5))["y"].tolist() == [[6.0, 6.0]]
    # The waiter went to the loop (None), or ran in the lane after the queued request.
    outcome = await waiter
    assert outcome is None or outcome["y"].tolist() == [[4.0, 4.0]]
    assert model.values == ([1.0, 3.0] if outcome is None else [1.0, 3.0, 2.0])
    await scheduler.stop(1, "test")


async def test_batching_models_do_not_wait_in_the_lane() -> None:
    model = Doubler()
    scheduler, _ = make(model, BatchPolicy(8, dynamic=True, max_queue_delay_ns=0))
    first = await _running_in_lane(scheduler, model)
    # The loop's queue batches the requests that wait: the lane leaves them to it.
    assert await here(scheduler, job(2.0)) is None
    model.gate.set()
    await first
    await scheduler.stop(1, "test")


async def test_a_stop_at_its_deadline_fails_the_lane_waiters() -> None:
    model = Doubler()
    scheduler, stats = make(model)
    first = await _running_in_lane(scheduler, model)
    waiter = asyncio.ensure_future(here(scheduler, job(2.0)))
    await _until(lambda: scheduler.pending == 1)
    assert await scheduler.stop(0.05, "server is shutting down") == 2
    failed = await waiter
    assert isinstance(failed, ServerUnavailable)
    assert failed.message == "model 'm' version 1: server is shutting down"
    model.gate.set()
    assert isinstance(await first, ServerUnavailable)
    assert stats.cancelled == 2


async def test_a_model_in_another_process_runs_in_the_lane_but_never_on_the_loop() -> None:
    """A front end's thread may block on a Python model's process as the instance thread
    would (two thread hand-offs fewer a request), once its executions are known to be short
    (a cancelled caller's thread waits for the execution); the loop itself never runs it."""
    loop = asyncio.get_running_loop()
    scheduler, stats = make(Doubler(runs_inline=False))
    assert await here(scheduler, job(1.0, loop=loop)) is None  # its cost not learned yet
    for _ in range(WARMUP_EXECUTIONS):
        await scheduler.submit(job(1.0, loop=loop))
    assert (await here(scheduler, job(1.0, loop=loop)))["y"].tolist() == [[2.0, 2.0]]
    assert stats.execution_count == WARMUP_EXECUTIONS + 1
    assert scheduler.run_here(job(2.0), inline=True) is None  # on the loop: not taken
    assert scheduler.pending == 0
    await scheduler.stop(1, "test")


async def test_the_loop_itself_never_waits_in_the_lane() -> None:
    """`inline`: the event loop's own call (the HTTP infer route) is refused at once when the
    instance is busy: waiting would stop the loop."""
    model = Doubler()
    scheduler, _ = make(model)
    first = await _running_in_lane(scheduler, model)
    started = time.monotonic()
    assert scheduler.run_here(job(2.0), inline=True) is None
    assert time.monotonic() - started < 0.5
    assert scheduler.pending == 0
    model.gate.set()
    await first
    await scheduler.stop(1, "test")


async def test_threads_waiting_in_the_lane_get_the_instance_in_arrival_order() -> None:
    """An instance given back goes to the first waiter, already running its job: no later
    request passes the waiters (before, a new arrival could take it first, again and again,
    and a waiter reached its overload deadline: DenseNet over gRPC at c=8 was refused)."""
    model = Doubler()
    scheduler, stats = make(model)
    loop = asyncio.get_running_loop()
    first = await _running_in_lane(scheduler, model)
    waiters = []
    for value in (2.0, 3.0, 4.0):
        waiters.append(asyncio.ensure_future(here(scheduler, job(value, loop=loop))))
        count = len(waiters)
        await _until(lambda count=count: scheduler.pending == count)
    model.gate.set()
    await first
    results = [await waiter for waiter in waiters]
    assert [r["y"].tolist()[0][0] for r in results] == [4.0, 6.0, 8.0]
    assert model.values == [1.0, 2.0, 3.0, 4.0]
    assert stats.queue.count == 4
    assert scheduler.pending == 0
    assert scheduler.in_flight == 0
    await scheduler.stop(1, "test")


async def test_the_loop_finding_the_lane_took_the_last_instance_waits_for_it() -> None:
    """The loop looks at the idle instances without the lock; a lane thread may take the last
    one before the loop's `_free_worker` takes the lock. Before: ValueError (min() of no idle
    instances, CI's Python 3.10 run); now the job waits for the lane to give it back."""
    scheduler, stats = make(Doubler(), instances=1)
    loop = asyncio.get_running_loop()
    free_worker = scheduler._free_worker
    taken: list[Any] = []

    def lane_takes_it_first(jobs: list[Job]) -> Any:
        if not taken:  # what `run_here` does under the lock, between the loop's look and this
            with scheduler._lock:
                worker = scheduler._lane_worker()
                assert worker is not None
                scheduler._idle.remove(worker)
                scheduler._running[worker] = [job(0.0)]
                taken.append(worker)
        return free_worker(jobs)

    scheduler._free_worker = lane_takes_it_first  # type: ignore[method-assign]
    queued = asyncio.ensure_future(scheduler.submit(job(2.0)))
    await asyncio.sleep(0.05)
    assert taken
    assert not queued.done()  # waiting for the instance, not failed
    with scheduler._lock:  # the lane gives it back, as `run_here` does, and wakes the loop
        del scheduler._running[taken[0]]
        scheduler._give_back_worker(taken[0])
    loop.call_soon_threadsafe(scheduler._lane_done)
    outputs = await asyncio.wait_for(queued, 10)
    assert outputs["y"].tolist() == [[4.0, 4.0]]
    assert stats.execution_count == 1  # the queued job's run (the lane's was not run here)
    await scheduler.stop(1, "test")
