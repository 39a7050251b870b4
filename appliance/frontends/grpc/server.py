"""Triton's GRPCInferenceService on the synchronous `grpc.server` (a thread pool) over the core
and control plane.

Unary ModelInfer runs on its handler thread from decoding to encoding: the inference service's
thread lane (`InferenceService.infer_here`, `Scheduler.run_here`) runs the model there when an
instance is idle and nothing is queued, with no hand-off to the event loop; otherwise the
validated request goes to the loop (`asyncio.run_coroutine_threadsafe`) and is queued as any
other. Issue 20 measured, `simple` at c=8 on one core, server CPU per request: grpc.aio 448-500
us, its ceiling 323-374; the synchronous ceiling 199-215; a sync server handing every call to
the loop 461-487 (docs/benchmarks.md). Every other RPC, and ModelStreamInfer, runs the
servicer's async methods on the loop, bridged by `_on_loop` and `_LoopContext`; a stream's
requests are read by a thread of its own (`_ThreadRequests`) only when the stream asks for one
(STREAM_MAX_IN_FLIGHT holds), and its responses are pulled one at a time by the handler thread
as gRPC sends them.

A call holds a pool thread for as long as it runs (a stream: its whole life; 8 threads hung
perf_analyzer --streaming on bench/ceiling_grpc.py), so the pool has a thread for every call
the call bound admits plus POOL_HEADROOM for health calls (never refused) and refusals, and
streams are refused past `stream_limit` with RESOURCE_EXHAUSTED (UNARY_RESERVE calls are
always left to unary ones) instead of hanging the calls behind them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Coroutine, Iterator, Sequence
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from appliance.access import Restrictions
from appliance.errors import ApplianceError, DecoupledOnUnary, Unsupported
from appliance.frontends.grpc import convert
from appliance.frontends.grpc.admission import CallBound, StreamSlots
from appliance.frontends.grpc.codec import decode_request, encode_response, parameter_value
from appliance.frontends.status import GRPC_STATUS
from appliance.limits import RequestLimits
from appliance.logs import RATE_LIMITED
from appliance.protocol import service_pb2 as pb
from appliance.protocol import service_pb2_grpc
from appliance.services.control import ControlService
from appliance.services.inference import InferenceService, Prepared
from appliance.services.shared_memory import SharedMemoryRegistry, shm_targets

log = logging.getLogger(__name__)

_STREAMING = {"ModelStreamInfer"}
SERVICE = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]

# Requests of one ModelStreamInfer stream in flight (read and not yet answered), and responses
# waiting for the client to read them. At the bound the stream reads no further request until
# one is answered: a client that sends without reading is held back by HTTP/2 flow control
# instead of growing the server (issue 17: 115 -> 473 MB over 250k requests, unbounded).
STREAM_MAX_IN_FLIGHT = 64
# tritonserver's refusal of a decoupled model on ModelInfer (our explanation follows it).
DECOUPLED_REFUSAL = "ModelInfer RPC doesn't support models with decoupled transaction policy"
# Tensor bytes of the responses waiting for the stream's client, past which a request's next
# response waits for the client to read (one always goes in): 64 large responses alone could
# hold gigabytes. A decoupled model is held back in turn (services/inference.py).
STREAM_MAX_WAITING_BYTES = 32 << 20
# Pool threads beyond the calls the call bound admits: health calls (never refused) and the
# refusals of calls past the bound run on them.
POOL_HEADROOM = 16
# The calls the pool has threads for when --grpc-max-concurrent-rpcs is 0 (no bound).
UNBOUNDED_CALLS = 256
# Of those calls, how many streams may never take: they stay for unary calls.
UNARY_RESERVE = 8

_CANCELLED = (asyncio.CancelledError, concurrent.futures.CancelledError)


def pool_threads(max_concurrent_rpcs: int) -> int:
    """The handler threads for a call bound (0: none)."""
    return (max_concurrent_rpcs or UNBOUNDED_CALLS) + POOL_HEADROOM


def stream_limit(max_concurrent_rpcs: int) -> int:
    """The streams open at once past which a new one is refused."""
    return max(1, (max_concurrent_rpcs or UNBOUNDED_CALLS) - UNARY_RESERVE)


def _status_of(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    if isinstance(exc, ApplianceError):
        return GRPC_STATUS[exc.code], exc.message
    # A server bug, but one a client may trigger at will: rate-limited (logs.py).
    log.error("unexpected error in gRPC handler", exc_info=exc, extra=RATE_LIMITED)
    return grpc.StatusCode.INTERNAL, "internal error; see the server log"


# Each RPC's API group for --grpc-restricted-protocol (appliance/access.py).
API_OF = {
    "ServerLive": "health",
    "ServerReady": "health",
    "ModelReady": "health",
    "ServerMetadata": "metadata",
    "ModelMetadata": "metadata",
    "ModelInfer": "inference",
    "ModelStreamInfer": "inference",
    "ModelConfig": "model-config",
    "ModelStatistics": "statistics",
    "RepositoryIndex": "model-repository",
    "RepositoryModelLoad": "model-repository",
    "RepositoryModelUnload": "model-repository",
    "SystemSharedMemoryStatus": "shared-memory",
    "SystemSharedMemoryRegister": "shared-memory",
    "SystemSharedMemoryUnregister": "shared-memory",
    "CudaSharedMemoryStatus": "shared-memory",
    "CudaSharedMemoryRegister": "shared-memory",
    "CudaSharedMemoryUnregister": "shared-memory",
    "TraceSetting": "trace",
    "LogSettings": "logging",
}


def check_access(restrictions: Restrictions | None, name: str, context: Any) -> None:
    if restrictions:
        metadata = {key.lower(): value for key, value in (context.invocation_metadata() or ())}
        restrictions.check(API_OF.get(name, ""), metadata)


def _guard_unary(
    method: Callable[[Any, grpc.ServicerContext], Any],
    name: str,
    parse: Callable[[bytes], Any],
    restrictions: Restrictions | None = None,
    bound: CallBound | None = None,
) -> Callable[[bytes, grpc.ServicerContext], Any]:
    """The call bound, the access restriction, the request's parsing and the one error mapping
    around a unary RPC's handler (on a pool thread), which gRPC hands its message's bytes (see
    `add_to_server`)."""
    slots = bound if bound is not None and bound.counts(name) else None

    def guarded(raw: bytes, context: grpc.ServicerContext) -> Any:
        if log.isEnabledFor(logging.DEBUG):
            log.debug("gRPC call: %s", name)
        taken = False
        try:
            if slots is not None:
                slots.take()
                taken = True
            check_access(restrictions, name, context)
            return method(parse(raw), context)
        except _CANCELLED:  # the client went (or the server stopped the call): no answer
            code, message = grpc.StatusCode.CANCELLED, f"{name}: cancelled"
        except DecodeError as exc:  # the client's bytes: no traceback, no log line
            code, message = grpc.StatusCode.INVALID_ARGUMENT, _unparsable(name, exc)
        except _Abort as exc:
            code, message = exc.code, exc.details
        except Exception as exc:
            code, message = _status_of(exc)
        finally:
            if taken and slots is not None:
                slots.give_back()
        context.abort(code, message)

    return guarded


class _Abort(Exception):
    """`context.abort` called on the loop (`_LoopContext`): the handler thread aborts the call."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class _LoopContext:
    """What the servicer's async methods use of their call's context, on the loop: the call's
    metadata (read on its handler thread) and `abort`."""

    __slots__ = ("_metadata",)

    def __init__(self, context: grpc.ServicerContext) -> None:
        self._metadata = tuple(context.invocation_metadata() or ())

    def invocation_metadata(self) -> Sequence[tuple[str, Any]]:
        return self._metadata

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise _Abort(code, details)


