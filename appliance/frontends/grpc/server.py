"""grpc.aio servicer for Triton's GRPCInferenceService over the core and control plane."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from appliance.access import Restrictions
from appliance.errors import ApplianceError, DecoupledOnUnary, Unsupported
from appliance.frontends.grpc import convert
from appliance.frontends.grpc.admission import CallBound
from appliance.frontends.grpc.codec import decode_request, encode_response, parameter_value
from appliance.frontends.status import GRPC_STATUS
from appliance.limits import RequestLimits
from appliance.logs import RATE_LIMITED
from appliance.protocol import service_pb2 as pb
from appliance.protocol import service_pb2_grpc
from appliance.services.control import ControlService
from appliance.services.inference import InferenceService
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
    method: Callable[..., Any],
    name: str,
    parse: Callable[[bytes], Any],
    restrictions: Restrictions | None = None,
    bound: CallBound | None = None,
) -> Callable[..., Any]:
    """The call bound, the access restriction, the request's parsing and the one error mapping
    around a unary RPC, which grpc.aio hands its message's bytes (see `add_to_server`)."""
    slots = bound if bound is not None and bound.counts(name) else None

    async def guarded(raw: bytes, context: grpc.aio.ServicerContext) -> Any:
        if log.isEnabledFor(logging.DEBUG):
            log.debug("gRPC call: %s", name)
        taken = False
        try:
            if slots is not None:
                slots.take()
                taken = True
            check_access(restrictions, name, context)
            return await method(parse(raw), context)
        except asyncio.CancelledError:
            raise
        except DecodeError as exc:  # the client's bytes: no traceback, no log line
            code, message = grpc.StatusCode.INVALID_ARGUMENT, _unparsable(name, exc)
        except Exception as exc:
            code, message = _status_of(exc)
        finally:
            if taken and slots is not None:
                slots.give_back()
        await context.abort(code, message)

    return guarded


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

    def add_to_server(self, server: grpc.aio.Server) -> None:
        """Serve every RPC on `server`, each unary one wrapped once with the call bound, the
        access check, its request's parsing and the one error mapping.

        Unary methods are registered without a request deserializer, so that their wrapper
        parses the bytes: grpc.aio's own deserializing turns a message that does not parse
        into UNKNOWN "Unexpected DecodeError" and logs a traceback per call; parsing in the
        wrapper makes it INVALID_ARGUMENT, unlogged, for the same work on a good message.
        ModelStreamInfer's messages come from grpc.aio's request iterator, whose DecodeError
        the stream answers itself.
        """
        handlers: dict[str, grpc.RpcMethodHandler] = {}
        for method in SERVICE.methods:
            name = method.name
            request = getattr(pb, method.input_type.name)
            response = getattr(pb, method.output_type.name)
            if name in _STREAMING:
                handlers[name] = grpc.stream_stream_rpc_method_handler(
                    getattr(self, name),
                    request_deserializer=request.FromString,
                    response_serializer=response.SerializeToString,
                )
                continue
            guarded = _guard_unary(
                getattr(self, name), name, request.FromString, self.restrictions, self.bound
            )
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

    async def ModelInfer(self, request: Any, context: Any) -> pb.ModelInferResponse:
        shm = self.shared_memory
        # The regions the request names are held until its response is encoded (unregistering
        # one meanwhile waits for it). Admission before decoding: an overloaded model's refusal
        # costs no decode or validation.
        with shm.request_scope():
            with self.core.admit(request.model_name, request.model_version) as admission:
                decoded = decode_request(request, shm, self.limits)
                try:
                    response = await self.core.infer(decoded, admission)
                except DecoupledOnUnary as exc:  # tritonserver's words first
                    raise Unsupported(f"{DECOUPLED_REFUSAL}: {exc.message}") from None
            return encode_response(response, shm_targets(decoded.outputs), shm)

    async def ModelStreamInfer(
        self, request_iterator: AsyncIterator[Any], context: Any
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        """Requests on a stream run concurrently, up to STREAM_MAX_IN_FLIGHT; each gets its
        responses, errors in-band."""
        bound = self.bound
        counted = bound.counts("ModelStreamInfer")  # one slot for as long as the stream is open
        try:
            if counted:
                bound.take()
            try:
                check_access(self.restrictions, "ModelStreamInfer", context)
            except ApplianceError:
                if counted:
                    bound.give_back()
                raise
        except ApplianceError as exc:
            await context.abort(GRPC_STATUS[exc.code], exc.message)
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
            if counted:  # nothing between the slot and this `try` can be interrupted
                bound.give_back()
            reader.cancel()
            for task in list(pending):
                task.cancel()
            await asyncio.gather(reader, *pending, return_exceptions=True)


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
