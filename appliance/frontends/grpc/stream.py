"""ModelStreamInfer on its handler thread (the synchronous `grpc.server`'s).

A stream's requests are read, run and answered on the stream's own handler thread while the
inference service's thread lane takes them (`infer_here`, `DynamicScheduler.run_here`: the model has
an idle instance, or one whose queue only keeps arrival order, and nothing queued): the
response is yielded straight to gRPC and the next request read, with no other thread involved,
as in a unary ModelInfer and in the synchronous ceiling (bench/ceiling_grpc.py). Before, every
request crossed threads (a reader thread to the loop, and the loop back to the handler thread
per response): `simple` over a stream cost 357 us of server CPU a request against the
ceiling's 116 (issue 20; docs/benchmarks/history.md).

A request the lane does not take (a decoupled model, a sequence, an ensemble, batching with a
delay, queued work, the response cache, shared memory regions named: see `infer_here`) runs on
the event loop instead, concurrently with the stream's other requests, and posts its responses
to the handler thread's queue of events. While any of the stream's requests runs on the loop,
the handler thread must wait for their responses and for the next request at once: a reader
thread of the stream's own (started the first time it is needed) reads the next request for it,
one at a time, and only when asked. When the loop has none of the stream's requests left, the
handler thread reads again itself. After LANE_LONG_RUNS lane runs in a row longer than
STREAM_LANE_LONG_NS, the stream's next requests go to the loop too, so that requests a client
sends together on one stream still run side by side (several instances, batching); the lane
takes them again once one arrives after the loop has answered the others (the client waits for
its answers).

The bounds of issue 17 hold: at most STREAM_MAX_IN_FLIGHT requests run on the loop (no further
request is read until one is answered; a client that sends without reading is then held back by
HTTP/2 flow control), and responses waiting for the client are at most STREAM_MAX_IN_FLIGHT,
and STREAM_MAX_WAITING_BYTES of tensor data unless one alone is larger (`_Waiting`). On the
handler thread one request at a time is read, run and answered: the next is read once gRPC
has sent the response.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import queue
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from appliance.common.errors import ApplianceError, ErrorCode, InvalidInput
from appliance.common.header_forward import HeaderForward
from appliance.common.limits import RequestLimits
from appliance.common.protocol import service_pb2 as pb
from appliance.common.types import InferRequest
from appliance.frontends.grpc.codec import decode_request, encode_response, names_regions
from appliance.services.inference import InferenceService, Prepared
from appliance.services.shared_memory import SharedMemoryRegistry, shm_targets

# Requests of one ModelStreamInfer stream in flight (read and not yet answered), and responses
# waiting for the client to read them. At the bound the stream reads no further request until
# one is answered: a client that sends without reading is held back by HTTP/2 flow control
# instead of growing the server (issue 17: 115 -> 473 MB over 250k requests, unbounded).
STREAM_MAX_IN_FLIGHT = 64
# Tensor bytes of the responses waiting for the stream's client, past which a request's next
# response waits for the client to read (one always goes in): 64 large responses alone could
# hold gigabytes. A decoupled model is held back in turn (services/inference.py).
STREAM_MAX_WAITING_BYTES = 32 << 20
# LANE_LONG_RUNS requests in a row that the lane ran on the handler thread for longer than
# STREAM_LANE_LONG_NS each (from admission to response, a wait for a busy instance included)
# send the stream's next requests to the loop: a client that sends several requests at once on
# one stream then has them run side by side (on several instances, or batched) as before, where
# the handler thread would run them one after the other. Below it, what a request costs the
# server is mostly its own handling, which the lane cuts (issue 20). Two in a row, not one: a
# preempted or waiting run alone passes 2 ms for 2-3% of `simple`'s requests on a busy 2-core
# machine, and each such switch costs a loop round trip.
STREAM_LANE_LONG_NS = 2_000_000
LANE_LONG_RUNS = 2

_FINAL = "triton_final_response"
_EMPTY_FINAL = "triton_enable_empty_final_response"

# What the handler thread's queue of events carries: (kind, value).
_RESPONSE = 0  # a response from the loop: (message, tensor bytes)
_DONE = 1  # one of the stream's requests on the loop has finished (all its responses posted)
_READ = 2  # the reader thread's read: raw message bytes, or _NO_MORE
_ENDED = 3  # the call ended (the client went, its deadline passed, the server stopped it)
_NO_MORE = object()  # the client's requests ended (or the call did)


class Malformed(Exception):
    """A request message of the stream does not parse: the stream ends, INVALID_ARGUMENT,
    after the requests read before it are answered."""


class _Cancelled(ApplianceError):
    code = ErrorCode.CANCELLED


class StreamCancelled(Exception):
    """The stream's call ended early: no more answers."""


