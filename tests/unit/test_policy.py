"""The dynamic batcher's pure decisions."""

from __future__ import annotations

import pytest

from appliance.scheduling.policy import BatchPolicy, Decision, admission_wait_ns, next_batch

DYNAMIC = BatchPolicy(max_batch_size=8, dynamic=True, max_queue_delay_ns=1_000_000)


def same(*sizes: int) -> list[tuple[int, tuple[int, ...]]]:
    return [(s, (16,)) for s in sizes]


def test_empty_queue_does_nothing() -> None:
    assert next_batch([], 0, DYNAMIC) == Decision()


def test_without_dynamic_batching_each_request_runs_alone() -> None:
    policy = BatchPolicy(max_batch_size=8, dynamic=False)
    assert next_batch(same(1, 1, 1), 0, policy) == Decision(run=1)


def test_model_without_batching_runs_one_request() -> None:
    policy = BatchPolicy(max_batch_size=0, dynamic=True)
    assert next_batch(same(1, 1), 0, policy) == Decision(run=1)


def test_waits_for_more_until_the_queue_delay() -> None:
    assert next_batch(same(1, 1), 400_000, DYNAMIC) == Decision(wait_ns=600_000)


def test_runs_everything_once_the_delay_expired() -> None:
    assert next_batch(same(1, 2, 1), 1_000_000, DYNAMIC) == Decision(run=3)


def test_zero_delay_runs_what_is_queued_at_once() -> None:
    policy = BatchPolicy(max_batch_size=8, dynamic=True)
    assert next_batch(same(1, 1), 0, policy) == Decision(run=2)


def test_full_batch_runs_without_waiting() -> None:
    assert next_batch(same(4, 4, 1), 0, DYNAMIC) == Decision(run=2)


def test_request_that_would_overflow_closes_the_batch() -> None:
    assert next_batch(same(5, 4), 0, DYNAMIC) == Decision(run=1)


def test_different_shapes_never_share_a_batch() -> None:
    queued = [(1, (16,)), (1, (16,)), (1, (8,)), (1, (16,))]
    assert next_batch(queued, 0, DYNAMIC) == Decision(run=2)


def test_head_shape_mismatch_still_runs_the_head() -> None:
    queued = [(1, (8,)), (1, (16,))]
    assert next_batch(queued, 0, DYNAMIC) == Decision(run=1)


@pytest.mark.parametrize(
    ("sizes", "run"),
    [((1, 1), 2), ((1, 1, 1), 2), ((2, 2), 4 // 2)],
)
def test_preferred_size_runs_at_once(sizes: tuple[int, ...], run: int) -> None:
    policy = BatchPolicy(
        max_batch_size=8, dynamic=True, preferred_batch_sizes=(2, 4), max_queue_delay_ns=10**9
    )
    assert next_batch(same(*sizes), 0, policy) == Decision(run=run)


def test_largest_reached_preferred_size_wins() -> None:
    policy = BatchPolicy(
        max_batch_size=8, dynamic=True, preferred_batch_sizes=(2, 4), max_queue_delay_ns=10**9
    )
    assert next_batch(same(1, 1, 1, 1, 1), 0, policy) == Decision(run=4)


def test_batch_stops_growing_at_the_largest_preferred_size() -> None:
    policy = BatchPolicy(max_batch_size=8, dynamic=True, preferred_batch_sizes=(2,))
    assert next_batch(same(1, 1, 1, 1, 1, 1), 0, policy) == Decision(run=2)


def test_request_larger_than_the_preferred_size_still_runs() -> None:
    policy = BatchPolicy(max_batch_size=8, dynamic=True, preferred_batch_sizes=(2,))
    assert next_batch(same(3, 1), 0, policy) == Decision(run=1)


def test_admission_lets_one_running_and_one_waiting_request_per_instance_in() -> None:
    # 2 instances, 1 s per request, a 10 ms bound: 3 ahead would wait 1.5 s, but 3 < 2 x 2.
    assert admission_wait_ns(ahead=3, instances=2, request_ns=1e9, max_wait_ns=10_000_000) == 0


def test_admission_refuses_when_the_queued_work_exceeds_the_bound() -> None:
    # 40 ahead on 2 instances at 1 ms each: 20 ms of work against a 10 ms bound.
    wait = admission_wait_ns(ahead=40, instances=2, request_ns=1e6, max_wait_ns=10_000_000)
    assert wait == 20_000_000
    assert admission_wait_ns(ahead=40, instances=2, request_ns=1e6, max_wait_ns=30_000_000) == 0


def test_admission_is_off_without_a_bound_or_a_measurement() -> None:
    assert admission_wait_ns(ahead=1000, instances=1, request_ns=1e9, max_wait_ns=0) == 0
    assert admission_wait_ns(ahead=1000, instances=1, request_ns=0.0, max_wait_ns=1) == 0
