"""The inference route on httptools; every other request of the connection goes to aiohttp.

`POST /v2/models/<model>[/versions/<version>]/infer` is most of what a device serves, and
aiohttp's web layer (its request and response objects, router, task per request and writer)
costs about 50 us of CPU per request here, more than a small model takes to run: measured
with wrk on one core, a canned answer costs 54-61 us per request through aiohttp and 8-9 us
through an asyncio protocol on httptools (docs/benchmarks/history.md, "The HTTP infer route").

So each connection is an `InferConnection`: httptools (llhttp, the parser uvicorn uses)
parses every request. An infer request with a plain body is answered here through the
`InferRoute` the front end gives (the same decoding, admission, limits, access checks and
errors as its aiohttp handler; the answer's head from heads.py). Anything else (other routes,
compressed bodies, percent-encoded names, HTTP/1.0, an upgrade) is relayed to a fresh aiohttp
protocol (relay.py's `RelayHandler`) on a transport that writes to this connection, re-framed
from what httptools parsed: its request
line and headers as they came, its body as it came (chunked bodies re-chunked, since httptools
hands them over decoded). aiohttp then answers it as it always did, with every route, limit
and error text unchanged. No HTTP is parsed by hand.

Requests of one connection are answered in order, one at a time, as aiohttp does: a request
pipelined behind one in progress waits, with reading held once more than PIPELINE_MAX_BYTES
wait (flow_control.py: reading held for named reasons). The connection enforces what
`GuardedRequestHandler` enforces for aiohttp's own connections (frontends/http/connections.py):
header and field sizes, the header, body and send stall timeouts, the keep-alive timeout and
the listener's connection limit.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import re
import threading
import zlib
from collections import deque
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

import httptools

from appliance.common.settings import HttpConnectionLimits
from appliance.frontends.http.flow_control import FlowControl
from appliance.frontends.http.heads import response_head
from appliance.frontends.http.relay import RelayHandler, RelayTransport
from appliance.ops.logs import RATE_LIMITED

log = logging.getLogger(__name__)

Buffer = bytes | bytearray | memoryview
Body = bytes | bytearray  # a request body as read

# Percent-encoded or otherwise unusual paths go to aiohttp's router, which decodes them.
_INFER_PATH = re.compile(rb"/v2/models/([^/?#%]+)(?:/versions/([0-9]+))?/infer")
# Request bodies from this size are read into one preallocated buffer (aiohttp's route in
# frontends/http/server.py too), and answers from this size go out from the output arrays:
# for big tensors each saved copy is a millisecond per 8 MB.
STREAMED_BYTES = 64 * 1024
# The read buffer httptools parses from: one per event loop thread, shared by its connections
# (a read is handed over as bytes before the loop does anything else), as uvloop's own is.
READ_BUFFER_BYTES = 256 * 1024
_READ_BUFFERS: dict[int, memoryview] = {}
# Bytes of requests pipelined behind the one in progress before the connection stops reading.
PIPELINE_MAX_BYTES = 1 << 20
# Compressing a few hundred bytes costs more than sending them, even off the device.
MIN_COMPRESSED_BYTES = 1024
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
TIMEOUT_ANSWER = b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"


@dataclass(slots=True)
class Reply:
    """An answer: its body in pieces (written without joining them)."""

    status: int
    content_type: bytes
    chunks: Sequence[Buffer]
    headers: tuple[tuple[bytes, bytes], ...] = ()


class InferRoute(Protocol):
    """What the front end does for an infer request (frontends/http/server.py)."""

    max_body_bytes: int

    def admit(self, model: str, version: str, headers: Mapping[str, str]) -> Any:
        """Before the body is read: an admission for `infer`, or a Reply refusing it."""
        ...

    def infer_reply(
        self,
        model: str,
        version: str,
        admission: Any,
        body: Body,
        headers: Mapping[str, str],
        raw_headers: Sequence[tuple[bytes, bytes]],
    ) -> Reply | Coroutine[Any, Any, Reply]:
        """The answer to a request whose body is in (errors included), or, when it cannot
        be answered at once, the coroutine that answers it. `raw_headers`: as they came
        (names as sent: header forwarding gives them to the model)."""
        ...

    def error(self, status: int, message: str) -> Reply:
        """Triton's error body."""
        ...