class StreamRun:
    """One ModelStreamInfer stream's requests and responses; `responses()` is the handler's
    response iterator. `status_of` maps a request's failure to its (code, message): the message
    goes in-band, in the response's error_message, and the stream goes on."""

    def __init__(
        self,
        messages: Iterator[bytes],
        context: grpc.ServicerContext,
        loop: asyncio.AbstractEventLoop,
        inference: InferenceService,
        shared_memory: SharedMemoryRegistry,
        limits: RequestLimits,
        status_of: Callable[[BaseException], tuple[grpc.StatusCode, str]],
        header_forward: HeaderForward | None = None,
    ) -> None:
        self._messages = messages
        self._loop = loop
        self._inference = inference
        self._shm = shared_memory
        self._limits = limits
        self._status_of = status_of
        self._active = context.is_active
        self._events: queue.SimpleQueue[tuple[int, Any]] = queue.SimpleQueue()
        self._waiting = _Waiting(loop, self._events)
        self._on_loop: set[concurrent.futures.Future[None]] = set()
        self._lock = threading.Lock()  # _on_loop and _ended, against the call's end callback
        self._ended = False
        # The lane's last runs on this stream in a row that took longer than STREAM_LANE_LONG_NS.
        self._long_runs = 0
        self._reader: _Reader | None = None
        # What the stream's metadata adds to each of its requests' parameters, read once (it
        # is the call's): None without --grpc-header-forward-pattern, or the refusal every
        # request gets when a matching key is reserved.
        self._forwarded: dict[str, str] | InvalidInput | None = None
        if header_forward is not None:
            try:
                self._forwarded = header_forward.parameters(context.invocation_metadata() or ())
            except InvalidInput as exc:
                self._forwarded = exc
        if not context.add_callback(self._end):
            self._ended = True

    def _end(self) -> None:
        """gRPC's callback at the call's end (on one of its threads): stop the loop's work."""
        with self._lock:
            self._ended = True
            running = list(self._on_loop)
        for future in running:
            future.cancel()
        self._events.put((_ENDED, None))

    def responses(self) -> Iterator[pb.ModelStreamInferResponse]:
        """The stream's responses, as its requests are answered: raises Malformed at a request
        message that does not parse (after answering those before it), StreamCancelled when the
        call ends early."""
        on_loop = 0  # the stream's requests running on the loop
        asked = False  # the reader thread is reading the next request for us
        done_reading = False  # the client's requests ended, or one did not parse
        malformed = ""
        try:
            while True:
                if self._ended:
                    raise StreamCancelled()
                if not done_reading and not asked and on_loop == 0:
                    raw = self._read_here()  # nothing else to wait for: read here
                    lane = self._long_runs < LANE_LONG_RUNS
                else:
                    if done_reading and not asked and on_loop == 0:
                        break
                    if not done_reading and not asked and on_loop < STREAM_MAX_IN_FLIGHT:
                        self._reader_for_us().ask()
                        asked = True
                    kind, value = self._events.get()
                    if kind == _RESPONSE:
                        message, size = value
                        self._waiting.taken(size)
                        yield message
                        continue
                    if kind == _DONE:
                        on_loop -= 1
                        continue
                    if kind == _ENDED:
                        raise StreamCancelled()
                    asked = False
                    raw = value
                    if on_loop == 0:  # the client waited for its answers: the lane again
                        self._long_runs = 0
                    lane = self._long_runs < LANE_LONG_RUNS
                if raw is _NO_MORE:
                    done_reading = True
                    continue
                try:
                    request = pb.ModelInferRequest.FromString(raw)
                except DecodeError as exc:
                    done_reading, malformed = True, str(exc)
                    continue
                answer = self._answer_here(request, lane)
                if answer is None:
                    on_loop += 1
                else:
                    yield answer
        finally:
            self._close()
        if malformed:
            raise Malformed(malformed)

    def _read_here(self) -> Any:
        """The next request message, read on the handler thread; _NO_MORE at the end."""
        try:
            return next(self._messages)
        except StopIteration:
            return _NO_MORE
        except grpc.RpcError:  # the call was cancelled
            raise StreamCancelled() from None

    def _reader_for_us(self) -> _Reader:
        if self._reader is None:
            self._reader = _Reader(self._messages, self._events)
        return self._reader

    def _close(self) -> None:
        if self._reader is not None:
            self._reader.close()
        with self._lock:
            running = list(self._on_loop)
            self._on_loop.clear()
        for future in running:
            future.cancel()

    # ---- one request -------------------------------------------------------------------------

    def _answer_here(self, request: Any, lane: bool) -> pb.ModelStreamInferResponse | None:
        """A request's response when the lane ran it here; None when it went to the loop (as
        it does when `lane` is false)."""
        model, version = request.model_name, request.model_version
        if not lane or names_regions(request) or self._inference.is_decoupled(model, version):
            self._start(self._serve(request))  # decoded and answered on the loop
            return None
        start = time.monotonic_ns()
        try:
            with self._inference.admit(model, version, unary=False) as admission:
                decoded = decode_request(request, self._shm, self._limits)
                if self._forwarded is not None:
                    self._forward(decoded)
                answer = self._inference.infer_here(decoded, admission, self._loop, self._active)
            if isinstance(answer, Prepared):
                self._start(self._finish(request, answer))
                return None
            if time.monotonic_ns() - start > STREAM_LANE_LONG_NS:
                self._long_runs += 1
            else:
                self._long_runs = 0
            message = pb.ModelStreamInferResponse()
            result = encode_response(answer, into=message.infer_response)
        except (asyncio.CancelledError, concurrent.futures.CancelledError):
            if not self._active():
                raise StreamCancelled() from None  # the client went while it ran
            return self._error(request, _Cancelled("the request was cancelled"))
        except Exception as exc:
            return self._error(request, exc)
        result.parameters[_FINAL].bool_param = True  # its only response is the final one
        return message

    def _forward(self, decoded: InferRequest) -> None:
        """The stream's forwarded metadata into a decoded request's parameters (after its
        decoding, as tritonserver), or the stream's refusal of them."""
        forwarded = self._forwarded
        if isinstance(forwarded, InvalidInput):
            raise forwarded
        if forwarded:
            decoded.parameters.update(forwarded)

    def _start(self, work: Coroutine[Any, Any, None]) -> None:
        future = asyncio.run_coroutine_threadsafe(work, self._loop)
        with self._lock:
            ended = self._ended
            self._on_loop.add(future)
            if len(self._on_loop) > STREAM_MAX_IN_FLIGHT:
                self._on_loop = {f for f in self._on_loop if not f.done()}
        if ended:
            future.cancel()

    def _error(self, request: Any, exc: BaseException) -> pb.ModelStreamInferResponse:
        _, message = self._status_of(exc)
        # the error alone, as tritonserver sends it (an empty response beside it)
        return pb.ModelStreamInferResponse(
            error_message=message, infer_response=pb.ModelInferResponse()
        )

    async def _finish(self, request: Any, prepared: Prepared) -> None:
        """On the loop: a request the lane validated but did not run (queued, batched, a
        sequence, an ensemble, the cache). It names no shared memory region."""
        try:
            try:
                response = await self._inference.infer_prepared(prepared)
                message = pb.ModelStreamInferResponse()
                result = encode_response(response, into=message.infer_response)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                await self._waiting.put(self._error(request, exc))
                return
            result.parameters[_FINAL].bool_param = True  # as tritonserver: on every response
            size = sum(tensor.data.nbytes for tensor in response.outputs)
            del response  # its arrays: the message holds their bytes
            await self._waiting.put(message, size)
        finally:
            self._events.put((_DONE, None))

    async def _serve(self, request: Any) -> None:
        """On the loop, from its decoding: a request of a decoupled model (zero or more
        responses), one naming shared memory regions (held from its decoding until its
        responses are encoded), or one the lane is not to take (`_answer_here`)."""
        final_flag = _EMPTY_FINAL in request.parameters and (
            request.parameters[_EMPTY_FINAL].bool_param
        )
        try:
            with self._shm.request_scope():
                # the model looked up before the inputs are decoded, as tritonserver
                served = self._inference.lookup(request.model_name, request.model_version)
                decoupled = served is not None and served.decoupled
                decoded = decode_request(request, self._shm, self._limits)
                if self._forwarded is not None:
                    self._forward(decoded)
                targets = shm_targets(decoded.outputs)
                async for response in self._inference.infer_stream(decoded):
                    message = pb.ModelStreamInferResponse()
                    result = encode_response(response, targets, self._shm, message.infer_response)
                    # on every response, as tritonserver: a non-decoupled model's only
                    # response is the final one; a decoupled model's final is the empty one
                    result.parameters[_FINAL].bool_param = not decoupled
                    size = sum(tensor.data.nbytes for tensor in response.outputs)
                    del response
                    await self._waiting.put(message, size)
                if final_flag and decoupled:  # an empty response closes the request
                    final = pb.ModelInferResponse(
                        model_name=request.model_name,
                        model_version=request.model_version,
                        id=request.id,
                    )
                    final.parameters[_FINAL].bool_param = True
                    await self._waiting.put(pb.ModelStreamInferResponse(infer_response=final))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            await self._waiting.put(self._error(request, exc))
        finally:
            self._events.put((_DONE, None))


