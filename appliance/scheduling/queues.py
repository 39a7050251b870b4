"""Priority levels and queue policies of the dynamic batcher, as Triton defines them.

Priority 1 is the highest; a request without a priority gets `default_priority_level`. As in
Triton, `priority_levels` may be any uint64: a level's queues exist only while it holds jobs
(a dict keyed by level, with the levels in use kept sorted), so the count sizes nothing. Each
level has a policy: `max_queue_size` (a full level refuses at once), a default timeout that a
request may shorten when `allow_timeout_override` is set, and what happens at the timeout:
REJECT fails the request, DELAY moves it behind every request of its level that is still within
its time (ahead of the levels after it, as Triton).
Apart from those, a job may carry an overload deadline (`overdue_at`, from the server's
queue-wait bound): past it, the job leaves the queue to be refused, whatever its level.
Times are monotonic nanoseconds passed in by the caller, so the logic is testable with plain
numbers.
"""

from __future__ import annotations

import bisect
import heapq
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from appliance.common.errors import InvalidInput, QueueFull
from appliance.scheduling.instances import Job


@dataclass(frozen=True)
class QueuePolicy:
    max_queue_size: int = 0  # 0: only the server-wide bound applies
    default_timeout_ns: int = 0  # 0: no timeout
    delay_on_timeout: bool = False  # timeout_action DELAY (else REJECT)
    allow_timeout_override: bool = False


# Triton's words for a request refused because its level's queue is full (UNAVAILABLE).
QUEUE_FULL_TEXT = "Exceeds maximum queue size"
# The key of `RequestQueue`'s policies that holds the policy of every level not listed.
DEFAULT_POLICY_KEY = 0


