"""Pure scheduling decisions: run a batch now or wait; admit a request or refuse it for
overload. No clocks, no I/O."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class BatchPolicy:
    """The dynamic batcher's settings, in Triton's names and units (converted to ns)."""

    max_batch_size: int  # 0: the model does not batch; every request runs alone
    dynamic: bool = False  # dynamic_batching present in the config
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_delay_ns: int = 0


@dataclass(frozen=True)
class Decision:
    """Run the first `run` queued requests now, or (run == 0) look again in `wait_ns`."""

    run: int = 0
    wait_ns: int = 0


def next_batch(
    queued: Sequence[tuple[int, Hashable]], oldest_wait_ns: int, policy: BatchPolicy
) -> Decision:
    """Decide the next batch from queued (batch size, shape key) pairs, oldest first.

    Requests join a batch only while their non-batch shapes equal the first request's and the
    total stays within max_batch_size. As in Triton, a batch stops growing at the largest
    preferred size when preferred sizes are given. A batch is sent at once when it cannot grow
    (full, or the next request does not fit) or reaches a preferred size; otherwise it waits
    until the oldest request has waited max_queue_delay.
    """
    if not queued:
        return Decision()
    if not policy.dynamic or policy.max_batch_size == 0:
        return Decision(run=1)
    head_key = queued[0][1]
    total = 0
    count = 0
    best_preferred = 0  # request count of the longest prefix whose size is preferred
    preferred = policy.preferred_batch_sizes
    limit = max(preferred) if preferred else policy.max_batch_size
    for size, key in queued:
        if key != head_key or total + size > policy.max_batch_size:
            return Decision(run=max(count, 1))  # cannot grow: send now
        total += size
        count += 1
        if total in preferred:
            best_preferred = count
        if total >= limit:
            return Decision(run=best_preferred or count)
    if best_preferred:
        return Decision(run=best_preferred)
    if oldest_wait_ns >= policy.max_queue_delay_ns:
        return Decision(run=count)
    return Decision(wait_ns=policy.max_queue_delay_ns - oldest_wait_ns)


def predicted_wait_ns(ahead: int, instances: int, request_ns: float, done_ns: float = 0.0) -> float:
    """Pure: how long a new request would wait for an instance: the work of the `ahead`
    requests at `request_ns` each, less `done_ns` (the execution time the executing ones have
    already had), shared by the instances."""
    return max(0.0, ahead * request_ns - done_ns) / max(1, instances)


def admission_wait_ns(
    ahead: int,
    instances: int,
    request_ns: float,
    max_wait_ns: int,
    waited_ns: int = 0,
    done_ns: float = 0.0,
) -> float:
    """Pure: the predicted wait of a new request when it is over `max_wait_ns`, else 0.

    `ahead`: requests queued or executing (at the front end, before the body is read, also the
    ones admitted and still arriving); `request_ns`: the learned execution time per request;
    `waited_ns`: the time the request already spent in the server before this decision
    (reading and decoding its body), so that the bound covers the whole wait from its arrival;
    `done_ns`: see `predicted_wait_ns`. One running and one waiting request per instance are
    always admitted, however slow the model and however long the request took to arrive (a
    slow model is not an overloaded one, and refusing a request that has already waited saves
    its client nothing)."""
    if not max_wait_ns or not request_ns or ahead < 2 * instances:
        return 0.0
    wait_ns = max(0, waited_ns) + predicted_wait_ns(ahead, instances, request_ns, done_ns)
    return wait_ns if wait_ns > max_wait_ns else 0.0


def overdue_after_ns(
    ahead: int, instances: int, request_ns: float, max_wait_ns: int, done_ns: float = 0.0
) -> int:
    """Pure: how long after its arrival an admitted request may wait for an instance before it
    is refused after all (0: no limit), for when the model slows down after the admission.

    The longer of the bound and the wait it was admitted with (the always-admitted requests
    may be predicted past the bound), plus a margin: one execution, or a quarter of the bound
    where that is longer. A prediction over a long queue of fast requests is a few percent off
    either way (measured at 4x the sustainable rate with a 7 ms model: with one execution of
    margin, 1% of the refusals were of admitted requests, after waiting 1 s); only a model
    that really slowed down should make an admitted request wait past the margin."""
    if not max_wait_ns or not request_ns:
        return 0
    predicted = predicted_wait_ns(ahead, instances, request_ns, done_ns)
    return int(max(max_wait_ns, predicted) + max(request_ns, max_wait_ns / 4))
