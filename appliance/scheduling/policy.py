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
    """Decide the next batch from queued (batch size, shape key) pairs, oldest first, by the
    rules of Triton's dynamic batcher (core's `DynamicBatchScheduler::GetDynamicBatch`).

    The pending batch takes requests in order while their non-batch shapes equal the first
    request's and the total stays within max_batch_size. The preferred sizes (default:
    max_batch_size alone) are preferences, not caps:

    - the preferred batch is the longest prefix whose total is a preferred size, or, where none
      is, the prefix before the request that takes the total past the largest preferred size;
    - while the oldest request has waited less than max_queue_delay, a preferred batch runs at
      once;
    - once it has waited that long, everything pending runs, up to max_batch_size (so under
      load, with every instance busy for longer than the delay, batches grow past the
      preferred sizes);
    - otherwise the pending batch runs when it cannot grow (the next request does not fit or
      has another shape), reaches the largest preferred size, or there is no delay; else wait
      for the rest of the delay.
    """
    if not queued:
        return Decision()
    if not policy.dynamic or policy.max_batch_size == 0:
        return Decision(run=1)
    preferred = policy.preferred_batch_sizes or (policy.max_batch_size,)
    largest = max(preferred)
    head_key = queued[0][1]
    total = 0
    count = 0
    best = 0  # request count of the preferred batch (0: none found)
    full = False  # the pending batch cannot grow
    for size, key in queued:
        size = max(1, size)
        if count:
            if not best and total + size > largest:
                best = count
            if total + size > policy.max_batch_size or key != head_key:
                full = True
                break
        total += size
        count += 1
        if total in preferred:
            best = count
    delay_ns = policy.max_queue_delay_ns
    waited_long = delay_ns > 0 and oldest_wait_ns >= delay_ns
    if best and not waited_long:
        return Decision(run=best)
    if full or total >= largest or waited_long or not delay_ns:
        return Decision(run=count)
    return Decision(wait_ns=delay_ns - oldest_wait_ns)


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


def queue_wait_bound_ns(
    max_wait_ns: int, executions: int, execution_ns: float, delay_ns: int = 0
) -> int:
    """Pure: the queue-wait bound admission applies (0: none).

    `max_wait_ns` alone when `executions` is 0 (a bound the operator set). Otherwise (the
    default) the longer of `max_wait_ns` and `executions` of the model's measured executions
    (`execution_ns`: one batch, from the hand-over to its instance to the result back), so
    that the bound grows with the model: any queue that the instances drain within that many
    executions of their own is served, as tritonserver would serve it (a burst of concurrent
    slow requests, a closed loop of clients), and only a queue longer than that, which only an
    overload builds, is refused. The default adds `delay_ns`, the model's configured
    `max_queue_delay_microseconds`: a request the batcher holds for a batch that does not fill
    is waiting as configured, not overloaded (Triton's L0_optional_input waits 5 s so)."""
    if not max_wait_ns or not executions:
        return max_wait_ns
    return max(max_wait_ns, int(executions * execution_ns)) + max(0, delay_ns)
