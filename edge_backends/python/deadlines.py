"""One thread for the deadlines of a model process's decoupled requests.

A decoupled request that has not sent its final flag within its time is failed (worker.py's
`_Stream`). A `threading.Timer` per request would start a thread per request: about 65 us of
CPU each here, more than a small response costs to send. All requests of a process have the
same time allowed, so their deadlines come in the order they were set: a FIFO of them, read
by one thread that sleeps until the oldest is due, is all it takes. A request that ended is
only marked; the FIFO is compacted once it holds more ended requests than live ones, so that
it stays bounded by the requests still going on, whatever their rate.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

# Ended entries tolerated in the FIFO beyond the live ones before it is compacted.
SLACK = 64


class Deadline:
    """One request's: `late` is called once, on the deadlines' thread, unless `end` came
    first."""

    __slots__ = ("at", "ended", "late")

    def __init__(self, at: float, late: Callable[[], None]) -> None:
        self.at = at
        self.late = late
        self.ended = False


class Deadlines:
    """Deadlines `after_s` from when each is set, watched by one daemon thread (started with
    the first)."""

    def __init__(self, after_s: float) -> None:
        self.after_s = after_s
        self._queue: deque[Deadline] = deque()
        self._ended = 0  # ended entries still in `_queue`
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None

    def set(self, late: Callable[[], None]) -> Deadline:
        deadline = Deadline(time.monotonic() + self.after_s, late)
        with self._wake:
            if not self._queue:
                self._wake.notify()  # the thread waits for a first deadline
            self._queue.append(deadline)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._watch, name="stream-deadlines", daemon=True
                )
                self._thread.start()
        return deadline

    def end(self, deadline: Deadline) -> None:
        """The request ended in time: its `late` is never called."""
        with self._wake:
            if deadline.ended:
                return
            deadline.ended = True
            self._ended += 1
            if self._ended > len(self._queue) - self._ended + SLACK:
                self._queue = deque(d for d in self._queue if not d.ended)
                self._ended = 0

    def __len__(self) -> int:
        """Entries held (live and ended ones not compacted yet)."""
        return len(self._queue)

    def _watch(self) -> None:
        while True:
            with self._wake:
                due = self._next_due()
            due.late()

    def _next_due(self) -> Deadline:
        """Under `_wake`: the oldest live deadline once it is due, taken (and ended). The
        FIFO is looked up again after each wait: `end` may have compacted it meanwhile."""
        while True:
            queue = self._queue
            while queue and queue[0].ended:
                queue.popleft()
                self._ended -= 1
            if not queue:
                self._wake.wait()
                continue
            wait_s = queue[0].at - time.monotonic()
            if wait_s <= 0:
                due = queue.popleft()
                due.ended = True
                return due
            self._wake.wait(wait_s)