class _Cancel:
    """Cancels the loop's work for a call when the call ends early (the client went, its
    deadline passed, the server stopped it): one gRPC callback per call, whatever runs now."""

    __slots__ = ("_ended", "_lock", "running")

    def __init__(self, context: grpc.ServicerContext) -> None:
        self._lock = threading.Lock()
        self._ended = False
        self.running: concurrent.futures.Future[Any] | None = None
        if not context.add_callback(self._end):
            self._ended = True

    def _end(self) -> None:
        with self._lock:
            self._ended = True
            running = self.running
        if running is not None:
            running.cancel()

    def wait(self, loop: asyncio.AbstractEventLoop, work: Coroutine[Any, Any, Any]) -> Any:
        """Run `work` on the loop and wait for its result; cancelled when the call ends."""
        future = asyncio.run_coroutine_threadsafe(work, loop)
        with self._lock:
            self.running = future
            ended = self._ended
        if ended:
            future.cancel()
        try:
            return future.result()
        finally:
            self.running = None


def _on_loop(
    loop: asyncio.AbstractEventLoop,
    method: Callable[[Any, Any], Coroutine[Any, Any, Any]],
) -> Callable[[Any, grpc.ServicerContext], Any]:
    """A servicer's async method as a handler thread's call: run on the loop, cancelled with
    the call."""

    def bridged(request: Any, context: grpc.ServicerContext) -> Any:
        return _Cancel(context).wait(loop, method(request, _LoopContext(context)))

    return bridged


