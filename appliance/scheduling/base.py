"""What the instance-backed schedulers share: instances, the rate limiter, in-flight
accounting, and the stop protocol used when a version retires or the server shuts down.

The idle instances, the batches running and the drain are also reached from front ends'
threads by the dynamic scheduler's thread lane (`DynamicScheduler.run_here`, scheduling/batcher.py):
`_lock` guards them wherever either side changes them.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import deque
from collections.abc import Sequence

from appliance.common.errors import ServerUnavailable
from appliance.common.types import Array
from appliance.scheduling.instances import BatchResult, InstanceWorker, Job
from appliance.scheduling.outcome import log_unexpected, settle
from appliance.scheduling.precise_timer import PreciseHandle
from appliance.scheduling.rate_limiter import RateLimiter
from appliance.scheduling.stats import ModelStats


class LaneWaiter:
    """A front end's thread waiting in the lane for an instance (`DynamicScheduler.run_here`),
    since `since_ns`. Released under the scheduler's `_lock`: with an instance already running
    its job (`worker`), with the stop's error (`refusal`), to look for an idle instance again
    (`retry`), or with none of these (go to the loop)."""

    __slots__ = ("_ready", "job", "refusal", "released", "retry", "since_ns", "worker")

    def __init__(self, job: Job, since_ns: int) -> None:
        self.job = job
        self.since_ns = since_ns
        self.worker: InstanceWorker | None = None
        self.refusal: BaseException | None = None
        self.rearm()

    def rearm(self) -> None:
        """Ready to wait (again)."""
        self.released = self.retry = False
        self._ready = threading.Lock()
        self._ready.acquire()

    def release(self, retry: bool = False) -> None:
        self.released, self.retry = True, retry
        self._ready.release()

    def wait(self, timeout_s: float) -> None:
        """Until released, or at most `timeout_s` (-1: no limit); never under `_lock`."""
        self._ready.acquire(True, timeout_s)


class SchedulerBase:
    """Instances on worker threads; subclasses decide what runs next (`_dispatch`)."""

    def __init__(
        self,
        label: str,
        workers: list[InstanceWorker],
        stats: ModelStats,
        rate_limiter: RateLimiter | None = None,
    ) -> None:
        self._label = label  # "model 'x' version 1", for messages
        self._workers = workers
        self._idle: deque[InstanceWorker] = deque(workers)
        self._running: dict[InstanceWorker, list[Job]] = {}
        self._stats = stats
        self._closing = False
        self._drained: asyncio.Event | None = None
        self._timer: asyncio.TimerHandle | PreciseHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._limiter = rate_limiter or RateLimiter(enabled=False)
        self._awaiting_resources = False
        # `_idle`, `_running` and `_drained` as the thread lane and the loop both change them.
        self._lock = threading.Lock()
        # Front ends' threads waiting in the lane for an instance (`DynamicScheduler.run_here`), in
        # arrival order: an instance given back goes to the first (`_give_back_worker`);
        # `_lane_cut` is a stop's reason once its deadline failed them.
        self._waiters: deque[LaneWaiter] = deque()
        self._lane_cut = ""
        for worker in workers:
            self._limiter.register(worker.resources)

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        for worker in self._workers:
            worker.start(self._loop)

    @property
    def pending(self) -> int:
        """Requests waiting for an instance (Triton's nv_inference_pending_request_count)."""
        raise NotImplementedError

    @property
    def in_flight(self) -> int:
        return self.pending + sum(len(jobs) for jobs in self._running.values())

    @property
    def open_sequences(self) -> int:
        return 0

    def _take_queued(self) -> list[Job]:
        """Remove and return every job still waiting."""
        raise NotImplementedError

    @property
    def pending_queue(self) -> int:
        """Jobs in the loop's queue (not the lane's waiters)."""
        return 0

    def _dispatch(self) -> None:
        raise NotImplementedError

    # ---- instances ---------------------------------------------------------------------------

    def _free_worker(self, jobs: list[Job]) -> InstanceWorker | None:
        """An idle instance whose rate-limiter resources are available (now taken, and
        running `jobs`); None (and a wake-up once resources free up) when the limiter holds
        every one back."""
        with self._lock:
            for worker in self._idle:
                if self._limiter.try_acquire(worker.resources):
                    self._idle.remove(worker)
                    self._running[worker] = jobs
                    return worker
            if self._idle:
                self._wait_for_resources()
            # Else the thread lane took the last idle instance after the caller looked (the
            # caller reads `_idle` without the lock): the lane wakes `_dispatch` when it gives
            # the instance back and work is queued (`DynamicScheduler.run_here`).
        return None

    def run_here(self, job: Job, inline: bool = False) -> dict[str, Array] | BaseException | None:
        """The thread lane (see `DynamicScheduler.run_here`): None, not taken, in this scheduler."""
        return None

    def _wait_for_resources(self) -> None:
        """Every idle instance is held back by the rate limiter: dispatch again once it frees
        resources."""
        self._awaiting_resources = True
        self._limiter.wait(self._on_resources, min(w.priority for w in self._idle))

    def _on_resources(self) -> None:
        self._awaiting_resources = False
        assert self._loop is not None
        self._loop.call_soon(self._dispatch)

    def _run(self, worker: InstanceWorker, jobs: list[Job], inline: bool = False) -> None:
        """Hand a batch to an instance: on its thread, or here on the loop when inline."""
        self._running[worker] = jobs
        if inline:
            result = worker.run(jobs)
            assert self._loop is not None
            self._loop.call_soon(self._on_batch_done, worker, result)
        else:
            worker.submit(jobs, self._on_batch_done)

    def _on_batch_done(self, worker: InstanceWorker, result: BatchResult) -> None:
        raise NotImplementedError

    def _instance_done(self, worker: InstanceWorker, result: BatchResult) -> None:
        """An instance is free again; log what went unexpectedly wrong in its batch."""
        with self._lock:
            del self._running[worker]
            self._give_back_worker(worker)
        self._limiter.release(worker.resources)
        if not result.batch_size or len(result.outcomes) > 1:  # a success of one: nothing
            log_unexpected(self._label, result.outcomes)

    @property
    def _lane_waiting(self) -> int:
        return len(self._waiters)

    def _give_back_worker(self, worker: InstanceWorker) -> None:
        """Under `_lock`: a free instance goes back to the idle ones and the first thread
        waiting in the lane is woken to take it (a request arriving meanwhile may take it
        first: no sleep for it, the cheaper way on a busy core); a waiter that has waited
        `_lane_patience_ns` gets it outright, already running its job, so none starves. When
        work is queued on the loop (it goes first) every waiter is sent to the loop."""
        waiters = self._waiters
        if waiters and not self.pending_queue:
            waiter = waiters.popleft()
            if time.monotonic_ns() - waiter.since_ns >= self._lane_patience_ns():
                waiter.worker = worker
                self._running[worker] = [waiter.job]
                waiter.release()
                return
            self._idle.append(worker)
            waiter.release(retry=True)
            return
        self._idle.append(worker)
        if self.pending_queue:
            while waiters:
                waiters.popleft().release()

    def _lane_patience_ns(self) -> int:
        """How long a lane waiter may be passed by requests arriving after it."""
        return 0

    def _settle(self, job: Job, outcome: dict[str, Array] | BaseException) -> None:
        if job.future.done():
            job.abandoned()
        settle(self._label, job.future, outcome)

    # ---- stop --------------------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        return bool(self.pending) or bool(self._running)

    def _refuse_if_closing(self) -> None:
        if self._closing:
            raise ServerUnavailable(f"{self._label} is unloading; retry")

    def admit(self) -> None:
        """No queue-wait bound here (the dynamic scheduler has one): refused only when closing."""
        self._refuse_if_closing()

    def arrived(self) -> None:
        pass

    def _notify_if_drained(self) -> None:
        if self._drained is not None and not self.busy:
            self._drained.set()

    async def stop(self, timeout_s: float, reason: str) -> int:
        """Refuse new work, wait for queued and running jobs up to timeout_s, fail the rest."""
        with self._lock:  # a batch the thread lane runs ends before this or sees `_drained`
            self._closing = True
            if self.busy:
                self._drained = asyncio.Event()
        if self._drained is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._drained.wait(), timeout_s)
        left = self._take_queued() + [job for jobs in self._running.values() for job in jobs]
        with self._lock:  # the lane's waiters fail with the same reason
            failed = len(self._waiters)
            self._lane_cut = reason
            while self._waiters:
                waiter = self._waiters.popleft()
                waiter.refusal = ServerUnavailable(f"{self._label}: {reason}")
                waiter.release()
        for job in left:
            if not job.future.done():
                job.future.set_exception(ServerUnavailable(f"{self._label}: {reason}"))
                failed += 1
        self._stats.cancelled += failed
        if self._timer is not None:
            self._timer.cancel()
        return failed

    def release(self, timeout_s: float) -> list[str]:
        """Blocking: end the instance threads within timeout_s in all and close instances; the
        names of those still running (interrupted where the backend can be)."""
        deadline = time.monotonic() + timeout_s
        return [
            w.name for w in self._workers if not w.stop(max(0.0, deadline - time.monotonic()))
        ]

    def health(self, now_ns: int, stuck_ns: int) -> str:
        """Why this version cannot make progress ('' when it can); see appliance/ops/notify.py."""
        if self._closing or self._loop is None:
            return ""
        states = [(w.alive, w.busy_since_ns) for w in self._workers]
        return stalled_reason(self._label, states, now_ns, stuck_ns)


def stalled_reason(
    label: str, workers: Sequence[tuple[bool, int]], now_ns: int, stuck_ns: int
) -> str:
    """Pure: '' unless an instance thread exited or every instance (alive, busy since) has been
    in one execution for longer than stuck_ns. One stuck instance of several is fine."""
    if not workers:
        return ""
    dead = sum(1 for alive, _ in workers if not alive)
    if dead:
        return f"{label}: {dead} of {len(workers)} instance threads exited"
    busy_for = [now_ns - since for _, since in workers if since]
    if len(busy_for) == len(workers) and min(busy_for) > stuck_ns:
        return (
            f"{label}: every instance ({len(workers)}) has been in one execution "
            f"for over {min(busy_for) / 1e9:.1f} s"
        )
    return ""
