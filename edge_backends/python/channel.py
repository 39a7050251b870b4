"""The model process's ends of its pipe and its link to the server.

A model sends from several threads at once: its execute thread, response-sender threads
(decoupled responses), asyncio's executor threads (`async_exec`), and any thread that updates
a custom metric. Every send on the pipe holds one lock, so messages never interleave. Calls
(BLS, metrics, model loading) carry an id; one reader thread takes every message the server
sends on the pipe and hands each reply to the caller waiting for that id, and a cancel to
`on_cancel`.

The request path has a link of its own (`Link`: a pipe in, two pipes out, no reader thread
on either side): the server writes ("execute", arena, metas, outputs, tag or None, request
infos as tuples, on_loop) or ("finalize",); the model process's main thread reads it and
answers ("result", arena, metas, errors) | ("failed", text[, code]) (each request's outputs
named "<index>:<name>", `errors` the (index, text, code) of requests whose response is an
error), or for a decoupled request ("returned", tag) once execute() returned. It answers on
the pipe the request named: `on_loop`, the one the server's event loop watches (the loop
started the execution), else the one the server's thread that sent it reads itself. While
its execute() runs, the main thread's BLS `infer` and metric calls go over the link too,
("call", id, operation, arguments) answered ("reply", id, ok, payload) on the pipe in: no
thread hand-off on either side, where the pipe with a reader thread each side took four
wake-ups a request.

The pipe (`Channel`) carries the rest, from any thread: ("ready", None) | ("error", text)
after initialize; a decoupled request's ("stream_response", tag, outputs)... and
("stream_done", tag) | ("stream_failed", tag, text, code) whenever they come; calls from
other threads (async_exec, response-sender threads) and every other call; ("log", level,
text). Server -> model process: ("cancel", tag); ("reply", id, ok, payload) ends call `id`;
("item", id, outputs) is one response of a streamed call; ("is_ready", id) asks the
model's is_ready(), answered ("readiness", id, ready, error text or None) from a thread of
its own.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import pickle
import queue
import select
import struct
import threading
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from typing import Any

GONE = "the server closed its connection to this model process"
# A BLS stream's responses taken between two grants of more to the server (a half of
# backend.STREAM_WINDOW: the server never waits on a model that keeps reading).
CREDIT_BATCH = 16


# The calls the main thread makes over the link while its execute() runs (the instance thread
# answers them inline); any other goes over the pipe to the server's call pool.
LINK_CALLS = ("infer", "metric_op", "metric_family", "metric_new")
_HEADER = struct.Struct("<I")
_CHUNK = 1 << 16


class Link:
    """Pickled messages, each after its length, over pipes: read from `reader` by one thread
    at a time (the caller, no reader thread), written under a lock to one of `writers` (the
    model process answers the server on the pipe the request asked for, `route`). A pipe's
    round trip costs about half of a socket pair's."""

    def __init__(self, reader: Connection | None, *writers: Connection) -> None:
        self._ends = (reader, *writers)  # hold the descriptors open
        self._fd = reader.fileno() if reader is not None else -1
        self._writers = [writer.fileno() for writer in writers]
        self._out = self._writers[0] if writers else -1
        self._buffer = bytearray()
        self._lock = threading.Lock()
        self.closed = False
        # The kinds of message `recv` may give again as the same object when their bytes are
        # those of the last one (the model process's execute messages mostly repeat: unpickling
        # one costs 1 us); the reader must not change what it is given.
        self.memo: tuple[str, ...] = ()
        self._last: tuple[bytes, Any] = (b"", None)
        self._poller = select.poll()
        if reader is not None:
            self._poller.register(self._fd, select.POLLIN)

    def route(self, index: int) -> None:
        """Send on writer `index` from now on."""
        self._out = self._writers[index]

    @staticmethod
    def frame(*message: Any) -> bytes:
        """A message as `send` writes it (a sender may keep it to send again)."""
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        return _HEADER.pack(len(data)) + data

    def send(self, *message: Any) -> None:
        self.send_frame(self.frame(*message))

    def send_frame(self, frame: bytes) -> None:
        """Write a message `frame` made."""
        view = memoryview(frame)
        with self._lock:
            if self.closed:  # its descriptor's number may be another file's by now
                raise BrokenPipeError("the link is closed")
            while view:
                view = view[os.write(self._out, view) :]

    def poll(self, timeout_s: float) -> bool:
        """Whether a message (or the other side's end) is there to read within `timeout_s`."""
        return len(self._buffer) > 0 or bool(self._poller.poll(timeout_s * 1000))

    def recv(self) -> Any:
        """The next message; EOFError once the other side is gone."""
        buffer = self._buffer
        while True:
            if len(buffer) >= 4:
                (size,) = _HEADER.unpack_from(buffer)
                end = 4 + size
                if len(buffer) >= end:
                    message = pickle.loads(bytes(buffer[4:end]))
                    del buffer[:end]
                    return message
            else:
                end = 4 + _CHUNK
            chunk = os.read(self._fd, max(_CHUNK, end - len(buffer)))
            if not chunk:
                raise EOFError
            if not buffer and len(chunk) >= 4:  # the usual case: one whole message
                (size,) = _HEADER.unpack_from(chunk)
                if len(chunk) == 4 + size:
                    if not self.memo:
                        return pickle.loads(memoryview(chunk)[4:])
                    if chunk == self._last[0]:
                        return self._last[1]
                    message = pickle.loads(memoryview(chunk)[4:])
                    if message[0] in self.memo:
                        self._last = (chunk, message)
                    return message
            buffer += chunk

    def fileno(self) -> int:
        return self._fd

    def feed(self) -> None:
        """One read of what is there (call it only when the descriptor is readable: the
        server's event loop reads the link this way); EOFError once the other side is gone."""
        chunk = os.read(self._fd, _CHUNK)
        if not chunk:
            raise EOFError
        self._buffer += chunk

    def take(self) -> Any:
        """The next whole message `feed` read, or None: no read."""
        buffer = self._buffer
        if len(buffer) < 4:
            return None
        (size,) = _HEADER.unpack_from(buffer)
        end = 4 + size
        if len(buffer) < end:
            return None
        message = pickle.loads(memoryview(buffer)[4:end])
        del buffer[:end]
        return message

    def close(self) -> None:
        with self._lock:  # never under a send: another thread may answer a call on it
            self.closed = True
            for end in self._ends:
                if end is not None:
                    end.close()


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

    def __init__(self, connection: Connection, link: Link | None = None) -> None:
        self._connection = connection
        self.link = link
        # The thread whose execute() is in hand while the server waits on the link (its
        # calls in LINK_CALLS go there); None between requests.
        self.link_owner: int | None = None
        self._send_lock = threading.Lock()
        self._calls: dict[int, queue.SimpleQueue[Any]] = {}
        self._calls_lock = threading.Lock()
        self._closed = False
        self.ids = itertools.count(1)
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

    def finish(self, *message: Any) -> None:
        """An execution's answer, over the link: the server takes the next request after it."""
        self.link_owner = None
        assert self.link is not None
        self.link.send(*message)

    def finish_frame(self, frame: bytes) -> None:
        """`finish` with a message Link.frame made."""
        self.link_owner = None
        assert self.link is not None
        self.link.send_frame(frame)

    def call(self, operation: str, *arguments: Any) -> Any:
        """Send a call and wait for its reply: the payload, or CallFailed."""
        link = self.link
        if (
            link is not None
            and self.link_owner == threading.get_ident()
            and operation in LINK_CALLS
        ):
            try:
                link.send("call", next(self.ids), operation, *arguments)
                _, _, ok, payload = link.recv()
            except (EOFError, OSError):
                raise CallFailed(GONE) from None
        else:
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
        except (EOFError, OSError):
            pass
        finally:
            with self._calls_lock:
                self._closed = True
                waiting = list(self._calls.values())
            for replies in waiting:
                replies.put(("reply", (False, GONE)))


_current: Channel | None = None  # this model process's channel, once connected


def connect(channel: Channel | None) -> None:
    global _current
    _current = channel


def current() -> Channel | None:
    """The model process's channel to the server; None outside one (e.g. auto-complete)."""
    return _current
