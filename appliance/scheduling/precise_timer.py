"""Sub-millisecond wake-ups for an event loop, whose own timers round up to a millisecond.

asyncio's selector and libuv (uvloop) both wait in whole milliseconds, so `call_later(0.0001)`
fires after 1 ms or more: a `max_queue_delay_microseconds: 100` batching window would hold a
lone request ten times longer than configured. Short windows go to one shared thread instead,
which waits on a condition variable (microsecond timeouts) and hands the callback to the loop.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import threading
import time
from collections.abc import Callable

# Waits at least this long use the loop's own timer: a millisecond of rounding is under 50 %.
LOOP_TIMER_MIN_NS = 2_000_000


class PreciseHandle:
    __slots__ = ("cancelled",)

    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


_Entry = tuple[int, int, PreciseHandle, asyncio.AbstractEventLoop, Callable[[], None]]


class _PreciseTimers:
    def __init__(self) -> None:
        self._heap: list[_Entry] = []
        self._order = itertools.count()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def call_at(
        self, loop: asyncio.AbstractEventLoop, at_ns: int, callback: Callable[[], None]
    ) -> PreciseHandle:
        """Run `callback` on `loop` at monotonic time `at_ns` (time.monotonic_ns)."""
        handle = PreciseHandle()
        with self._cond:
            heapq.heappush(self._heap, (at_ns, next(self._order), handle, loop, callback))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="precise-timers", daemon=True
                )
                self._thread.start()
            self._cond.notify()
        return handle

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._heap:
                    self._cond.wait()
                at_ns, _, handle, loop, callback = self._heap[0]
                wait_ns = at_ns - time.monotonic_ns()
                if wait_ns > 0:
                    self._cond.wait(wait_ns / 1e9)
                    continue  # re-check: an earlier timer may have arrived
                heapq.heappop(self._heap)
            if not handle.cancelled and not loop.is_closed():
                loop.call_soon_threadsafe(_unless_cancelled, handle, callback)


def _unless_cancelled(handle: PreciseHandle, callback: Callable[[], None]) -> None:
    if not handle.cancelled:
        callback()


TIMERS = _PreciseTimers()