class _Waiting:
    """The responses posted from the loop and not yet taken by the handler thread: at most
    STREAM_MAX_IN_FLIGHT, and STREAM_MAX_WAITING_BYTES of tensor data unless one alone is
    larger. `put` (on the loop) waits for room; `taken` (on the handler thread) makes room and
    wakes the loop only when a put waits."""

    __slots__ = ("_bytes", "_count", "_events", "_lock", "_loop", "_waiter")

    def __init__(
        self, loop: asyncio.AbstractEventLoop, events: queue.SimpleQueue[tuple[int, Any]]
    ) -> None:
        self._loop = loop
        self._events = events
        self._lock = threading.Lock()
        self._count = 0
        self._bytes = 0
        self._waiter: asyncio.Future[None] | None = None

    def _full(self, size: int) -> bool:
        return self._count >= STREAM_MAX_IN_FLIGHT or bool(
            size and self._bytes and self._bytes + size > STREAM_MAX_WAITING_BYTES
        )

    async def put(self, message: pb.ModelStreamInferResponse, size: int = 0) -> None:
        while True:
            with self._lock:
                if not self._full(size):
                    self._count += 1
                    self._bytes += size
                    break
                waiter = self._waiter
                if waiter is None or waiter.done():
                    waiter = self._waiter = self._loop.create_future()
            await asyncio.shield(waiter)  # shared by the stream's waiting puts
        self._events.put((_RESPONSE, (message, size)))

    def taken(self, size: int) -> None:
        with self._lock:
            self._count -= 1
            self._bytes -= size
            waiter, self._waiter = self._waiter, None
        if waiter is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed at exit
                self._loop.call_soon_threadsafe(_wake, waiter)


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class _Reader:
    """A stream's reader thread: reads the stream's next request message each time it is asked
    (and only then), and posts it (or _NO_MORE at the end) to the handler thread's events."""

    def __init__(
        self, messages: Iterator[bytes], events: queue.SimpleQueue[tuple[int, Any]]
    ) -> None:
        self._messages = messages
        self._events = events
        self._asks: queue.SimpleQueue[bool] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._read, name="grpc-stream-reader", daemon=True)
        self._thread.start()

    def ask(self) -> None:
        self._asks.put(True)

    def close(self) -> None:
        """No more reads: the thread ends once its read in progress (if any) returns."""
        self._asks.put(False)

    def _read(self) -> None:
        while self._asks.get():
            try:
                item: Any = next(self._messages)
            except (StopIteration, grpc.RpcError):  # the end, or the call was cancelled
                item = _NO_MORE
            self._events.put((_READ, item))
            if item is _NO_MORE:
                return