class RequestQueue:
    """Jobs waiting for an instance, by priority level, with deadlines."""

    def __init__(
        self,
        label: str,
        levels: int,
        default_level: int,
        policies: dict[int, QueuePolicy],
        server_cap: int,
    ) -> None:
        """`policies`: by level; `DEFAULT_POLICY_KEY` (0) for the levels not listed."""
        self._label = label
        self._levels = max(1, levels)
        self._priorities_enabled = levels > 0
        self._default_level = default_level if levels > 0 else 1
        self._policies = policies
        self._default_policy = policies.get(DEFAULT_POLICY_KEY, QueuePolicy())
        self._cap = server_cap
        # Levels in use, made by their first job and dropped when both queues are empty; the
        # default level stays (most requests use it: no queues made per request).
        self._order: list[int] = [self._default_level]  # sorted: highest priority (1) first
        self._waiting: dict[int, deque[Job]] = {self._default_level: deque()}
        self._delayed: dict[int, deque[Job]] = {self._default_level: deque()}
        self._deadlines: list[tuple[int, int, Job]] = []  # heap: (deadline, seq, job)
        self._overdue: list[tuple[int, int, Job]] = []  # heap: (overload deadline, seq, job)
        self._seq = 0
        self._count = 0

    def __len__(self) -> int:
        return self._count

    @property
    def plain(self) -> bool:
        """Whether jobs leave in arrival order whatever they ask: one level, no timeouts, no
        bound but the server's (the scheduler's thread lane may then keep its waiters)."""
        return not self._priorities_enabled and all(
            policy == QueuePolicy() for policy in self._policies.values()
        )

    @property
    def cap(self) -> int:
        """The server-wide bound on jobs waiting."""
        return self._cap

    def policy(self, level: int) -> QueuePolicy:
        return self._policies.get(level, self._default_policy)

    def level_of(self, priority: int) -> int:
        """The level a request's `priority` parameter puts it in (0: the default level)."""
        if priority == 0 or not self._priorities_enabled:
            return self._default_level
        if not 1 <= priority <= self._levels:
            raise InvalidInput(
                f"{self._label}: priority {priority} is out of range; this model has priority "
                f"levels 1 (highest) to {self._levels}"
            )
        return priority

    def push(self, job: Job, priority: int, timeout_us: int, now: int, overdue_at: int = 0) -> None:
        """Queue a job or raise QueueFull at once; `overdue_at` (0: none): see `overdue`."""
        level = self.level_of(priority)
        policy = self.policy(level)
        waiting = self._waiting.get(level)
        level_size = len(waiting) + len(self._delayed[level]) if waiting is not None else 0
        if policy.max_queue_size and level_size >= policy.max_queue_size:
            raise QueueFull(
                f"{QUEUE_FULL_TEXT}: {self._label}: queue for priority level {level} is full "
                f"(max_queue_size {policy.max_queue_size}); retry later"
            )
        if self._count >= self._cap:
            raise QueueFull(
                f"{QUEUE_FULL_TEXT}: {self._label}: queue is full ({self._cap} requests waiting)"
            )
        if waiting is None:
            waiting = self._waiting[level] = deque()
            self._delayed[level] = deque()
            bisect.insort(self._order, level)
        timeout_ns = policy.default_timeout_ns
        if timeout_us > 0 and policy.allow_timeout_override:
            requested = timeout_us * 1000
            timeout_ns = min(timeout_ns, requested) if timeout_ns else requested
        job.level = level
        job.enqueue_ns = now
        job.deadline_ns = now + timeout_ns if timeout_ns else 0
        job.queued = True
        waiting.append(job)
        self._count += 1
        if job.deadline_ns:
            self._seq += 1
            heapq.heappush(self._deadlines, (job.deadline_ns, self._seq, job))
        if overdue_at:
            self.set_overdue(job, overdue_at)

    def set_overdue(self, job: Job, overdue_at: int) -> None:
        """Give a queued job its overload deadline (monotonic ns): see `overdue`."""
        self._seq += 1
        heapq.heappush(self._overdue, (overdue_at, self._seq, job))

    def expire(self, now: int) -> list[Job]:
        """Apply timeouts due by `now`: returns the jobs to reject; DELAY jobs move back."""
        rejected: list[Job] = []
        while self._deadlines and self._deadlines[0][0] <= now:
            _, _, job = heapq.heappop(self._deadlines)
            if not job.queued or job.future.done():
                continue
            if self.policy(job.level).delay_on_timeout:
                job.delayed = True
                self._delayed[job.level].append(job)
            else:
                job.queued = False
                self._count -= 1
                rejected.append(job)
        return rejected

    def overdue(self, now: int, extend: Callable[[Job], int] | None = None) -> list[Job]:
        """Remove and return the jobs whose overload deadline is due by `now`; a job for which
        `extend` gives a later deadline (the bound has grown since) stays queued until then."""
        late: list[Job] = []
        while self._overdue and self._overdue[0][0] <= now:
            _, _, job = heapq.heappop(self._overdue)
            if job.queued and not job.future.done():
                later = extend(job) if extend is not None else 0
                if later > now:
                    self.set_overdue(job, later)
                    continue
                job.queued = False
                self._count -= 1
                late.append(job)
        if late:
            self._compact()
        return late

    def next_deadline(self) -> int:
        """The earliest pending deadline (timeout or overload), 0 when none."""
        due = 0
        for heap in (self._deadlines, self._overdue):
            while heap and not heap[0][2].queued:
                heapq.heappop(heap)
            if heap and (not due or heap[0][0] < due):
                due = heap[0][0]
        return due

    def live(self) -> Iterator[Job]:
        """Queued jobs in dispatch order: by level, and in each level its on-time jobs before
        its delayed ones (Triton's PriorityQueue: a level's delayed requests go before the
        next level's)."""
        for level in self._order:
            for job in self._waiting[level]:
                if job.queued and not job.delayed and not job.future.done():
                    yield job
            for job in self._delayed[level]:
                if job.queued and not job.future.done():
                    yield job

    def take(self, jobs: list[Job]) -> None:
        """Remove jobs (from `live()`) that are about to run."""
        for job in jobs:
            job.queued = False
        self._count -= len(jobs)
        self._compact()

    def discard(self, job: Job) -> None:
        """Forget a job whose caller went away before it ran."""
        if job.queued:
            job.queued = False
            self._count -= 1

    def drain(self) -> list[Job]:
        """Remove and return every queued job."""
        jobs = list(self.live())
        self.take(jobs)
        return jobs

    def _compact(self) -> None:
        # Finished entries leave from the fronts; ones further back go when they get there
        # (the queue bound keeps that bounded). A delayed job's old entry counts as finished.
        # A level whose queues are both empty is dropped, but for the default one.
        empty: list[int] = []
        for level in self._order:
            waiting, delayed = self._waiting[level], self._delayed[level]
            while waiting and (not waiting[0].queued or waiting[0].delayed):
                waiting.popleft()
            while delayed and not delayed[0].queued:
                delayed.popleft()
            if not waiting and not delayed and level != self._default_level:
                empty.append(level)
        for level in empty:
            del self._waiting[level], self._delayed[level]
            self._order.remove(level)