def _unparsable(name: str, exc: DecodeError) -> str:
    return f"{name}: failed to parse the request message: {exc}"


class InferenceServicer(service_pb2_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]  # generated base is untyped
    """Every RPC the HTTP side serves; errors map through frontends/status.py.

    `shared_memory` is the registry requests name their tensors' regions in (the one the
    control service registers them in); `limits` are checked on declared shapes while decoding.
    """

    def __init__(
        self,
        core: InferenceService,
        control: ControlService,
        restrictions: Restrictions | None = None,
        *,
        shared_memory: SharedMemoryRegistry,
        limits: RequestLimits,
        max_concurrent_rpcs: int = 0,
    ) -> None:
        self.core = core
        self.control = control
        self.restrictions = restrictions
        self.shared_memory = shared_memory
        self.limits = limits
        # Calls in flight, all connections together, past which a call is refused at once.
        self.bound = CallBound(max_concurrent_rpcs)
        # Streams open, past which one is refused: each holds a pool thread for its life.
        self.streams = StreamSlots(stream_limit(max_concurrent_rpcs))
        self._loop: asyncio.AbstractEventLoop | None = None

    def add_to_server(self, server: grpc.Server, loop: asyncio.AbstractEventLoop) -> None:
        """Serve every RPC on `server` (whose pool threads run the handlers; the servicer's
        async methods run on `loop`), each unary one wrapped once with the call bound, the
        access check, its request's parsing and the one error mapping.

        Methods are registered without a request deserializer, so that the wrapper parses the
        bytes: gRPC's own deserializing turns a message that does not parse into an error
        with a traceback logged per call; parsing in the wrapper makes it INVALID_ARGUMENT,
        unlogged, for the same work on a good message. ModelStreamInfer's messages are parsed
        by the stream's reader (`_ThreadRequests`), whose DecodeError the stream answers.
        """
        self._loop = loop
        handlers: dict[str, grpc.RpcMethodHandler] = {}
        for method in SERVICE.methods:
            name = method.name
            request = getattr(pb, method.input_type.name)
            response = getattr(pb, method.output_type.name)
            if name in _STREAMING:
                handlers[name] = grpc.stream_stream_rpc_method_handler(
                    self._stream, response_serializer=response.SerializeToString
                )
                continue
            run = self._infer if name == "ModelInfer" else _on_loop(loop, getattr(self, name))
            guarded = _guard_unary(run, name, request.FromString, self.restrictions, self.bound)
            handlers[name] = grpc.unary_unary_rpc_method_handler(
                guarded, response_serializer=response.SerializeToString
            )
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(SERVICE.full_name, handlers),)
        )
        # grpcio >= 1.62: looked up by method name without the generic handler's search.
        add_registered = getattr(server, "add_registered_method_handlers", None)
        if add_registered is not None:
            add_registered(SERVICE.full_name, handlers)

    # ---- health and metadata -----------------------------------------------------------------

    async def ServerLive(self, request: Any, context: Any) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=self.control.server_live())

    async def ServerReady(self, request: Any, context: Any) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.control.server_ready())

    async def ModelReady(self, request: Any, context: Any) -> pb.ModelReadyResponse:
        return pb.ModelReadyResponse(ready=self.control.model_ready(request.name, request.version))

    async def ServerMetadata(self, request: Any, context: Any) -> pb.ServerMetadataResponse:
        return convert.server_metadata(self.control.server_metadata())

    async def ModelMetadata(self, request: Any, context: Any) -> pb.ModelMetadataResponse:
        return convert.model_metadata(self.control.model_metadata(request.name, request.version))

    async def ModelConfig(self, request: Any, context: Any) -> pb.ModelConfigResponse:
        return pb.ModelConfigResponse(
            config=self.control.model_config(request.name, request.version)
        )

    async def ModelStatistics(self, request: Any, context: Any) -> pb.ModelStatisticsResponse:
        return convert.statistics(self.control.statistics(request.name, request.version))

    # ---- repository --------------------------------------------------------------------------

    async def RepositoryIndex(self, request: Any, context: Any) -> pb.RepositoryIndexResponse:
        return convert.repository_index(self.control.repository_index(request.ready))

    async def RepositoryModelLoad(
        self, request: Any, context: Any
    ) -> pb.RepositoryModelLoadResponse:
        params = {k: parameter_value(v) for k, v in request.parameters.items()}
        await self.control.load_model(request.model_name, params)
        return pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(
        self, request: Any, context: Any
    ) -> pb.RepositoryModelUnloadResponse:
        dependents = "unload_dependents" in request.parameters and bool(
            request.parameters["unload_dependents"].bool_param
        )
        await self.control.unload_model(request.model_name, dependents)
        return pb.RepositoryModelUnloadResponse()

    # ---- CUDA shared memory (UNIMPLEMENTED with the reason where CUDA IPC is unavailable) -----

    async def CudaSharedMemoryStatus(
        self, request: Any, context: Any
    ) -> pb.CudaSharedMemoryStatusResponse:
        return convert.cuda_shared_memory_status(
            self.control.cuda_shared_memory_status(request.name)
        )

    async def CudaSharedMemoryRegister(
        self, request: Any, context: Any
    ) -> pb.CudaSharedMemoryRegisterResponse:
        await self.control.register_cuda_shared_memory(
            request.name, bytes(request.raw_handle), int(request.device_id), int(request.byte_size)
        )
        return pb.CudaSharedMemoryRegisterResponse()

    async def CudaSharedMemoryUnregister(
        self, request: Any, context: Any
    ) -> pb.CudaSharedMemoryUnregisterResponse:
        self.control.unregister_cuda_shared_memory(request.name)
        return pb.CudaSharedMemoryUnregisterResponse()

    # ---- system shared memory ----------------------------------------------------------------

    async def SystemSharedMemoryStatus(
        self, request: Any, context: Any
    ) -> pb.SystemSharedMemoryStatusResponse:
        return convert.system_shared_memory_status(
            self.control.system_shared_memory_status(request.name)
        )

    async def SystemSharedMemoryRegister(
        self, request: Any, context: Any
    ) -> pb.SystemSharedMemoryRegisterResponse:
        self.control.register_system_shared_memory(
            request.name, request.key, int(request.offset), int(request.byte_size)
        )
        return pb.SystemSharedMemoryRegisterResponse()

    async def SystemSharedMemoryUnregister(
        self, request: Any, context: Any
    ) -> pb.SystemSharedMemoryUnregisterResponse:
        self.control.unregister_system_shared_memory(request.name)
        return pb.SystemSharedMemoryUnregisterResponse()

    async def LogSettings(self, request: Any, context: Any) -> pb.LogSettingsResponse:
        changes = {key: _setting_value(value) for key, value in request.settings.items()}
        return convert.log_settings(self.control.log_settings(changes))

    async def TraceSetting(self, request: Any, context: Any) -> pb.TraceSettingResponse:
        changes = {key: list(value.value) for key, value in request.settings.items()}
        return convert.trace_settings(self.control.trace_settings(request.model_name, changes))

    # ---- inference ---------------------------------------------------------------------------

    def _infer(self, request: Any, context: grpc.ServicerContext) -> pb.ModelInferResponse:
        """ModelInfer, on its handler thread: run here by the thread lane when the model has an
        idle instance and nothing queued, else on the loop. The shared memory regions the
        request names are held until its response is encoded (unregistering one meanwhile
        waits for it); a request whose tensors carry no parameters names none."""
        if _may_name_regions(request):
            with self.shared_memory.request_scope():
                return self._infer_request(request, context)
        return self._infer_request(request, context)

    def _infer_request(self, request: Any, context: grpc.ServicerContext) -> pb.ModelInferResponse:
        loop = self._loop
        assert loop is not None
        shm = self.shared_memory
        # Admission before decoding: an overloaded model's refusal costs no decode or validation.
        with self.core.admit(request.model_name, request.model_version) as admission:
            decoded = decode_request(request, shm, self.limits)
            try:
                answer = self.core.infer_here(decoded, admission, loop, context.is_active)
                if isinstance(answer, Prepared):
                    answer = _Cancel(context).wait(loop, self.core.infer_prepared(answer))
            except DecoupledOnUnary as exc:  # tritonserver's words first
                raise Unsupported(f"{DECOUPLED_REFUSAL}: {exc.message}") from None
        return encode_response(answer, shm_targets(decoded.outputs), shm)

    def _stream(
        self, request_iterator: Iterator[bytes], context: grpc.ServicerContext
    ) -> Iterator[pb.ModelStreamInferResponse]:
        """ModelStreamInfer on its handler thread: the call bound, the stream limit and the
        access check here, then `ModelStreamInfer` on the loop, its requests read by a thread
        of the stream's own and its responses pulled one at a time as gRPC sends them."""
        loop = self._loop
        assert loop is not None
        bound, streams = self.bound, self.streams
        counted = bound.counts("ModelStreamInfer")  # one slot for as long as the stream is open
        taken = [False, False]
        try:
            if counted:
                bound.take()
                taken[0] = True
            streams.take()
            taken[1] = True
            check_access(self.restrictions, "ModelStreamInfer", context)
        except ApplianceError as exc:
            _give_back(bound, streams, taken)
            context.abort(GRPC_STATUS[exc.code], exc.message)
        requests = _ThreadRequests(request_iterator, loop)
        stream = self.ModelStreamInfer(requests, _LoopContext(context))
        cancel = _Cancel(context)
        try:
            while True:
                try:
                    item = cancel.wait(loop, _next(stream))
                except _Abort as exc:
                    context.abort(exc.code, exc.details)
                except _CANCELLED:
                    return
                if item is None:
                    return
                yield item
        finally:
            requests.close()
            asyncio.run_coroutine_threadsafe(stream.aclose(), loop)
            _give_back(bound, streams, taken)

    async def ModelStreamInfer(
        self, request_iterator: AsyncIterator[Any], context: Any
    ) -> AsyncGenerator[pb.ModelStreamInferResponse, None]:
        """Requests on a stream run concurrently, up to STREAM_MAX_IN_FLIGHT; each gets its
        responses, errors in-band. On the loop; `_stream` admits the stream first."""
        responses = _Outbox()
        slots = asyncio.Semaphore(STREAM_MAX_IN_FLIGHT)  # one per request read, until answered
        pending: set[asyncio.Task[None]] = set()
        malformed: list[str] = []  # why a request message did not parse: the stream ends

        async def one(request: Any) -> None:
            final_flag = "triton_enable_empty_final_response" in request.parameters and (
                request.parameters["triton_enable_empty_final_response"].bool_param
            )
            try:
                # This request's shared memory regions are held until it is answered.
                with self.shared_memory.request_scope():
                    decoupled = final_flag and self.core.is_decoupled(
                        request.model_name, request.model_version
                    )
                    shm = self.shared_memory
                    decoded = decode_request(request, shm, self.limits)
                    targets = shm_targets(decoded.outputs)
                    async for response in self.core.infer_stream(decoded):
                        result = encode_response(response, targets, shm)
                        if final_flag:  # a non-decoupled model's only response is the final one
                            result.parameters["triton_final_response"].bool_param = not decoupled
                        size = sum(tensor.data.nbytes for tensor in response.outputs)
                        del response  # its arrays: the message holds their bytes
                        await responses.put(
                            pb.ModelStreamInferResponse(infer_response=result), size
                        )
                    if final_flag and decoupled:  # an empty response closes the request
                        final = pb.ModelInferResponse(
                            model_name=request.model_name,
                            model_version=request.model_version,
                            id=request.id,
                        )
                        final.parameters["triton_final_response"].bool_param = True
                        await responses.put(pb.ModelStreamInferResponse(infer_response=final))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                _, message = _status_of(exc)
                await responses.put(
                    pb.ModelStreamInferResponse(
                        error_message=message,
                        infer_response=pb.ModelInferResponse(
                            model_name=request.model_name,
                            model_version=request.model_version,
                            id=request.id,
                        ),
                    )
                )
            finally:
                slots.release()

        async def read() -> None:
            try:
                requests = request_iterator.__aiter__()
                while True:
                    await slots.acquire()  # backpressure: no read while the stream is full
                    try:
                        request = await requests.__anext__()
                    except StopAsyncIteration:
                        break
                    except DecodeError as exc:  # the requests read before it are answered
                        malformed.append(str(exc))
                        break
                    task = asyncio.ensure_future(one(request))
                    pending.add(task)
                    task.add_done_callback(pending.discard)
                if pending:
                    await asyncio.gather(*list(pending), return_exceptions=True)
            finally:
                await responses.put(None)

        reader = asyncio.ensure_future(read())
        try:
            while True:
                item = await responses.get()
                if item is None:
                    break
                yield item
            if malformed:
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"ModelStreamInfer: a request message does not parse: {malformed[0]}",
                )
        finally:
            reader.cancel()
            for task in list(pending):
                task.cancel()
            await asyncio.gather(reader, *pending, return_exceptions=True)


