"""What every scheduler of a model version shares: its instances, start, drain and stop."""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Sequence

from appliance.errors import ServerUnavailable
from appliance.scheduling.instances import InstanceWorker, Job
from appliance.scheduling.precise_timer import PreciseHandle
from appliance.scheduling.stats import ModelStats


class SchedulerBase:
    """Instances on worker threads, and the drain protocol used when a version retires."""

    def __init__(self, label: str, workers: list[InstanceWorker], stats: ModelStats) -> None:
        self._label = label  # "model 'x' version 1", for messages
        self._workers = workers
        self._idle: deque[InstanceWorker] = deque(workers)
        self._stats = stats
        self._closing = False
        self._drained: asyncio.Event | None = None
        self._timer: asyncio.TimerHandle | PreciseHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        for worker in self._workers:
            worker.start(self._loop)

    @property
    def pending(self) -> int:
        """Requests waiting for an instance (Triton's nv_inference_pending_request_count)."""
        raise NotImplementedError

    @property
    def busy(self) -> bool:
        return bool(self.pending) or len(self._idle) < len(self._workers)

    def _take_queued(self) -> list[Job]:
        """Remove and return every job still waiting."""
        raise NotImplementedError

    def _refuse_if_closing(self) -> None:
        if self._closing:
            raise ServerUnavailable(f"{self._label} is unloading; retry")

    def _notify_if_drained(self) -> None:
        if self._drained is not None and not self.busy:
            self._drained.set()

    async def drain(self, timeout_s: float) -> None:
        """Refuse new work, wait for queued and running jobs up to timeout_s, then fail the rest."""
        self._closing = True
        if self.busy:
            self._drained = asyncio.Event()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._drained.wait(), timeout_s)
        for job in self._take_queued():
            if not job.future.done():
                job.future.set_exception(ServerUnavailable(f"{self._label} was unloaded"))
        if self._timer is not None:
            self._timer.cancel()

    def health(self, now_ns: int, stuck_ns: int) -> str:
        """Why this version cannot make progress ('' when it can); see appliance/notify.py."""
        if self._closing or self._loop is None:
            return ""
        states = [(w.alive, w.busy_since_ns) for w in self._workers]
        return stalled_reason(self._label, states, now_ns, stuck_ns)

    def stop_workers(self) -> None:
        """Blocking: join the worker threads and close instances (call from a thread)."""
        for worker in self._workers:
            worker.stop()


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
