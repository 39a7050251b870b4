"""The scheduler of one model version: bounded priority queues, the batching policy, instances.

It runs on the event loop and never blocks: `submit` queues a job and dispatches; an instance
finishing a batch dispatches again; one timer handles max_queue_delay and queue timeouts. With
no dynamic_batching in the config the same code sends every request alone (Triton's default
scheduler).

Inline execution: after a warm-up on the worker thread, a batch whose predicted cost (the
version's learned CPU time per input byte, times the batch's input bytes: scheduling/costs.py)
is within `inline_budget_ns` runs on the event loop itself, and is settled before `_dispatch`
returns: a caller that submitted it finds its future done and goes on without another round of
the loop. Everything else runs on worker threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from itertools import islice

from appliance.common.errors import QueueFull, ServerUnavailable
from appliance.common.types import Array
from appliance.scheduling.base import LaneWaiter, SchedulerBase
from appliance.scheduling.costs import WARMUP_EXECUTIONS, ExecutionCosts
from appliance.scheduling.instances import BatchResult, InstanceWorker, Job, counted
from appliance.scheduling.outcome import client_error, log_unexpected
from appliance.scheduling.policy import (
    BatchPolicy,
    admission_wait_ns,
    next_batch,
    overdue_after_ns,
    queue_wait_bound_ns,
)
from appliance.scheduling.precise_timer import LOOP_TIMER_MIN_NS, TIMERS
from appliance.scheduling.queues import QueuePolicy, RequestQueue
from appliance.scheduling.rate_limiter import RateLimiter
from appliance.scheduling.stats import ModelStats
from edge_backends.api import ResponseError

log = logging.getLogger(__name__)
# The longest learned execution (per request, wall) of a model in another process that the
# thread lane runs on a front end's thread (`DynamicScheduler._brief`).
LANE_OUT_OF_PROCESS_NS = 50_000_000


class QueueTimeout(ServerUnavailable):
    """A request's queue timeout (REJECT) expired before it ran."""


