"""The dynamic batcher's pure decisions."""

from __future__ import annotations

import pytest

from appliance.scheduling.policy import (
    BatchPolicy,
    Decision,
    admission_wait_ns,
    next_batch,
    overdue_after_ns,
    predicted_wait_ns,
)

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


PREFER_2 = BatchPolicy(
    max_batch_size=8, dynamic=True, preferred_batch_sizes=(2,), max_queue_delay_ns=1_000_000
)


def test_preferred_sizes_are_not_caps_once_the_oldest_waited_the_delay() -> None:
    """Triton's rule: within the delay the preferred batch runs at once; once the oldest
    request has waited max_queue_delay, everything pending runs up to max_batch_size (what a
    queue that built up behind a busy instance gets)."""
    assert next_batch(same(1, 1, 1, 1, 1, 1), 999_999, PREFER_2) == Decision(run=2)
    assert next_batch(same(1, 1, 1, 1, 1, 1), 1_000_000, PREFER_2) == Decision(run=6)
    # Never past max_batch_size: 10 queued, 8 run.
    assert next_batch(same(*[1] * 10), 5_000_000, PREFER_2) == Decision(run=8)
    # Sizes that skip every preferred size: 3 + 3 + 2 = 8.
    assert next_batch(same(3, 3, 2, 1), 2_000_000, PREFER_2) == Decision(run=3)


def test_without_a_delay_the_largest_preferred_size_caps_the_batch() -> None:
    """No max_queue_delay: the delay is never 'exceeded', so Triton keeps to the preferred
    batch however long the queue."""
    policy = BatchPolicy(max_batch_size=8, dynamic=True, preferred_batch_sizes=(2, 4))
    assert next_batch(same(*[1] * 8), 10**9, policy) == Decision(run=4)


def test_the_preferred_batch_stops_before_the_request_that_overshoots() -> None:
    """No prefix is a preferred size: the batch within the largest preferred size runs (3 of
    preferred 4, not 3 + 2), until the delay has passed."""
    policy = BatchPolicy(
        max_batch_size=8, dynamic=True, preferred_batch_sizes=(4,), max_queue_delay_ns=1_000
    )
    assert next_batch(same(3, 2), 0, policy) == Decision(run=1)
    assert next_batch(same(3, 2), 1_000, policy) == Decision(run=2)


def test_a_preferred_batch_goes_before_a_shape_change() -> None:
    queued = [(1, (16,)), (1, (16,)), (1, (16,)), (1, (8,))]
    assert next_batch(queued, 0, PREFER_2) == Decision(run=2)
    assert next_batch(queued, 1_000_000, PREFER_2) == Decision(run=3)


def test_below_the_preferred_sizes_waits_for_the_delay() -> None:
    policy = BatchPolicy(
        max_batch_size=8, dynamic=True, preferred_batch_sizes=(4,), max_queue_delay_ns=1_000
    )
    assert next_batch(same(1, 1), 400, policy) == Decision(wait_ns=600)
    assert next_batch(same(1, 1), 1_000, policy) == Decision(run=2)


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


def test_admission_counts_the_time_the_request_already_spent_arriving() -> None:
    # 4 ahead at 100 ms on one instance: 400 ms of work, within a 1 s bound...
    assert admission_wait_ns(ahead=4, instances=1, request_ns=1e8, max_wait_ns=10**9) == 0
    # ...but not after 700 ms spent reading and decoding the body: 1.1 s in all.
    wait = admission_wait_ns(
        ahead=4, instances=1, request_ns=1e8, max_wait_ns=10**9, waited_ns=700_000_000
    )
    assert wait == 1_100_000_000


def test_a_request_that_arrived_slowly_is_still_admitted_behind_one_per_instance() -> None:
    # Refusing it would save its client nothing: it has waited already, and runs next.
    wait = admission_wait_ns(
        ahead=1, instances=1, request_ns=1e8, max_wait_ns=10**9, waited_ns=5 * 10**9
    )
    assert wait == 0


def test_an_admitted_request_is_overdue_a_margin_past_the_bound() -> None:
    # Admitted within a 1 s bound at 100 ms per request: refused after 1.25 s without a start
    # (a quarter of the bound, more than one execution).
    after = overdue_after_ns(ahead=5, instances=1, request_ns=1e8, max_wait_ns=10**9)
    assert after == 1_250_000_000
    # At 400 ms per request, one execution is the longer margin.
    after = overdue_after_ns(ahead=2, instances=1, request_ns=4e8, max_wait_ns=10**9)
    assert after == 1_400_000_000


def test_an_always_admitted_request_is_overdue_one_execution_past_its_predicted_wait() -> None:
    # 1 ahead at 2 s per request, a 1 ms bound: admitted to wait 2 s; overdue after 4 s.
    assert overdue_after_ns(ahead=1, instances=1, request_ns=2e9, max_wait_ns=10**6) == 4 * 10**9


def test_no_overdue_limit_without_a_bound_or_a_measurement() -> None:
    assert overdue_after_ns(ahead=9, instances=1, request_ns=1e8, max_wait_ns=0) == 0
    assert overdue_after_ns(ahead=9, instances=1, request_ns=0.0, max_wait_ns=10**9) == 0


def test_the_predicted_wait_leaves_out_what_the_running_requests_have_done() -> None:
    # A batch of 2 at 100 ms a request, 150 ms into its run, and 2 queued: 250 ms of work left.
    assert predicted_wait_ns(ahead=4, instances=1, request_ns=1e8, done_ns=1.5e8) == 2.5e8
    # 5 ahead at 100 ms with 300 ms of it done: 200 ms left, within a 300 ms bound.
    assert admission_wait_ns(5, 1, 1e8, max_wait_ns=300_000_000, done_ns=3e8) == 0
    assert admission_wait_ns(5, 1, 1e8, max_wait_ns=300_000_000) == 5e8
