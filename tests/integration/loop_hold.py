"""Holding an embedded server's event loop busy, to show what runs without it or to keep a
window between two of its callbacks open."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from appliance import tritonserver


@contextmanager
def loop_held(server: tritonserver.Server, most_s: float = 30.0) -> Iterator[threading.Event]:
    """Nothing runs on `server`'s loop inside the block (at most `most_s`); yields the event
    set once the loop goes on again."""
    loop = server._require().loop
    assert loop is not None
    held, let_go, released = threading.Event(), threading.Event(), threading.Event()

    def hold() -> None:
        held.set()
        let_go.wait(most_s)
        released.set()

    loop.call_soon_threadsafe(hold)
    assert held.wait(10)
    try:
        yield released
    finally:
        let_go.set()
