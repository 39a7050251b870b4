"""The one interface every scheduler of a model version implements (Triton's scheduler.h:
enqueue, in-flight count, stop).

The dynamic scheduler (which is also the direct one: a config without dynamic_batching sends
every request alone), the sequence scheduler and the ensemble scheduler implement it; the
runtime and the inference service see nothing else.
"""

from __future__ import annotations

from typing import Protocol

from appliance.common.types import Array
from appliance.scheduling.instances import Job


class ModelScheduler(Protocol):
    """Schedules the requests of one model version onto its instances."""

    def start(self) -> None:
        """Start the instances' threads (on the event loop)."""
        ...

    def admit(self) -> None:
        """Before a request is read: raise QueueFull at once when the work queued, executing
        and still arriving would keep it waiting past the bound (ServerUnavailable while
        stopping); otherwise count it as arriving until `arrived`."""
        ...

    def arrived(self) -> None:
        """An admitted request's job is being submitted, or it failed first: not arriving."""
        ...

    async def submit(self, job: Job) -> dict[str, Array]:
        """Run one validated request; its outputs, or an ApplianceError for the client."""
        ...

    def run_here(self, job: Job, inline: bool = False) -> dict[str, Array] | BaseException | None:
        """From a front end's thread (not the loop's): run the job there at once when an
        instance is free for it and nothing waits (its outputs, or the client's error), or
        None (not taken: `submit` it on the loop). Schedulers without such a lane: None.
        `inline`: the caller is the loop itself; taken only when the job would run inline."""
        ...

    @property
    def pending(self) -> int:
        """Requests waiting for an instance (Triton's nv_inference_pending_request_count)."""
        ...

    @property
    def in_flight(self) -> int:
        """Requests accepted and not yet answered: waiting or executing."""
        ...

    @property
    def open_sequences(self) -> int:
        """Sequences started and not ended (a sequence batcher's; 0 for the others): while
        any is open the version must stay loaded (runtime/on_demand.py)."""
        ...

    async def stop(self, timeout_s: float, reason: str) -> int:
        """Refuse new work, let in-flight requests finish within timeout_s, then fail the
        rest with `reason`; returns how many requests were failed."""
        ...

    def release(self, timeout_s: float) -> list[str]:
        """Blocking (call from a thread): end the instance threads, waiting at most timeout_s
        for each, and close the instances; the names of instances that did not end in time."""
        ...

    def health(self, now_ns: int, stuck_ns: int) -> str:
        """Why this version cannot make progress ('' when it can); see appliance/ops/notify.py."""
        ...
