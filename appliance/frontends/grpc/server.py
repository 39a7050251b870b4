"""Triton's GRPCInferenceService on the synchronous `grpc.server` (a thread pool) over the
inference and control services.

Unary ModelInfer runs on its handler thread from decoding to encoding: the inference service's
thread lane (`InferenceService.infer_here`, `DynamicScheduler.run_here`) runs the model there if an
instance is idle and nothing is queued, with no hand-off to the event loop; otherwise the
validated request goes to the loop (`asyncio.run_coroutine_threadsafe`) and is queued as any
other. Issue 20 measured, `simple` at c=8 on one core, server CPU per request: grpc.aio 448-500
us, its ceiling 323-374; the synchronous ceiling 199-215; a sync server handing every call to
the loop 461-487 (docs/benchmarks/history.md). ModelStreamInfer answers its requests on its handler
thread in the same way while the lane takes them, and on the loop otherwise
(frontends/grpc/stream.py). Every other RPC runs the servicer's async methods on the loop,
bridged by `_on_loop` and `_LoopContext`.

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
import threading
from collections.abc import Callable, Coroutine, Iterator, Sequence
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from appliance.common.access import Restrictions
from appliance.common.errors import ApplianceError, DecoupledOnUnary, Unsupported
from appliance.common.header_forward import HeaderForward
from appliance.common.limits import RequestLimits
from appliance.common.protocol import service_pb2 as pb
from appliance.common.protocol import service_pb2_grpc
from appliance.frontends.grpc import convert
from appliance.frontends.grpc.admission import CallBound, StreamSlots
from appliance.frontends.grpc.codec import (
    decode_request,
    encode_response,
    names_regions,
    parameter_value,
)
from appliance.frontends.grpc.stream import (  # the stream's bound, named here as before
    STREAM_MAX_IN_FLIGHT as STREAM_MAX_IN_FLIGHT,
)
from appliance.frontends.grpc.stream import (
    Malformed,
    StreamCancelled,
    StreamRun,
)
from appliance.frontends.status import GRPC_STATUS
from appliance.ops.logs import RATE_LIMITED
from appliance.services.control import ControlService
from appliance.services.inference import InferenceService, Prepared
from appliance.services.shared_memory import SharedMemoryRegistry, shm_targets

log = logging.getLogger(__name__)

_STREAMING = {"ModelStreamInfer"}
SERVICE = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]

# tritonserver's refusal of a decoupled model on ModelInfer (our explanation follows it).
DECOUPLED_REFUSAL = "ModelInfer RPC doesn't support models with decoupled transaction policy"
# Pool threads beyond the calls the call bound admits: health calls (never refused) and the
# refusals of calls past the bound run on them.
POOL_HEADROOM = 16
# The calls the pool has threads for when --grpc-max-concurrent-rpcs is 0 (no bound).
UNBOUNDED_CALLS = 256
# Of those calls, how many streams may never take: they stay for unary calls.
UNARY_RESERVE = 8

_CANCELLED = (asyncio.CancelledError, concurrent.futures.CancelledError)

# tritonserver's --grpc-infer-response-compression-level sets a level on each ModelInfer and
# ModelStreamInfer call (no other), which gRPC core turns into an algorithm the client takes:
# low the first of gzip and deflate, medium and high the second. Both are zlib's DEFLATE at the
# same effort (the level picks a framing, not an effort), and grpcio's Python server can only
# name an algorithm per call, not a level, nor see what the client takes: every level is gzip
# here, the one that gRPC clients in every language decode by default (grpc-java's default
# registry has no deflate).
RESPONSE_COMPRESSION = {
    "none": None,
    "low": grpc.Compression.Gzip,
    "medium": grpc.Compression.Gzip,
    "high": grpc.Compression.Gzip,
}


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


# Each RPC's API group for --grpc-restricted-protocol (appliance/common/access.py).
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
    control service registers them in); `limits` are checked on declared shapes while decoding;
    `header_forward`: the metadata infer requests give the model as parameters (None: none).
    """

    def __init__(
        self,
        inference: InferenceService,
        control: ControlService,
        restrictions: Restrictions | None = None,
        *,
        shared_memory: SharedMemoryRegistry,
        limits: RequestLimits,
        max_concurrent_rpcs: int = 0,
        header_forward: HeaderForward | None = None,
        compression_level: str = "none",
    ) -> None:
        self.inference = inference
        self.control = control
        self.restrictions = restrictions
        self.shared_memory = shared_memory
        self.limits = limits
        # Calls in flight, all connections together, past which a call is refused at once.
        self.bound = CallBound(max_concurrent_rpcs)
        # Streams open, past which one is refused: each holds a pool thread for its life.
        self.streams = StreamSlots(stream_limit(max_concurrent_rpcs))
        # ModelInfer and ModelStreamInfer responses (None: not compressed, the default).
        self.compression = RESPONSE_COMPRESSION[compression_level]
        self._loop: asyncio.AbstractEventLoop | None = None
        # --grpc-header-forward-pattern: None without it (the infer path never looks further).
        self.header_forward = header_forward

    def add_to_server(self, server: grpc.Server, loop: asyncio.AbstractEventLoop) -> None:
        """Serve every RPC on `server` (whose pool threads run the handlers; the servicer's
        async methods run on `loop`), each unary one wrapped once with the call bound, the
        access check, its request's parsing and the one error mapping.

        Methods are registered without a request deserializer, so that the wrapper parses the
        bytes: gRPC's own deserializing turns a message that does not parse into an error
        with a traceback logged per call; parsing in the wrapper makes it INVALID_ARGUMENT,
        unlogged, for the same work on a good message. ModelStreamInfer's messages are parsed
        by the stream (`StreamRun`), which answers a DecodeError.
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
            if name == "ModelInfer" and self.compression is not None:
                run = _compressed(run, self.compression)  # only then: nothing per call without
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
        if names_regions(request):
            with self.shared_memory.request_scope():
                return self._infer_request(request, context, True)
        return self._infer_request(request, context, False)

    def _infer_request(
        self, request: Any, context: grpc.ServicerContext, scoped: bool
    ) -> pb.ModelInferResponse:
        """`scoped`: in a shared memory request scope, the request's tensors having parameters
        (its outputs may name regions to write to)."""
        loop = self._loop
        assert loop is not None
        inference = self.inference
        shm = self.shared_memory
        # Admission before decoding: an overloaded model's refusal (or an unknown model's, a
        # decoupled one's) costs no decode or validation.
        try:
            with inference.admit(request.model_name, request.model_version) as admission:
                decoded = decode_request(request, shm, self.limits)
                if self.header_forward is not None:  # after decoding, as tritonserver
                    metadata = context.invocation_metadata() or ()
                    decoded.parameters.update(self.header_forward.parameters(metadata))
                answer = inference.infer_here(decoded, admission, loop, context.is_active)
                if isinstance(answer, Prepared):
                    answer = _Cancel(context).wait(loop, inference.infer_prepared(answer))
        except DecoupledOnUnary as exc:  # tritonserver's words first
            raise Unsupported(f"{DECOUPLED_REFUSAL}: {exc.message}") from None
        if scoped:
            return encode_response(answer, shm_targets(decoded.outputs), shm)
        return encode_response(answer)

    def _stream(
        self, request_iterator: Iterator[bytes], context: grpc.ServicerContext
    ) -> Iterator[pb.ModelStreamInferResponse]:
        """ModelStreamInfer on its handler thread: the call bound, the stream limit and the
        access check here, then the stream's requests, answered on this thread while the thread
        lane takes them and on the loop otherwise (frontends/grpc/stream.py)."""
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
        if self.compression is not None:
            context.set_compression(self.compression)
        run = StreamRun(
            request_iterator,
            context,
            loop,
            self.inference,
            self.shared_memory,
            self.limits,
            _status_of,
            self.header_forward,
        )
        try:
            yield from run.responses()
        except StreamCancelled:
            return
        except Malformed as exc:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"ModelStreamInfer: a request message does not parse: {exc}",
            )
        finally:
            _give_back(bound, streams, taken)


def _compressed(
    run: Callable[[Any, grpc.ServicerContext], Any], compression: grpc.Compression
) -> Callable[[Any, grpc.ServicerContext], Any]:
    """`run` with its response compressed with `compression`."""

    def compressed(request: Any, context: grpc.ServicerContext) -> Any:
        context.set_compression(compression)
        return run(request, context)

    return compressed


def _give_back(bound: CallBound, streams: StreamSlots, taken: list[bool]) -> None:
    """A stream's call-bound slot and stream slot, those it took (`taken`), once."""
    if taken[0]:
        bound.give_back()
    if taken[1]:
        streams.give_back()
    taken[0] = taken[1] = False


def _setting_value(value: Any) -> Any:
    """A LogSettingsRequest.SettingValue as a plain value (None when none is set)."""
    choice = value.WhichOneof("parameter_choice")
    return None if choice is None else getattr(value, choice)
