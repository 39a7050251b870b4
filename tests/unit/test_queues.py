"""Priority levels, queue limits and timeouts, with plain numbers for time."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from appliance.common.errors import InvalidInput, QueueFull
from appliance.scheduling.instances import Job
from appliance.scheduling.queues import QueuePolicy, RequestQueue

MS = 1_000_000


def job(tag: int) -> Job:
    return Job(
        inputs={"x": np.array([[tag]])},
        batch_size=1,
        shape_key=(),
        output_names=("y",),
        future=asyncio.get_running_loop().create_future(),
    )


def tags(queue: RequestQueue) -> list[int]:
    return [int(j.inputs["x"][0, 0]) for j in queue.live()]


def queue(levels: int = 3, default: int = 2, **policies: QueuePolicy) -> RequestQueue:
    by_level = {int(k[1:]): v for k, v in policies.items()}
    return RequestQueue("model 'm' version 1", levels, default, by_level, server_cap=100)


async def test_higher_priority_runs_first_fifo_within_a_level() -> None:
    q = queue()
    for tag, priority in ((1, 3), (2, 0), (3, 1), (4, 3), (5, 1)):
        q.push(job(tag), priority, 0, now=0)
    assert tags(q) == [3, 5, 2, 1, 4]  # level 1, then the default level 2, then 3


async def test_priority_out_of_range_is_a_clear_error() -> None:
    with pytest.raises(InvalidInput, match=r"priority 4 is out of range.*1 \(highest\) to 3"):
        queue().push(job(1), 4, 0, now=0)


async def test_priorities_off_ignore_the_parameter() -> None:
    q = queue(levels=0, default=0)
    q.push(job(1), 0, 0, now=0)
    q.push(job(2), 7, 0, now=0)
    assert tags(q) == [1, 2]


async def test_full_level_refuses_at_once_naming_the_limit() -> None:
    q = queue(l1=QueuePolicy(max_queue_size=1))
    q.push(job(1), 1, 0, now=0)
    with pytest.raises(QueueFull, match="priority level 1 is full \\(max_queue_size 1\\)"):
        q.push(job(2), 1, 0, now=0)
    q.push(job(3), 2, 0, now=0)  # other levels still take work
    assert len(q) == 2


async def test_server_cap_bounds_every_queue() -> None:
    q = RequestQueue("m", 0, 0, {}, server_cap=2)
    q.push(job(1), 0, 0, now=0)
    q.push(job(2), 0, 0, now=0)
    with pytest.raises(QueueFull, match=r"queue is full \(2 requests waiting\)"):
        q.push(job(3), 0, 0, now=0)


async def test_reject_on_timeout() -> None:
    q = queue(l2=QueuePolicy(default_timeout_ns=5 * MS))
    q.push(job(1), 0, 0, now=0)
    q.push(job(2), 0, 0, now=3 * MS)
    assert q.next_deadline() == 5 * MS
    assert q.expire(now=4 * MS) == []
    rejected = q.expire(now=6 * MS)
    assert [int(j.inputs["x"][0, 0]) for j in rejected] == [1]
    assert tags(q) == [2]
    assert len(q) == 1


async def test_delay_on_timeout_moves_the_request_behind_the_others() -> None:
    q = queue(l2=QueuePolicy(default_timeout_ns=5 * MS, delay_on_timeout=True))
    q.push(job(1), 0, 0, now=0)
    q.push(job(2), 0, 0, now=1 * MS)
    q.push(job(3), 3, 0, now=1 * MS)
    assert q.expire(now=5 * MS) == []
    # As Triton's PriorityQueue: the expired level-2 request runs after the on-time level-2
    # one, still ahead of level 3.
    assert tags(q) == [2, 1, 3]
    assert len(q) == 3


async def test_request_timeout_overrides_only_when_allowed() -> None:
    strict = queue(l2=QueuePolicy(default_timeout_ns=50 * MS))
    strict.push(job(1), 0, timeout_us=1000, now=0)
    assert strict.next_deadline() == 50 * MS
    lenient = queue(l2=QueuePolicy(default_timeout_ns=50 * MS, allow_timeout_override=True))
    lenient.push(job(1), 0, timeout_us=1000, now=0)
    assert lenient.next_deadline() == 1 * MS
    no_default = queue(l2=QueuePolicy(allow_timeout_override=True))
    no_default.push(job(1), 0, timeout_us=2000, now=0)
    assert no_default.next_deadline() == 2 * MS


async def test_take_and_discard_keep_the_count() -> None:
    q = queue()
    jobs = [job(i) for i in range(4)]
    for j in jobs:
        q.push(j, 0, 0, now=0)
    q.take(jobs[:2])
    q.discard(jobs[3])
    assert tags(q) == [2]
    assert len(q) == 1
    assert [int(j.inputs["x"][0, 0]) for j in q.drain()] == [2]
    assert len(q) == 0


async def test_overdue_jobs_leave_the_queue_whatever_their_level() -> None:
    q = queue()
    q.push(job(1), 1, 0, now=0, overdue_at=50 * MS)
    q.push(job(2), 3, 0, now=0, overdue_at=20 * MS)
    q.push(job(3), 0, 0, now=0)  # no overload deadline
    assert q.next_deadline() == 20 * MS
    assert q.overdue(19 * MS) == []
    assert [int(j.inputs["x"][0, 0]) for j in q.overdue(20 * MS)] == [2]
    assert tags(q) == [1, 3]
    assert len(q) == 2
    assert q.next_deadline() == 50 * MS


async def test_a_job_that_ran_is_never_overdue() -> None:
    q = queue()
    first = job(1)
    q.push(first, 0, 0, now=0, overdue_at=10 * MS)
    q.take([first])
    assert q.overdue(11 * MS) == []
    assert q.next_deadline() == 0