class _Message:
    """One request of the connection, from its first byte to its answer."""

    __slots__ = (
        "admission",
        "body",
        "chunked",
        "complete",
        "expects",
        "fields",
        "filled",
        "headers",
        "keep_alive",
        "model",
        "pending",
        "pending_bytes",
        "relay",
        "reply",
        "url",
        "version",
    )

    def __init__(self) -> None:
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []  # as they came
        self.fields: dict[str, str] = {}  # an infer request's, by lower-case name
        self.relay = False  # handed to aiohttp
        self.pending: list[bytes] = []  # a relayed request's bytes not yet given to aiohttp
        self.pending_bytes = 0
        self.chunked = False
        self.complete = False
        self.expects = False  # Expect: 100-continue, not yet answered
        self.keep_alive = True
        self.model = ""
        self.version = ""
        self.admission: Any = None
        self.reply: Reply | None = None  # decided before the body is in (a refusal)
        self.body: bytearray | list[bytes] = []
        self.filled = 0


def body_too_large(detail: str) -> str:
    """The refusal of a request body over --max-request-bytes: tritonserver's words first."""
    return (
        f"request JSON size exceeds the maximum allowed input size: {detail} (raise it with "
        "--max-request-bytes)"
    )


class ConnectionSet(Protocol):
    """The listener's view of its connections (connections.GuardedServer)."""

    limits: HttpConnectionLimits
    fast_connections: set[InferConnection]

    def relay_handler(self, on_finished: Callable[[bool], None]) -> RelayHandler: ...


