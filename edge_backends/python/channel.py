"""The model process's end of its pipe to the server, safe for any number of threads.

A model sends from several threads at once: its execute thread (results), response-sender
threads (decoupled responses), asyncio's executor threads (`async_exec`), and any thread that
updates a custom metric. Every send holds one lock, so messages never interleave. Calls (BLS,
metrics, model loading) carry an id; one reader thread takes every message from the server and
hands each reply to the caller waiting for that id, and everything else (execute, finalize)
to the process's main loop through `commands`.

Messages, model process -> server: ("ready", None) | ("error", text) after initialize;
("result", arena, metas, errors) | ("failed", text[, code]) for an execution (each request's
outputs named "<index>:<name>", `errors` the (index, text, code) of requests whose response
is an error), or for a decoupled request `tag`: ("returned", tag) once execute() returned,
then ("stream_response", tag, outputs)... and ("stream_done", tag) | ("stream_failed", tag,
text, code) whenever they come; ("call", id, operation, arguments). Server -> model process:
("execute", arena, metas, outputs, tag or None, request infos) | ("finalize",) |
("cancel", tag); ("reply", id, ok, payload) ends call `id`; ("item", id, outputs) is one
response of a streamed call; ("is_ready", id) asks the model's is_ready(), answered
("readiness", id, ready, error text or None) from a thread of its own.
"""

from __future__ import annotations

import contextlib
import itertools
import queue
import threading
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from typing import Any

GONE = "the server closed its connection to this model process"
# A BLS stream's responses taken between two grants of more to the server (a half of
# backend.STREAM_WINDOW: the server never waits on a model that keeps reading).
CREDIT_BATCH = 16


class CallFailed(Exception):
    """The server answered a call with an error; the message is the server's."""


class Stream:
    """The responses of one streamed call (BLS to a decoupled model), in order."""

    def __init__(self, channel: Channel, call_id: int, replies: queue.SimpleQueue[Any]) -> None:
        self._channel = channel
        self._id = call_id
        self._replies = replies
        self._ended = False

    def __iter__(self) -> Iterator[Any]:
        """Each response's outputs; raises CallFailed when the call fails. The server sends
        at most backend.STREAM_WINDOW responses ahead of what is taken here: every
        CREDIT_BATCH taken, it is told it may send that many more."""
        taken = 0
        while not self._ended:
            kind, payload = self._replies.get()
            if kind == "item":
                taken += 1
                if taken == CREDIT_BATCH:
                    taken = 0
                    with contextlib.suppress(OSError, ValueError):  # the server is gone
                        self._channel.send(
                            "call", next(self._channel.ids), "credit", self._id, CREDIT_BATCH
                        )
                yield payload[0]
                continue
            self._ended = True
            self._channel.forget(self._id)
            ok, detail = payload
            if not ok:
                raise CallFailed(str(detail))

    def cancel(self) -> None:
        """Ask the server to stop the call; responses already sent may still arrive."""
        if not self._ended:
            self._channel.send("call", next(self._channel.ids), "cancel", self._id)


class Channel:
    """Sends under one lock; a reader thread routes the server's replies by call id."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        self._send_lock = threading.Lock()
        self._calls: dict[int, queue.SimpleQueue[Any]] = {}
        self._calls_lock = threading.Lock()
        self._closed = False
        self.ids = itertools.count(1)
        # What the main loop serves: ("execute", ...), ("finalize",); None once the server
        # is gone.
        self.commands: queue.SimpleQueue[tuple[Any, ...] | None] = queue.SimpleQueue()
        # ("cancel", tag): a decoupled request's client went away; told at once, even while
        # the main loop is in another execute().
        self.on_cancel: Callable[[int], None] = lambda tag: None
        # ("is_ready", id): the server asks the model's is_ready(); answered on another thread.
        self.on_is_ready: Callable[[int], None] = lambda call_id: None
        self._reader = threading.Thread(target=self._read, name="server-reader", daemon=True)
        self._reader.start()

    def send(self, *message: Any) -> None:
        with self._send_lock:
            self._connection.send(message)

    def call(self, operation: str, *arguments: Any) -> Any:
        """Send a call and wait for its reply: the payload, or CallFailed."""
        call_id, replies = self._open(operation, arguments)
        try:
            _, (ok, payload) = replies.get()
        finally:
            self.forget(call_id)
        if not ok:
            raise CallFailed(str(payload))
        return payload

    def stream(self, operation: str, *arguments: Any) -> Stream:
        """Send a call whose answer is any number of items, then the reply."""
        call_id, replies = self._open(operation, arguments)
        return Stream(self, call_id, replies)

    def _open(self, operation: str, arguments: tuple[Any, ...]) -> tuple[int, Any]:
        call_id = next(self.ids)
        replies: queue.SimpleQueue[Any] = queue.SimpleQueue()
        with self._calls_lock:
            if self._closed:
                raise CallFailed(GONE)
            self._calls[call_id] = replies
        try:
            self.send("call", call_id, operation, *arguments)
        except (OSError, ValueError):
            self.forget(call_id)
            raise CallFailed(GONE) from None
        return call_id, replies

    def forget(self, call_id: int) -> None:
        with self._calls_lock:
            self._calls.pop(call_id, None)

    def _read(self) -> None:
        try:
            while True:
                message = self._connection.recv()
                kind = message[0]
                if kind == "cancel":
                    self.on_cancel(message[1])
                elif kind == "is_ready":
                    self.on_is_ready(message[1])
                elif kind in ("reply", "item"):
                    with self._calls_lock:
                        replies = self._calls.get(message[1])
                    if replies is not None:  # else: a call its caller stopped waiting for
                        replies.put((kind, message[2:]))
                else:
                    self.commands.put(message)
        except (EOFError, OSError):
            pass
        finally:
            with self._calls_lock:
                self._closed = True
                waiting = list(self._calls.values())
            for replies in waiting:
                replies.put(("reply", (False, GONE)))
            self.commands.put(None)


_current: Channel | None = None  # this model process's channel, once connected


def connect(channel: Channel | None) -> None:
    global _current
    _current = channel


def current() -> Channel | None:
    """The model process's channel to the server; None outside one (e.g. auto-complete)."""
    return _current
