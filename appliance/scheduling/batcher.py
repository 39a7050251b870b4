"""The scheduler of one model version: a bounded queue, the batching policy, idle instances.

It runs on the event loop and never blocks: `submit` queues a job and dispatches; an instance
finishing a batch dispatches again; a timer handles max_queue_delay. With no dynamic_batching
in the config the same code sends every request alone (Triton's default scheduler).

Inline execution: handing a batch to a worker thread and back costs two thread wake-ups, about
60 us of CPU on a small core, more than a tiny model (an add, a small MLP, a tree) takes to run.
After a warm-up on the worker thread, a batch whose predicted cost (the version's learned CPU
time per input byte, times the batch's input bytes) is within `inline_budget_ns` runs on the
event loop itself. Everything else runs on worker threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque

from appliance.errors import InferenceFailed, InvalidInput, QueueFull, ServerUnavailable
from appliance.scheduling.instances import BatchResult, InstanceWorker, Job
from appliance.scheduling.policy import BatchPolicy, next_batch
from appliance.scheduling.stats import ModelStats
from appliance.types import Array
from edge_backends.api import InputRejected

log = logging.getLogger(__name__)

# Executions measured on worker threads before a version may run inline.
_WARMUP_EXECUTIONS = 16


class Scheduler:
    """Queue + batching + instance pool for one model version."""

    def __init__(
        self,
        label: str,
        workers: list[InstanceWorker],
        policy: BatchPolicy,
        stats: ModelStats,
        max_queue_size: int,
        preserve_ordering: bool = False,
        inline_budget_ns: int = 0,
    ) -> None:
        self._label = label  # "model 'x' version 1", for messages
        self._workers = workers
        self._idle: deque[InstanceWorker] = deque(workers)
        self._policy = policy
        self._batching = policy.dynamic and policy.max_batch_size > 0
        self._inline_budget_ns = inline_budget_ns
        self._cost_per_byte_ns = 0.0
        self._measured = 0
        self._stats = stats
        self._max_queue_size = max_queue_size
        self._preserve_ordering = preserve_ordering
        self._queue: deque[Job] = deque()
        self._in_flight: deque[BatchResult] = deque()  # dispatch order, for preserve_ordering
        self._timer: asyncio.TimerHandle | None = None
        self._closing = False
        self._drained: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        for worker in self._workers:
            worker.start(self._loop)

    @property
    def pending(self) -> int:
        """Requests waiting for an instance (Triton's nv_inference_pending_request_count)."""
        return len(self._queue)

    @property
    def busy(self) -> bool:
        return bool(self._queue) or len(self._idle) < len(self._workers)

    async def submit(self, job: Job) -> dict[str, Array]:
        """Queue one job and wait for its outputs; cancelling the caller drops a queued job."""
        if self._closing:
            raise ServerUnavailable(f"{self._label} is unloading; retry")
        if len(self._queue) >= self._max_queue_size:
            raise QueueFull(
                f"{self._label}: queue is full ({self._max_queue_size} requests waiting)"
            )
        job.enqueue_ns = time.monotonic_ns()
        self._queue.append(job)
        self._dispatch()
        return await job.future

    def _dispatch(self) -> None:
        """Hand batches to idle instances while the policy says to run."""
        queue = self._queue
        while queue and self._idle:
            while queue and queue[0].future.done():  # cancelled while queued
                queue.popleft()
            if not queue:
                break
            now = time.monotonic_ns()
            if self._batching:
                decision = next_batch(
                    [(j.batch_size, j.shape_key) for j in _head(queue, self._policy)],
                    now - queue[0].enqueue_ns,
                    self._policy,
                )
                if not decision.run:
                    self._arm_timer(decision.wait_ns)
                    return
                live: list[Job] = []
                while len(live) < decision.run:
                    job = queue.popleft()
                    if not job.future.done():
                        live.append(job)
            else:  # one request per execution: no decision to make
                live = [queue.popleft()]
            for job in live:
                job.dispatch_ns = now
                self._stats.queue.add(now - job.enqueue_ns)
            worker = self._idle.popleft()
            if self._preserve_ordering:
                self._in_flight.append(BatchResult(jobs=live))
            if self._runs_inline(live):
                result = worker.run(live)
                assert self._loop is not None
                self._loop.call_soon(self._on_batch_done, worker, result)
            else:
                worker.submit(live, self._on_batch_done)

    def _runs_inline(self, jobs: list[Job]) -> bool:
        """Inline when the learned CPU cost per input byte predicts a run within budget."""
        if self._measured < _WARMUP_EXECUTIONS or not self._inline_budget_ns:
            return False
        return self._cost_per_byte_ns * _input_bytes(jobs) <= self._inline_budget_ns

    def _learn_cost(self, result: BatchResult) -> None:
        """Moving average of CPU time per input byte (CPU time, not wall time: a thread
        waiting for the GIL or a preempted VM would otherwise look slow)."""
        if not result.batch_size:
            return
        per_byte = result.cpu_ns / max(1, _input_bytes(result.jobs))
        self._measured += 1
        if self._measured == 1:
            self._cost_per_byte_ns = per_byte
        else:
            self._cost_per_byte_ns += (per_byte - self._cost_per_byte_ns) * 0.1

    def _arm_timer(self, wait_ns: int) -> None:
        if self._timer is not None:
            self._timer.cancel()
        assert self._loop is not None
        self._timer = self._loop.call_later(wait_ns / 1e9, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._dispatch()

    def _on_batch_done(self, worker: InstanceWorker, result: BatchResult) -> None:
        self._idle.append(worker)
        self._learn_cost(result)
        if self._preserve_ordering:
            # Responses leave in dispatch order: park this batch until earlier ones are done.
            for i, slot in enumerate(self._in_flight):
                if slot.jobs is result.jobs:
                    result.done = True
                    self._in_flight[i] = result
                    break
            while self._in_flight and self._in_flight[0].done:
                self._complete(self._in_flight.popleft())
        else:
            self._complete(result)
        self._dispatch()
        if self._drained is not None and not self.busy:
            self._drained.set()

    def _complete(self, result: BatchResult) -> None:
        stats = self._stats
        if result.batch_size:
            succeeded = sum(1 for o in result.outcomes if not isinstance(o, BaseException))
            stats.record_execution(
                result.batch_size, succeeded, result.input_ns, result.infer_ns, result.output_ns
            )
            stats.last_inference_ms = time.time_ns() // 1_000_000
        for job, outcome in zip(result.jobs, result.outcomes, strict=True):
            if job.future.done():
                continue
            if isinstance(outcome, InputRejected):
                job.future.set_exception(InvalidInput(f"{self._label}: {outcome}"))
            elif isinstance(outcome, BaseException):
                job.future.set_exception(InferenceFailed(f"{self._label} failed: {outcome}"))
            else:
                job.future.set_result(outcome)

    async def drain(self, timeout_s: float) -> None:
        """Refuse new work, wait for queued and running jobs up to timeout_s, then fail the rest."""
        self._closing = True
        if self.busy:
            self._drained = asyncio.Event()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._drained.wait(), timeout_s)
        while self._queue:
            job = self._queue.popleft()
            if not job.future.done():
                job.future.set_exception(ServerUnavailable(f"{self._label} was unloaded"))
        if self._timer is not None:
            self._timer.cancel()

    def stop_workers(self) -> None:
        """Blocking: join the worker threads and close instances (call from a thread)."""
        for worker in self._workers:
            worker.stop()


def _input_bytes(jobs: list[Job]) -> int:
    return sum(job.nbytes for job in jobs)


def _head(queue: deque[Job], policy: BatchPolicy) -> list[Job]:
    """The queued jobs the policy may look at (at most max_batch_size of them)."""
    limit = max(1, policy.max_batch_size) if policy.dynamic else 1
    out: list[Job] = []
    for job in queue:
        if job.future.done():
            continue
        out.append(job)
        if len(out) >= limit:
            break
    return out