class InferConnection(asyncio.BufferedProtocol):
    """One HTTP connection: infer requests answered here, the rest relayed to aiohttp.

    A buffered protocol: the transport reads into `get_buffer`'s memory. That is the loop's
    shared read buffer for httptools, except while a large infer body with a Content-Length arrives:
    then the socket is read straight into the request's own buffer (the one numpy views and
    the model get), with no copy in between (one 600 KB copy fewer per image than aiohttp's
    path, measured ~100 us); httptools starts afresh for the next request.
    """

    def __init__(
        self, owner: ConnectionSet, route: InferRoute, loop: asyncio.AbstractEventLoop
    ) -> None:
        self._owner = owner
        self._route = route
        self._loop = loop
        self._limits = owner.limits
        self._parser = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport | None = None
        self._messages: deque[_Message] = deque()  # parsed or being parsed, oldest first
        self._current: _Message | None = None  # the one being received
        self._active: _Message | None = None  # the one being answered
        self._task: asyncio.Task[None] | None = None
        self._relay: RelayHandler | None = None
        self._relay_transport: RelayTransport | None = None
        self._raw_relay = False  # after an upgrade: every byte goes to aiohttp
        self._relay_answered = False  # aiohttp wrote the active relayed request's answer
        self._flow = FlowControl()
        # A request that cannot be parsed, or a refusal answered before its body is sent.
        self._fatal: tuple[int, str] | Reply | None = None
        self._closing = False  # answer what is in progress, then close
        self._closed = asyncio.Event()
        now = loop.time()
        self._header_start: float | None = now  # a client that connects must send in time
        self._last_data = now
        self._idle_since: float | None = None
        self._read_buffer = _read_buffer()
        self._direct: _Message | None = None  # the message whose body is read straight in
        timeouts = [
            t
            for t in (
                self._limits.header_timeout_secs,
                self._limits.body_timeout_secs,
                self._limits.keepalive_timeout_secs,
            )
            if t > 0
        ]
        self._tick = max(0.05, min(timeouts) / 4) if timeouts else 0.0
        self._watch: asyncio.TimerHandle | None = None

    # ---- asyncio protocol --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass
        self._flow.transport = transport
        connections = self._owner.fast_connections
        connections.add(self)
        most = self._limits.max_connections
        if most and len(connections) > most:
            log.debug("refusing an HTTP connection: %d open", len(connections))
            body = b'{"error":"too many open HTTP connections"}'
            transport.write(response_head(503, b"application/json", len(body), (), False) + body)
            self._close()
            return
        if self._tick:
            self._watch = self._loop.call_at(self._loop.time() + self._tick, self._check)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._owner.fast_connections.discard(self)
        self._transport = self._flow.transport = None
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        if self._task is not None:  # the client is gone: its request is cancelled
            self._task.cancel()
        self._drop_waiting()
        self._detach_relay(exc)
        self._closed.set()

    def get_buffer(self, sizehint: int) -> memoryview:
        direct = self._direct
        if direct is not None:
            assert isinstance(direct.body, bytearray)
            return memoryview(direct.body)[direct.filled :]
        return self._read_buffer

    def buffer_updated(self, nbytes: int) -> None:
        direct = self._direct
        if direct is None:
            self.data_received(bytes(self._read_buffer[:nbytes]))
            return
        self._last_data = self._loop.time()
        direct.filled += nbytes
        assert isinstance(direct.body, bytearray)
        if direct.filled == len(direct.body):  # complete; httptools never saw the rest
            self._direct = None
            self._parser = httptools.HttpRequestParser(self)
            self._current = None
            direct.complete = True
            if self._active is None:
                self._pump()

    def data_received(self, data: bytes) -> None:
        now = self._loop.time()
        self._last_data = now
        if self._raw_relay:
            if self._relay is not None:
                self._relay.data_received(data)
            return
        if self._header_start is None and self._current is None:
            self._header_start = now
        try:
            self._parser.feed_data(data)
            current = self._current
            if current is not None and _reads_directly(current):
                self._direct = current  # the rest of its body goes straight into it
            if self._active is None:
                self._pump()  # answered here, after the parser returned
        except httptools.HttpParserUpgrade as upgrade:
            self._upgrade(data[int(upgrade.args[0]) :])
        except httptools.HttpParserCallbackError:  # a bug here, not the client's request
            log.exception("HTTP request handling failed", extra=RATE_LIMITED)
            self._fail(500, "internal error; see the server log")
            self._pump()
        except httptools.HttpParserError as exc:
            # The client's error: one line, rate-limited (as logs.ClientHttpErrors has aiohttp's).
            peer = self._transport.get_extra_info("peername") if self._transport else None
            log.info("malformed HTTP request: %s (400); from %s", exc, peer, extra=RATE_LIMITED)
            self._fail(400, f"bad HTTP request: {exc}")
            self._pump()

    def eof_received(self) -> bool | None:
        if self._relay is not None:
            self._relay.eof_received()
        return None

    def pause_writing(self) -> None:
        self._flow.pause_writing(self._loop.time())
        if self._relay is not None:
            self._relay.pause_writing()

    def resume_writing(self) -> None:
        self._flow.resume_writing()
        if self._relay is not None:
            self._relay.resume_writing()
        self._pump()

    # ---- httptools callbacks -----------------------------------------------------------------

    def on_message_begin(self) -> None:
        message = _Message()
        self._current = message
        self._messages.append(message)
        self._idle_since = None
        if self._header_start is None:
            self._header_start = self._loop.time()

    def on_url(self, url: bytes) -> None:
        message = self._current
        if message is None or self._fatal:
            return
        message.url += url
        if len(message.url) > self._limits.max_header_bytes:
            self._fail(400, _too_long(message.url, self._limits.max_header_bytes))

    def on_header(self, name: bytes, value: bytes) -> None:
        message = self._current
        if message is None or self._fatal:
            return
        message.headers.append((name, value))
        most = self._limits.max_header_bytes  # aiohttp's limits, and its words
        if len(name) > most or len(value) > most:
            self._fail(400, _too_long(name if len(name) > most else value, most))
        elif len(message.headers) > self._limits.max_headers:
            self._fail(400, "Too many headers received")

    def on_headers_complete(self) -> None:
        message = self._current
        if message is None or self._fatal:
            return
        self._header_start = None
        parser = self._parser
        message.keep_alive = parser.should_keep_alive()
        # Values as aiohttp gives them (UTF-8, other bytes as surrogates); the first of repeated
        # names, as aiohttp's headers.get() gives it.
        headers = {
            k.decode("latin-1").lower(): v.decode("utf-8", "surrogateescape")
            for k, v in reversed(message.headers)
        }
        message.chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        match = _INFER_PATH.fullmatch(message.url)
        encoding = headers.get("content-encoding", "identity").strip().lower()
        if (
            match is None
            or parser.get_method() != b"POST"
            or parser.get_http_version() != "1.1"
            or parser.should_upgrade()
            or encoding not in ("", "identity")
        ):
            self._start_relay(message, parser.get_method(), parser.get_http_version())
            return
        model, version = match.group(1), match.group(2)
        message.model = model.decode("latin-1")
        message.version = version.decode("latin-1") if version is not None else ""
        message.fields = headers
        length_text = headers.get("content-length")
        length = int(length_text) if length_text is not None and length_text.isdigit() else -1
        admission = self._route.admit(message.model, message.version, headers)
        if isinstance(admission, Reply) and (length > 0 or message.chunked):
            # Refused with a body to come (overload): aiohttp's route answers it at once and
            # discards its body a few connections at a time, holding the others in TCP flow
            # control (frontends/http/refusals.py), so that health checks and admitted
            # requests do not wait behind refused bodies.
            self._start_relay(message, b"POST", "1.1")
            return
        if isinstance(admission, Reply):
            message.reply = admission
        elif length > self._route.max_body_bytes:
            message.reply = self._too_large(length)
            _release(admission)
        else:
            message.admission = admission
            if length >= STREAMED_BYTES:
                message.body = bytearray(length)
        expects = headers.get("expect", "").lower() == "100-continue"
        message.expects = expects and (length > 0 or message.chunked)  # a body to come
        if message.expects and message is self._messages[0]:
            self._expected(message)

    def _expected(self, message: _Message) -> None:
        """Answer `message`'s Expect: 100-continue (it is the next to be answered): 100 when
        its body is wanted; a refusal decided from its head (413 for a body over the limit)
        at once instead, closing the connection (the client may or may not send the body)."""
        message.expects = False
        if message.reply is None:
            assert self._transport is not None
            self._transport.write(_CONTINUE)
            return
        if not message.complete:
            self._fail(message.reply.status, "", message.reply)

    def on_body(self, body: bytes) -> None:
        message = self._current
        if message is None or self._fatal:
            return
        if message.relay:
            if message.chunked:
                self._relay_bytes(message, b"%x\r\n%b\r\n" % (len(body), body))
            else:
                self._relay_bytes(message, body)
            return
        if message.reply is not None:  # refused: the body is discarded
            return
        end = message.filled + len(body)
        if end > self._route.max_body_bytes:
            message.reply = self._too_large(end)
            _release(message.admission)
            message.admission = None
            message.body = []
            return
        if isinstance(message.body, bytearray):
            if end > len(message.body):
                message.reply = self._route.error(
                    400, f"request body is longer than its Content-Length {len(message.body)}"
                )
                _release(message.admission)
                message.admission = None
                return
            message.body[message.filled : end] = body
        else:
            message.body.append(body)
        message.filled = end

    def on_message_complete(self) -> None:
        message = self._current
        if message is None or self._fatal:
            return
        self._current = None
        message.complete = True
        if message.relay and message.chunked:
            self._relay_bytes(message, b"0\r\n\r\n")
        if message.relay and message is self._active and self._relay_answered:
            self._loop.call_soon(self._after_relay, message)  # answered before its body was in

    # ---- answering, in order -----------------------------------------------------------------

    def _pump(self) -> None:
        """Start answering the oldest request if nothing is being answered."""
        while self._active is None and self._transport is not None:
            if self._closing:  # what was received after is not answered
                self._drop_waiting()
                self._close()
                return
            if not self._flow.writing:
                return  # resume_writing pumps again
            if not self._messages:
                if self._fatal is not None:
                    fatal, self._fatal = self._fatal, None
                    reply = fatal if isinstance(fatal, Reply) else self._route.error(*fatal)
                    self._write_reply(reply, keep_alive=False, headers={})
                    self._close()
                else:
                    self._idle_since = self._loop.time()
                    self.release("pipeline")
                return
            if self._flow.held_for("pipeline") and self._waiting_bytes() <= PIPELINE_MAX_BYTES:
                # The request that was waiting is the one to answer now: the rest of its body
                # must be read (holding on would stall it until its body timeout).
                self.release("pipeline")
            message = self._messages[0]
            if message.relay:
                self._active = message
                self._relay_answered = False
                self._activate_relay(message)
                return
            if not message.complete:
                if message.expects:  # pipelined behind the one just answered
                    self._expected(message)
                    continue
                return  # the data that completes it pumps again
            self._messages.popleft()
            self._active = message
            outcome = message.reply or self._infer(message)
            if not isinstance(outcome, Reply):  # it waits for an instance
                self._task = self._loop.create_task(self._answer_later(message, outcome))
                return
            self._answer(message, outcome)

    def _infer(self, message: _Message) -> Reply | Coroutine[Any, Any, Reply]:
        body = message.body
        if isinstance(body, list):
            return self._route.infer_reply(
                message.model,
                message.version,
                message.admission,
                b"".join(body),
                message.fields,
                message.headers,
            )
        if message.filled != len(body):  # the connection ended the body early
            _release(message.admission)
            return self._route.error(
                400, f"request body has {message.filled} of its Content-Length {len(body)} bytes"
            )
        return self._route.infer_reply(
            message.model, message.version, message.admission, body, message.fields, message.headers
        )

    async def _answer_later(self, message: _Message, answer: Coroutine[Any, Any, Reply]) -> None:
        try:
            reply = await answer
        except Exception:  # a bug here; the route answers every error of the request itself
            log.exception("HTTP request handling failed", extra=RATE_LIMITED)
            reply = self._route.error(500, "internal error; see the server log")
        self._task = None
        self._answer(message, reply)
        self._pump()

    def _answer(self, message: _Message, reply: Reply) -> None:
        self._write_reply(reply, message.keep_alive and not self._closing, message.fields)
        self._active = None
        if not message.keep_alive:
            self._closing = True

    def _write_reply(self, reply: Reply, keep_alive: bool, headers: Mapping[str, str]) -> None:
        transport = self._transport
        if transport is None:
            return
        chunks = reply.chunks
        size = sum(map(len, chunks))
        extra = reply.headers
        if size >= MIN_COMPRESSED_BYTES:
            accepted = headers.get("accept-encoding", "")
            for coding, wbits in (("deflate", zlib.MAX_WBITS), ("gzip", 16 + zlib.MAX_WBITS)):
                if coding in accepted:  # aiohttp's order of preference
                    packer = zlib.compressobj(wbits=wbits)
                    chunks = [b"".join(packer.compress(c) for c in chunks) + packer.flush()]
                    size = len(chunks[0])
                    extra = (*extra, (b"Content-Encoding", coding.encode()))
                    break
        head = response_head(reply.status, reply.content_type, size, extra, keep_alive)
        if size < STREAMED_BYTES:  # one send: joining a small answer costs less than a syscall
            transport.write(b"".join([head, *chunks]))
        else:  # tensors go to the socket from the model's output arrays
            transport.writelines([head, *chunks])

    def _too_large(self, size: int) -> Reply:
        limit = self._route.max_body_bytes
        return self._route.error(
            413,
            body_too_large(f"Maximum request body size {limit} exceeded, actual body size {size}"),
        )

    def _drop_waiting(self) -> None:
        """Forget the requests not being answered (the connection closes)."""
        active = self._active
        for message in self._messages:
            if message is not active:
                _release(message.admission)
        self._messages = deque([active] if active is not None and active.relay else [])
        self._current = None

    def _fail(self, status: int, text: str, reply: Reply | None = None) -> None:
        """A request that breaks the connection's limits (or `reply`, a refusal answered
        without its body): answered once the ones before it are, then the connection closes;
        nothing more of it is read."""
        if self._current is not None and self._current in self._messages:
            self._messages.remove(self._current)
        self._current = None
        self._fatal = reply if reply is not None else (status, text)
        self.hold("fatal")

    # ---- relaying to aiohttp -----------------------------------------------------------------

    def _start_relay(self, message: _Message, method: bytes, version: str) -> None:
        message.relay = True
        head = [b"%s %s HTTP/%s\r\n" % (method, message.url, version.encode())]
        head += [b"%s: %s\r\n" % pair for pair in message.headers]
        head.append(b"\r\n")
        self._relay_bytes(message, b"".join(head))

    def _relay_bytes(self, message: _Message, data: bytes) -> None:
        if message is self._active and self._relay is not None:
            self._relay.data_received(data)
            return
        message.pending.append(data)
        message.pending_bytes += len(data)
        if self._waiting_bytes() > PIPELINE_MAX_BYTES:
            self.hold("pipeline")

    def _waiting_bytes(self) -> int:
        """Bytes received of the requests behind the one being answered (or, when none is,
        behind the next one to be): what PIPELINE_MAX_BYTES bounds."""
        messages = self._messages
        active = self._active
        skip = 1 if messages and (active is None or messages[0] is active) else 0
        return sum(m.pending_bytes + m.filled for m in itertools.islice(messages, skip, None))

    def _activate_relay(self, message: _Message) -> None:
        assert self._transport is not None
        self._relay_transport = RelayTransport(self, self._transport)
        self._relay = self._owner.relay_handler(
            lambda keep_alive: self._relay_finished(message, keep_alive)
        )
        self._relay.raw_headers = message.headers
        self._relay.connection_made(self._relay_transport)
        pending, message.pending = message.pending, []
        message.pending_bytes = 0
        for data in pending:
            if self._relay is None:
                break
            self._relay.data_received(data)

    def _relay_finished(self, message: _Message, keep_alive: bool) -> None:
        """aiohttp wrote `message`'s answer (`keep_alive`: whether the connection stays open
        after it): the connection goes on once aiohttp's step has ended."""
        if message is not self._active:
            return  # a relay already detached
        self._relay_answered = True
        if not keep_alive:
            self._closing = True
        self._loop.call_soon(self._after_relay, message)

    def _after_relay(self, message: _Message) -> None:
        """`message`, relayed and answered, is done once its body is in. Scheduled both when
        aiohttp answers and when the body completes, so it acts once, for that message only:
        a stale call must not end the next relayed request before aiohttp answered it."""
        if message is not self._active or self._transport is None:
            return
        if not message.complete:
            return  # answered before its body was in: the rest still goes to aiohttp
        self._messages.popleft()
        self._active = None
        self._detach_relay(None)
        self._pump()

    def relay_closed(self) -> None:
        """aiohttp closed the relayed connection (an error, or no keep-alive): so is this
        one, once its answer is out (closing flushes what was written)."""
        self._closing = True
        self._close()
        self._loop.call_soon(self._detach_relay, None)

    def _detach_relay(self, exc: BaseException | None) -> None:
        relay, self._relay = self._relay, None
        if self._relay_transport is not None:
            self._relay_transport.detach()
            self._relay_transport = None
        if relay is not None:
            relay.connection_lost(exc)
        self.release("relay")  # aiohttp's flow control ends with its protocol

    def _upgrade(self, rest: bytes) -> None:
        """An upgrade request: from here on every byte of the connection goes to aiohttp."""
        self._raw_relay = True
        message = self._current
        if message is not None and not message.relay:
            self._start_relay(message, self._parser.get_method(), self._parser.get_http_version())
        if rest and message is not None:
            self._relay_bytes(message, rest)
        self._pump()

    # ---- flow control, stalls, closing -------------------------------------------------------

    def hold(self, reason: str) -> None:
        """Stop reading for `reason` (until `release`)."""
        self._flow.hold(reason)

    def release(self, reason: str) -> None:
        self._flow.release(reason)

    def _check(self) -> None:
        self._watch = None
        if self._transport is None:
            return
        now = self._loop.time()
        limits = self._limits
        receiving = self._current is not None and not self._flow.held_for("fatal")
        late = stall(
            limits, now, self._header_start, receiving, self._last_data, self._flow.write_paused_at
        )
        if late is not None:
            self._time_out(*late)
            return
        idle = self._idle_since
        if (
            idle is not None
            and limits.keepalive_timeout_secs > 0
            and now - idle > limits.keepalive_timeout_secs
            and self._active is None
            and not self._messages
        ):
            self._close()
            return
        self._watch = self._loop.call_at(now + self._tick, self._check)

    def _time_out(self, what: str, seconds: float, answer: bytes = b"") -> None:
        transport = self._transport
        peer = transport.get_extra_info("peername") if transport else None
        log.info("closing HTTP connection from %s: waited %gs for %s", peer, seconds, what)
        if transport is not None:
            if answer and self._active is None and self._flow.writing:
                transport.write(answer)
                transport.close()
            else:
                transport.abort()

    def _close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    @property
    def busy(self) -> bool:
        return self._active is not None or bool(self._messages)

    def close_now(self) -> None:
        """Close at once, whatever is in progress (a shutdown past its deadline)."""
        if self._transport is not None:
            self._transport.abort()

    async def shutdown(self, timeout: float | None) -> None:
        """Answer what is in progress, then close; at once when idle."""
        self._closing = True
        self.hold("closing")
        if not self.busy:
            self._close()
        elif self._relay is not None:
            await self._relay.shutdown(timeout)
        try:
            await asyncio.wait_for(self._closed.wait(), timeout)
        except asyncio.TimeoutError:
            self.close_now()