def _may_name_regions(request: Any) -> bool:
    """Whether a ModelInferRequest's tensors have parameters (where shared memory regions are
    named): those without hold no region."""
    return any(t.parameters for t in request.inputs) or any(o.parameters for o in request.outputs)


def _give_back(bound: CallBound, streams: StreamSlots, taken: list[bool]) -> None:
    """A stream's call-bound slot and stream slot, those it took (`taken`), once."""
    if taken[0]:
        bound.give_back()
    if taken[1]:
        streams.give_back()
    taken[0] = taken[1] = False


async def _next(
    stream: AsyncIterator[pb.ModelStreamInferResponse],
) -> pb.ModelStreamInferResponse | None:
    """A stream's next response, None at its end."""
    try:
        return await stream.__anext__()
    except StopAsyncIteration:
        return None


_END = object()  # a stream's requests ended (or the call did)


class _ThreadRequests:
    """A stream's request messages for the loop, parsed: each `__anext__` has the stream's
    reader thread read one more (and only then: the stream's bound on requests in flight holds
    the client back through HTTP/2 flow control). A message that does not parse raises its
    DecodeError; the call's end (the client cancelled) ends the requests."""

    def __init__(self, messages: Iterator[bytes], loop: asyncio.AbstractEventLoop) -> None:
        self._messages = messages
        self._loop = loop
        self._asks: queue.SimpleQueue[asyncio.Future[Any] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._read, name="grpc-stream-reader", daemon=True)
        self._thread.start()

    def __aiter__(self) -> _ThreadRequests:
        return self

    async def __anext__(self) -> Any:
        future = self._loop.create_future()
        self._asks.put(future)
        item = await future
        if item is _END:
            raise StopAsyncIteration
        return item

    def close(self) -> None:
        """No more reads: the thread ends once its read in progress (if any) returns."""
        self._asks.put(None)

    def _read(self) -> None:
        ended = False
        while (future := self._asks.get()) is not None:
            item: Any = _END
            if not ended:
                try:
                    item = pb.ModelInferRequest.FromString(next(self._messages))
                except DecodeError as exc:
                    item = exc
                except StopIteration:
                    ended = True
                except grpc.RpcError:  # the call was cancelled
                    ended = True
            try:
                self._loop.call_soon_threadsafe(_settle, future, item)
            except RuntimeError:  # the loop closed at exit
                return