class DynamicScheduler(SchedulerBase):
    """Queues + batching + instance pool for one model version."""

    def __init__(
        self,
        label: str,
        workers: list[InstanceWorker],
        policy: BatchPolicy,
        stats: ModelStats,
        max_queue_size: int,
        preserve_ordering: bool = False,
        inline_budget_ns: int = 0,
        priority_levels: int = 0,
        default_priority_level: int = 0,
        queue_policies: dict[int, QueuePolicy] | None = None,
        rate_limiter: RateLimiter | None = None,
        max_queue_wait_ns: int = 0,
        queue_wait_executions: int = 0,
    ) -> None:
        super().__init__(label, workers, stats, rate_limiter)
        # Admission: refuse a request when the work queued ahead of it would take longer than
        # the bound (0: no limit), so overload is answered at once and admitted latency stays
        # bounded. With `queue_wait_executions` (the default settings) the bound is the longer
        # of max_queue_wait_ns and that many executions (policy.queue_wait_bound_ns).
        self._max_queue_wait_ns = max_queue_wait_ns
        self._wait_executions = queue_wait_executions
        # The default bound adds the batcher's configured delay: waiting for a batch to fill
        # is waiting as configured, not overload.
        self._delay_ns = policy.max_queue_delay_ns if policy.dynamic else 0
        # The bound in force, from what has been measured.
        self._bound_ns = queue_wait_bound_ns(
            max_queue_wait_ns, queue_wait_executions, 0.0, self._delay_ns
        )
        # What executions cost (scheduling/costs.py): inline decisions and admission.
        self._costs = ExecutionCosts(inline_budget_ns)
        # Requests admitted by their front end (`admit`) whose job is not queued yet: their
        # bodies are still being read. They count as work ahead of the next admission.
        self._arriving = 0
        self._policy = policy
        self._batching = policy.dynamic and policy.max_batch_size > 0
        self._head_limit = max(1, policy.max_batch_size) if self._batching else 1
        self._preserve_ordering = preserve_ordering
        self._queue = RequestQueue(
            label, priority_levels, default_priority_level, queue_policies or {}, max_queue_size
        )
        self._ordered: deque[BatchResult] = deque()  # dispatch order, for preserve_ordering
        # The thread lane (`run_here`) may be taken: a rate limiter is shared by every version
        # and wakes them on the loop; preserve_ordering orders responses on the loop; an
        # instance under a host policy runs on its own bound thread (--host-policy: a front
        # end's thread is not bound, nor is a Python model's process it would restart).
        self._lane = (
            not preserve_ordering
            and not self._limiter.enabled
            and all(w.host_policy is None for w in workers)
        )
        # Whether a request may wait in the lane for a busy instance: the loop's queue would
        # only keep it in arrival order (no priorities, timeouts or per-level bounds), and it
        # would run alone there too (no batching).
        self._lane_waits = self._lane and not self._batching and self._queue.plain
        # Whether every instance may run on the loop (not a model in another process).
        self._all_inline = all(w.inline_ok for w in workers)
        self._timer_at = 0  # monotonic ns the timer fires at

    @property
    def pending(self) -> int:
        return len(self._queue) + self._lane_waiting

    @property
    def pending_queue(self) -> int:
        return len(self._queue)

    def _take_queued(self) -> list[Job]:
        return self._queue.drain()

    async def submit(self, job: Job) -> dict[str, Array]:
        """Queue one job and wait for its outputs; cancelling the caller drops a queued job.

        A full queue raises QueueFull at once; nothing blocks or grows without bound.
        """
        self._refuse_if_closing()
        now = time.monotonic_ns()
        overdue_at = 0
        later = False  # the overload deadline is set only if the job is still queued below
        if self._max_queue_wait_ns and self._costs.request_ns:
            # The bound counts from the request's arrival, reading and decoding its body
            # included: measured at 4x the sustainable rate on a busy 2-core machine, counting
            # the queue alone admitted requests that had spent seconds arriving (admitted p50
            # 3.8 s against 0.8-1.0 s): stale work then delays the fresh requests behind it.
            since_ns = job.arrival_ns or now
            if self._may_refuse(0):
                with self._lock:
                    executing, done_ns = self._executing(now)
                ahead = self.pending + executing
                self._refuse_if_over(ahead, done_ns, now - since_ns)
            else:  # few ahead: admitted whatever they cost (policy.admission_wait_ns)
                ahead, done_ns = self.pending + len(self._running), 0.0
            # The deadline is at least the bound after arrival (overdue_after_ns): a request
            # that arrived within the bound cannot be overdue in the dispatch below, so its
            # deadline waits until that dispatch has left it queued (most run at once).
            later = now - since_ns < self._max_queue_wait_ns
            if not later:
                overdue_at = since_ns + self._overdue_ns(ahead, done_ns)
        self._queue.push(job, job.priority, job.timeout_us, now, overdue_at)
        self._dispatch()
        if later and job.queued:
            self._queue.set_overdue(job, since_ns + self._overdue_ns(ahead, done_ns))
            self._arm_timer(time.monotonic_ns(), 0)
        try:
            return await job.future
        except asyncio.CancelledError:
            if job.queued:  # the caller went away before it ran: it never will
                self._queue.discard(job)
                self._stats.cancelled += 1
            raise

    def _overdue_ns(self, ahead: int, done_ns: float) -> int:
        return overdue_after_ns(
            ahead, len(self._workers), self._costs.request_ns, self._bound_ns, done_ns
        )

    def _still_within_bound(self, job: Job) -> int:
        """A later overload deadline for a queued job whose deadline came due, from the bound
        in force now (0: none): a deadline set when the bound was shorter (the model's
        executions measured longer since) never refuses a job that has waited less than the
        bound now allows."""
        return (job.arrival_ns or job.enqueue_ns) + self._overdue_ns(0, 0.0)

    def admit(self) -> None:
        """Before the request's body is read: QueueFull at once when what is queued, executing
        and already admitted but still arriving would keep it past the bound."""
        self._refuse_if_closing()
        with self._lock:  # front ends admit from their threads too (the gRPC lane)
            if self._may_refuse(self._arriving):
                executing, done_ns = self._executing(time.monotonic_ns())
                self._refuse_if_over(self.pending + executing + self._arriving, done_ns, 0)
            self._arriving += 1

    def _may_refuse(self, arriving: int) -> bool:
        """Cheap first look for the hot path: False when so few requests can be ahead (each
        busy instance holds at most a full batch) that admission_wait_ns would admit anyway."""
        if not self._max_queue_wait_ns or not self._costs.request_ns:
            return False
        most = self.pending + arriving + len(self._running) * self._head_limit
        return most >= 2 * len(self._workers)

    def arrived(self) -> None:
        with self._lock:
            self._arriving = max(0, self._arriving - 1)

    def _executing(self, now: int) -> tuple[int, float]:
        """Requests in the batches the instances run now, and the execution time they have
        had (at most their predicted time each: one that runs over is about to finish).
        Under `_lock` (the thread lane changes `_running`)."""
        count, done_ns = 0, 0.0
        for jobs in self._running.values():
            if jobs:
                count += len(jobs)
                done_ns += min(now - jobs[0].dispatch_ns, len(jobs) * self._costs.request_ns)
        return count, done_ns

    def _refuse_if_over(self, ahead: int, done_ns: float, waited_ns: int) -> None:
        """Raise QueueFull when the work ahead (less `done_ns` already executed), after
        `waited_ns` already spent arriving (reading and decoding the body), would keep this
        request past the limit."""
        wait_ns = admission_wait_ns(
            ahead,
            len(self._workers),
            self._costs.request_ns,
            self._bound_ns,
            waited_ns,
            done_ns,
        )
        if wait_ns:
            arriving = f", {waited_ns / 1e6:.0f} ms of it arriving" if waited_ns >= 1e6 else ""
            raise QueueFull(
                f"{self._label}: overloaded: {ahead} requests ahead, about "
                f"{wait_ns / 1e6:.0f} ms of waiting{arriving} ({self._bound_text()}); "
                "retry later"
            )

    def _bound_text(self) -> str:
        """The bound in force, for refusals: the flag, or how the default grew."""
        if not self._wait_executions:
            return f"--max-queue-wait-ms {self._max_queue_wait_ns / 1e6:.0f}"
        delay = (
            f", plus the model's max_queue_delay_microseconds ({self._delay_ns / 1e6:.0f} ms)"
            if self._delay_ns
            else ""
        )
        return (
            f"bound {self._bound_ns / 1e6:.0f} ms: the longer of "
            f"{self._max_queue_wait_ns / 1e6:.0f} ms and {self._wait_executions} executions "
            f"of about {self._costs.execution_ns / 1e6:.0f} ms{delay}; --max-queue-wait-ms sets a "
            "fixed one"
        )

    def _dispatch(self) -> None:
        """Hand batches to idle instances while the policy says to run; a batch run inline is
        settled here (its callers' futures done before this returns: a caller awaiting it
        goes on without a round of the loop) and the queue looked at again."""
        queue = self._queue
        while len(queue):  # nothing queued: no timeout, deadline or batch to look at
            finished = self._dispatch_queued(queue)
            if not finished:
                return
            for worker, result in finished:
                self._batch_done(worker, result)
            self._notify_if_drained()

    def _dispatch_queued(self, queue: RequestQueue) -> list[tuple[InstanceWorker, BatchResult]]:
        """One pass of `_dispatch`: the batches it ran inline, with their results."""
        now = time.monotonic_ns()
        for expired in queue.expire(now):
            expired.future.set_exception(
                QueueTimeout(f"Request timeout expired ({self._label}: timed out while queued)")
            )
        # The model slowed down after they were admitted.
        for late in queue.overdue(now, self._still_within_bound):
            waited_ms = (now - (late.arrival_ns or late.enqueue_ns)) / 1e6
            late.future.set_exception(
                QueueFull(
                    f"{self._label}: overloaded: waited {waited_ms:.0f} ms for an instance, "
                    f"more than the queue-wait bound allows ({self._bound_text()}); retry later"
                )
            )
        wait_ns = 0
        finished: list[tuple[InstanceWorker, BatchResult]] = []
        while len(queue) and self._idle and not self._awaiting_resources:
            if self._batching:
                head = list(islice(queue.live(), self._head_limit))
                if not head:
                    break
                decision = next_batch(
                    [(j.batch_size, j.shape_key) for j in head],
                    now - head[0].enqueue_ns,
                    self._policy,
                )
                if not decision.run:
                    wait_ns = decision.wait_ns
                    break
                live = head[: decision.run]
            else:  # one request per execution: no decision to make
                first = next(queue.live(), None)
                if first is None:
                    break
                live = [first]
            worker = self._free_worker(live)
            if worker is None:  # the rate limiter holds every idle instance back
                break
            queue.take(live)
            for job in live:
                job.dispatch_ns = now
            if self._preserve_ordering:
                self._ordered.append(BatchResult(jobs=live))
            if worker.inline_ok and self._runs_inline(live):
                finished.append((worker, worker.run(live)))
            elif not worker.start_on_loop(live, self._on_batch_done):
                worker.submit(live, self._on_batch_done)
        self._arm_timer(now, wait_ns)
        return finished

    def _runs_inline(self, jobs: list[Job]) -> bool:
        """Inline when the learned CPU cost per input byte predicts a run within budget."""
        return self._inline_within_budget(_input_bytes(jobs))

    def _inline_within_budget(self, nbytes: int) -> bool:
        return self._costs.inline_within_budget(nbytes)

    def _learn_cost(self, result: BatchResult) -> None:
        if not result.batch_size:
            return
        wall_ns = result.input_ns + result.infer_ns + result.output_ns
        dispatched = result.jobs[0].dispatch_ns
        cycle_ns = time.monotonic_ns() - dispatched if dispatched else wall_ns
        costs = self._costs
        costs.learn(len(result.jobs), _input_bytes(result.jobs), result.cpu_ns, wall_ns, cycle_ns)
        self._bound_ns = queue_wait_bound_ns(
            self._max_queue_wait_ns, self._wait_executions, costs.execution_ns, self._delay_ns
        )

    def _arm_timer(self, now: int, wait_ns: int) -> None:
        """One timer for the batching window and the earliest queue timeout."""
        due = [t for t in (now + wait_ns if wait_ns else 0, self._queue.next_deadline()) if t]
        if not due:
            return
        at = min(due)
        if self._timer is not None:
            if self._timer_at <= at:
                return  # an earlier wake-up is already set; it re-arms what is left
            self._timer.cancel()
        assert self._loop is not None
        self._timer_at = at
        wait = at - now
        if 0 < wait < LOOP_TIMER_MIN_NS:  # the loop's timers would round this up to 1 ms
            self._timer = TIMERS.call_at(self._loop, at, self._on_timer)
        else:
            self._timer = self._loop.call_later(max(0, wait) / 1e9, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._dispatch()

    def _on_batch_done(self, worker: InstanceWorker, result: BatchResult) -> None:
        """A batch back from an instance's thread."""
        self._batch_done(worker, result)
        self._dispatch()
        self._notify_if_drained()

    def _batch_done(self, worker: InstanceWorker, result: BatchResult) -> None:
        self._instance_done(worker, result)
        with self._lock:
            self._learn_cost(result)
        if self._preserve_ordering:
            # Responses leave in dispatch order: park this batch until earlier ones are done.
            for i, slot in enumerate(self._ordered):
                if slot.jobs is result.jobs:
                    result.done = True
                    self._ordered[i] = result
                    break
            while self._ordered and self._ordered[0].done:
                self._complete(self._ordered.popleft())
        else:
            self._complete(result)

    def _complete(self, result: BatchResult) -> None:
        self._record(result)
        for job, outcome in zip(result.jobs, result.outcomes, strict=True):
            self._settle(job, outcome)

    def _record(self, result: BatchResult) -> None:
        """An execution's statistics (as tritonserver counts them: `counted`), and its
        requests' compute timestamps."""
        size = result.executed_size
        if not size:
            return
        result.stamp()
        stats = self._stats
        jobs = result.jobs
        if len(jobs) == 1 and result.batch_size:  # one request that ran: the common case
            job = jobs[0]
            outcome = result.outcomes[0]
            if not isinstance(outcome, BaseException) or isinstance(outcome, ResponseError):
                stats.record_one(
                    size,
                    job.batch_size,
                    result.input_ns,
                    result.infer_ns,
                    result.output_ns,
                    max(0, job.dispatch_ns - job.enqueue_ns),
                )
                stats.last_inference_ms = time.time_ns() // 1_000_000
                return
        inferences, queues = counted(result)
        stats.record_execution(
            size, inferences, result.input_ns, result.infer_ns, result.output_ns, queues
        )
        stats.last_inference_ms = time.time_ns() // 1_000_000

    # ---- the thread lane ---------------------------------------------------------------------

    def run_here(self, job: Job, inline: bool = False) -> dict[str, Array] | BaseException | None:
        """Run `job` on the calling thread (a front end's, not the loop's) when an instance is
        free for it now; None when not taken, and the caller submits it as usual. `inline`:
        the caller is the event loop itself (the HTTP infer route), so the job is taken only
        when the learned cost would run it inline on the loop anyway (`_runs_inline`).

        Taken only when the loop would run it at once and alone: nothing queued, not closing,
        an idle instance (on the loop itself, `inline`, only one whose `InstanceWorker.inline_ok`:
        not a model in another process), no rate limiter, no preserve_ordering, and the batching
        policy runs a batch of this one request now (no max_queue_delay to wait). The job then
        runs as a batch of one, with the loop's bookkeeping: it counts as running (in_flight,
        admission, the drain at stop), its queue time (0), execution statistics and cost are
        recorded, and the loop's `_dispatch` is woken when work queued meanwhile or a stop
        waits for the drain. The outcome: the outputs or the client's error; a request failed
        meanwhile by a stop at its deadline gets that error. Saves the two thread hand-offs
        (to the loop and back) that a front end on its own threads would pay per request.
        """
        if not self._lane:
            return None
        if not self._all_inline and (inline or not self._brief()):
            return None  # a model in another process: see `_brief`
        if self._batching:
            alone = [(job.batch_size, job.shape_key)]
            if next_batch(alone, 0, self._policy).run != 1:
                return None  # the policy waits for the batch to fill
        now = time.monotonic_ns()
        with self._lock:
            if self._closing or self._queue._count or self._awaiting_resources:
                return None
            idle = self._idle
            worker = idle[0] if idle else None  # `_lane_worker`, inlined: the hot path
            if inline and (worker is None or not self._inline_within_budget(job.nbytes)):
                return None  # the loop never waits, nor runs what costs more than its budget
            job.enqueue_ns = now
            jobs = [job]
            if worker is not None:
                idle.popleft()
                self._running[worker] = jobs
            else:
                waited = self._wait_in_lane(job, now)
                if not isinstance(waited, InstanceWorker):
                    return waited
                worker = waited  # handed over, already running this job
                now = time.monotonic_ns()  # its wait counts as queue time
            job.dispatch_ns = now
        worker.busy_since_ns = now
        result = worker.run(jobs)  # never raises
        worker.busy_since_ns = 0
        with self._lock:
            del self._running[worker]
            self._give_back_worker(worker)
            if result.cpu_ns >= 0:  # the runs whose CPU time was read (instances.py: all
                self._learn_cost(result)  # at first, then one in 8): the lane's hot path
            wake = bool(self._queue._count) or self._drained is not None
        if not result.batch_size:  # as `_instance_done` does
            log_unexpected(self._label, result.outcomes)
        self._record(result)
        if wake:
            assert self._loop is not None
            with contextlib.suppress(RuntimeError):  # the loop closed at exit
                self._loop.call_soon_threadsafe(self._lane_done)
        future = job.future
        if future.cancelled():
            return asyncio.CancelledError()
        if future.done():  # failed by a stop at its deadline
            failed = future.exception()
            if failed is not None:
                return failed
        outcome = result.outcomes[0]
        return client_error(self._label, outcome) if isinstance(outcome, BaseException) else outcome

    def _wait_in_lane(self, job: Job, now: int) -> InstanceWorker | BaseException | None:
        """Under `_lock` (released while waiting), no instance free for the lane and nothing
        queued on the loop: wait here, in arrival order, for an instance given back (returned
        already running the job; see `_give_back_worker`), as the job would in the loop's
        queue; or leave it to the loop
        (None): when the model's queue could not keep it in arrival order or admission could
        refuse it, when work queues on the loop meanwhile (it goes first), or at its overload
        deadline, where the loop's admission applies. A waiter counts as pending (admission,
        in_flight, the drain); a stop's deadline fails it (the error)."""
        if not self._lane_waits:
            return None
        if len(self._waiters) >= self._queue.cap:
            return None  # the loop refuses it: its queue's server-wide bound
        overdue_at = 0
        if self._max_queue_wait_ns and self._costs.request_ns:
            since = job.arrival_ns or now
            executing, done_ns = self._executing(now)
            ahead = len(self._waiters) + executing
            workers = len(self._workers)
            if admission_wait_ns(
                ahead, workers, self._costs.request_ns, self._bound_ns, now - since, done_ns
            ):
                return None
            overdue_at = since + self._overdue_ns(ahead, done_ns)
        waiter = LaneWaiter(job, now)
        self._waiters.append(waiter)
        while True:
            self._lock.release()
            try:
                left_s = -1.0
                if overdue_at:
                    left_s = max(0.0, (overdue_at - time.monotonic_ns()) / 1e9)
                waiter.wait(left_s)
            finally:
                self._lock.acquire()
            if not waiter.released:  # its overload deadline: the loop's admission decides
                self._waiters.remove(waiter)
                return None
            if waiter.refusal is not None or waiter.worker is not None:
                return waiter.refusal or waiter.worker
            if not waiter.retry or len(self._queue):
                return None  # to the loop, behind the work queued there
            if self._closing:  # woken, it no longer counts for the drain: a stop may be
                # closing the instances already (an execution on a closed instance)
                return ServerUnavailable(f"{self._label} is unloading; retry")
            worker = self._lane_worker()
            if worker is not None:
                self._idle.remove(worker)
                self._running[worker] = [job]
                return worker
            waiter.rearm()  # taken by a request that came meanwhile: first in line again
            self._waiters.appendleft(waiter)

    def _lane_patience_ns(self) -> int:
        """Two executions (at least 1 ms): a waiter passed for that long gets the next one."""
        return max(2 * int(self._costs.request_ns), 1_000_000)

    def _brief(self) -> bool:
        """Whether a model in another process may run in the lane: never on the loop, and on
        a front end's thread once its executions are known to be short (a caller that goes
        away leaves its thread, and its call's slot, waiting for the execution to end; on the
        loop's path both go at once)."""
        costs = self._costs
        return costs.measured >= WARMUP_EXECUTIONS and costs.request_ns <= LANE_OUT_OF_PROCESS_NS

    def _lane_worker(self) -> InstanceWorker | None:
        """Under `_lock`: an idle instance the lane may run a job on, if any. Any instance
        may: the lane is a front end's own thread, which a model in another process blocks
        as it would block the instance's thread (the instances of one model are alike)."""
        idle = self._idle
        return idle[0] if idle else None

    def _lane_done(self) -> None:
        """On the loop, after the lane handed an instance back: what queued meanwhile runs,
        and a stop waiting for the drain hears of it."""
        self._dispatch()
        self._notify_if_drained()


def _input_bytes(jobs: list[Job]) -> int:
    return sum(job.nbytes for job in jobs)