def stall(
    limits: HttpConnectionLimits,
    now: float,
    header_start: float | None,
    receiving_body: bool,
    last_data: float,
    write_paused_at: float | None,
) -> tuple[str, float, bytes] | None:
    """Pure: what a connection has waited for too long (what, the timeout, the answer to send
    before closing), or None. Headers since `header_start`, a body being received since
    `last_data`, a client not reading since `write_paused_at`."""
    if (
        header_start is not None
        and limits.header_timeout_secs > 0
        and now - header_start > limits.header_timeout_secs
    ):
        return "request headers", limits.header_timeout_secs, TIMEOUT_ANSWER
    if limits.body_timeout_secs > 0:
        stalled = now - limits.body_timeout_secs
        if receiving_body and last_data < stalled:
            return "the request body", limits.body_timeout_secs, TIMEOUT_ANSWER
        if write_paused_at is not None and write_paused_at < stalled:
            return "the client to read its response", limits.body_timeout_secs, b""
    return None


def _read_buffer() -> memoryview:
    """This loop thread's read buffer."""
    thread = threading.get_ident()
    buffer = _READ_BUFFERS.get(thread)
    if buffer is None:
        buffer = _READ_BUFFERS[thread] = memoryview(bytearray(READ_BUFFER_BYTES))
    return buffer


def _reads_directly(message: _Message) -> bool:
    """An infer request whose body is being read into its own buffer, and not complete."""
    return (
        isinstance(message.body, bytearray)
        and message.reply is None
        and not message.relay
        and not message.complete
        and message.filled < len(message.body)
        and bool(message.fields)  # its headers are in
    )


def _too_long(line: bytes, limit: int) -> str:
    return f"Got more than {limit} bytes when reading: {line[:100] + b'...'!r}."


def _release(admission: Any) -> None:
    if admission is not None and hasattr(admission, "release"):
        admission.release()