def _settle(future: asyncio.Future[Any], item: Any) -> None:
    if future.done():  # the stream stopped waiting
        return
    if isinstance(item, BaseException):
        future.set_exception(item)
    else:
        future.set_result(item)


class _Outbox:
    """A stream's responses waiting for its client: at most STREAM_MAX_IN_FLIGHT of them, and
    STREAM_MAX_WAITING_BYTES of tensor data unless one alone is larger; `put` waits for room."""

    __slots__ = ("_bytes", "_queue", "_room")

    def __init__(self) -> None:
        self._queue: asyncio.Queue[tuple[pb.ModelStreamInferResponse | None, int]] = asyncio.Queue(
            STREAM_MAX_IN_FLIGHT
        )
        self._bytes = 0
        self._room = asyncio.Event()

    async def put(self, item: pb.ModelStreamInferResponse | None, size: int = 0) -> None:
        while size and self._bytes and self._bytes + size > STREAM_MAX_WAITING_BYTES:
            self._room.clear()
            await self._room.wait()
        self._bytes += size
        await self._queue.put((item, size))

    async def get(self) -> pb.ModelStreamInferResponse | None:
        item, size = await self._queue.get()
        if size:
            self._bytes -= size
            self._room.set()
        return item


def _setting_value(value: Any) -> Any:
    """A LogSettingsRequest.SettingValue as a plain value (None when none is set)."""
    choice = value.WhichOneof("parameter_choice")
    return None if choice is None else getattr(value, choice)
