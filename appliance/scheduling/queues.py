"""Priority levels and queue policies of the dynamic batcher, as Triton defines them.

Priority 1 is the highest; a request without a priority gets `default_priority_level`. Each
level has a policy: `max_queue_size` (a full level refuses at once), a default timeout that a
request may shorten when `allow_timeout_override` is set, and what happens at the timeout:
REJECT fails the request, DELAY moves it behind every request that is still within its time.
Apart from those, a job may carry an overload deadline (`overdue_at`, from the server's
queue-wait bound): past it, the job leaves the queue to be refused, whatever its level.
Times are monotonic nanoseconds passed in by the caller, so the logic is testable with plain
numbers.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

from appliance.errors import InvalidInput, QueueFull
from appliance.scheduling.instances import Job


@dataclass(frozen=True)
class QueuePolicy:
    max_queue_size: int = 0  # 0: only the server-wide bound applies
    default_timeout_ns: int = 0  # 0: no timeout
    delay_on_timeout: bool = False  # timeout_action DELAY (else REJECT)
    allow_timeout_override: bool = False


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
        self._label = label
        self._levels = max(1, levels)
        self._priorities_enabled = levels > 0
        self._default_level = default_level if levels > 0 else 1
        self._policies = policies
        self._cap = server_cap
        self._waiting: list[deque[Job]] = [deque() for _ in range(self._levels)]
        self._delayed: list[deque[Job]] = [deque() for _ in range(self._levels)]
        self._deadlines: list[tuple[int, int, Job]] = []  # heap: (deadline, seq, job)
        self._overdue: list[tuple[int, int, Job]] = []  # heap: (overload deadline, seq, job)
        self._seq = 0
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def policy(self, level: int) -> QueuePolicy:
        return self._policies.get(level, QueuePolicy())

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
        waiting = self._waiting[level - 1]
        level_size = len(waiting) + len(self._delayed[level - 1])
        if policy.max_queue_size and level_size >= policy.max_queue_size:
            raise QueueFull(
                f"{self._label}: queue for priority level {level} is full "
                f"(max_queue_size {policy.max_queue_size}); retry later"
            )
        if self._count >= self._cap:
            raise QueueFull(f"{self._label}: queue is full ({self._cap} requests waiting)")
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
                self._delayed[job.level - 1].append(job)
            else:
                job.queued = False
                self._count -= 1
                rejected.append(job)
        return rejected

    def overdue(self, now: int) -> list[Job]:
        """Remove and return the jobs whose overload deadline is due by `now`."""
        late: list[Job] = []
        while self._overdue and self._overdue[0][0] <= now:
            _, _, job = heapq.heappop(self._overdue)
            if job.queued and not job.future.done():
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
        """Queued jobs in dispatch order: by level, on-time jobs before delayed ones."""
        for waiting in self._waiting:
            for job in waiting:
                if job.queued and not job.delayed and not job.future.done():
                    yield job
        for delayed in self._delayed:
            for job in delayed:
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
        for waiting in self._waiting:
            while waiting and (not waiting[0].queued or waiting[0].delayed):
                waiting.popleft()
        for delayed in self._delayed:
            while delayed and not delayed[0].queued:
                delayed.popleft()
