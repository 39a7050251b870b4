"""The one thread that fails a model process's decoupled requests that never sent their final
flag (edge_backends/python/deadlines.py)."""

from __future__ import annotations

import threading
import time

from edge_backends.python.deadlines import SLACK, Deadlines


def test_a_deadline_not_ended_in_time_is_late_once_on_its_own_thread() -> None:
    deadlines = Deadlines(0.05)
    called: list[str] = []
    fired = threading.Event()

    def late() -> None:
        called.append(threading.current_thread().name)
        fired.set()

    started = time.monotonic()
    deadline = deadlines.set(late)
    assert fired.wait(5)
    assert time.monotonic() - started >= 0.05
    deadlines.end(deadline)  # the request's own end after it was failed: nothing more
    time.sleep(0.1)
    assert called == ["stream-deadlines"]


def test_a_deadline_ended_in_time_is_never_late() -> None:
    deadlines = Deadlines(0.05)
    called: list[int] = []
    for i in range(3):
        deadlines.end(deadlines.set(lambda i=i: called.append(i)))
    kept = threading.Event()
    deadlines.set(kept.set)  # a later one that is due: the ones before it were passed over
    assert kept.wait(5)
    assert called == []


def test_ended_deadlines_do_not_pile_up() -> None:
    deadlines = Deadlines(3600.0)
    live = [deadlines.set(lambda: None) for _ in range(10)]
    for _ in range(10_000):
        deadlines.end(deadlines.set(lambda: None))
    assert len(deadlines) <= len(live) + SLACK + 1
    for deadline in live:
        deadlines.end(deadline)
    assert len(deadlines) <= SLACK + 1


def test_a_live_deadline_survives_compaction_while_it_is_awaited() -> None:
    deadlines = Deadlines(0.3)
    fired = threading.Event()
    deadlines.set(fired.set)
    time.sleep(0.05)  # the thread now waits for it
    for _ in range(5 * SLACK):  # compacts the FIFO under the waiting thread
        deadlines.end(deadlines.set(lambda: None))
    assert fired.wait(5)
