"""Fuzz targets for the gRPC messages the server parses beyond ModelInferRequest (the stream,
repository and control messages, shared memory registration) and for the shared memory
registry itself. Each message comes from the fuzz bytes as grpcio would hand it over (protobuf
`FromString`), then goes through the same code the servicer runs (frontends/grpc/server.py):
the control service, with the runtime below it replaced by a stand-in that only records.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from typing import Any

import numpy as np
from google.protobuf.message import DecodeError

from appliance.common.errors import ApplianceError
from appliance.common.limits import RequestLimits
from appliance.common.protocol import service_pb2 as pb
from appliance.frontends.grpc.codec import decode_request, parameter_value
from appliance.ops.logs import LogSettings
from appliance.ops.trace import Tracer
from appliance.services.control import ControlService, ServerState
from appliance.services.shared_memory import (
    SHM_ROOT,
    SharedMemoryRegistry,
    ShmTarget,
    read_input,
    write_output,
)

LIMITS = RequestLimits()


class _Record:
    def __init__(self) -> None:
        self.versions = {1: object()}
        self.failed: dict[int, str] = {}
        self.reason = ""
        self.owned_dir = None


class _Registry:
    def find(self, name: str) -> None:
        return None

    def find_key(self, key: str) -> None:
        return None

    def copies(self, name: str) -> list[str]:
        return []


class Runtime:
    """The runtime below the control service: loads always succeed, nothing is read."""

    registry = _Registry()
    namespacing = False

    def copies_on_disk(self, name: str) -> list[str]:
        return []

    def require_explicit(self, mode: str) -> None:
        pass

    async def pin(self, name: str, version: int | None) -> None:
        pass

    async def load(self, name: str, override: Any, source: Any, retry_failed: bool = False) -> None:
        pass

    async def unload(self, name: str) -> None:
        pass

    async def unload_with_dependents(self, name: str) -> None:
        pass

    def record(self, name: str) -> _Record:
        return _Record()


_STATE: dict[str, Any] = {}


def _control() -> tuple[ControlService, asyncio.AbstractEventLoop]:
    if not _STATE:
        _STATE["loop"] = asyncio.new_event_loop()
        _STATE["control"] = ControlService(
            Runtime(),  # type: ignore[arg-type]  # the stand-in has what these calls use
            ServerState(),
            "explicit",
            False,
            allow_client_shm=True,
        )
    control: ControlService = _STATE["control"]
    control.tracer, control.logs = Tracer(), LogSettings()  # a fresh state for every input
    control.shared_memory = SharedMemoryRegistry()
    return control, _STATE["loop"]


def grpc_stream(data: bytes) -> None:
    """ModelStreamInfer: length-prefixed request messages as the stream reads them. One that
    does not parse ends the stream (DecodeError only: anything else would escape the stream's
    loop); each one that does is decoded as the stream decodes it."""
    shm = SharedMemoryRegistry()
    position = 0
    while position < len(data):
        size = int.from_bytes(data[position : position + 2], "little")
        raw = data[position + 2 : position + 2 + size]
        position += 2 + size
        try:
            request = pb.ModelInferRequest.FromString(raw)
        except DecodeError:
            return
        with contextlib.suppress(ApplianceError):
            decode_request(request, shm, LIMITS)


# The control messages, by the first byte of an input, and what the servicer does with each.
_MESSAGES: tuple[Any, ...] = (
    pb.RepositoryModelLoadRequest,
    pb.RepositoryModelUnloadRequest,
    pb.SystemSharedMemoryRegisterRequest,
    pb.SystemSharedMemoryStatusRequest,
    pb.SystemSharedMemoryUnregisterRequest,
    pb.CudaSharedMemoryRegisterRequest,
    pb.CudaSharedMemoryStatusRequest,
    pb.CudaSharedMemoryUnregisterRequest,
    pb.LogSettingsRequest,
    pb.TraceSettingRequest,
    pb.ModelMetadataRequest,
    pb.RepositoryIndexRequest,
)


def _setting_value(value: Any) -> Any:
    choice = value.WhichOneof("parameter_choice")
    return None if choice is None else getattr(value, choice)


async def _serve(control: ControlService, request: Any) -> None:
    """What frontends/grpc/server.py's method for the message calls, in its words."""
    if isinstance(request, pb.RepositoryModelLoadRequest):
        params = {k: parameter_value(v) for k, v in request.parameters.items()}
        # File overrides are written to a temporary folder: kept out, so that a long run does
        # not fill the disk (their names and contents are checked by the runtime's loader).
        params = {k: v for k, v in params.items() if not k.startswith("file:")}
        await control.load_model(request.model_name, params)
    elif isinstance(request, pb.RepositoryModelUnloadRequest):
        dependents = "unload_dependents" in request.parameters and bool(
            request.parameters["unload_dependents"].bool_param
        )
        await control.unload_model(request.model_name, dependents)
    elif isinstance(request, pb.SystemSharedMemoryRegisterRequest):
        if not _own_key(request.key):
            return
        control.register_system_shared_memory(
            request.name, request.key, int(request.offset), int(request.byte_size)
        )
    elif isinstance(request, pb.SystemSharedMemoryStatusRequest):
        control.system_shared_memory_status(request.name)
    elif isinstance(request, pb.SystemSharedMemoryUnregisterRequest):
        control.unregister_system_shared_memory(request.name)
    elif isinstance(request, pb.CudaSharedMemoryRegisterRequest):
        await control.register_cuda_shared_memory(
            request.name, bytes(request.raw_handle), int(request.device_id), int(request.byte_size)
        )
    elif isinstance(request, pb.CudaSharedMemoryStatusRequest):
        control.cuda_shared_memory_status(request.name)
    elif isinstance(request, pb.CudaSharedMemoryUnregisterRequest):
        control.unregister_cuda_shared_memory(request.name)
    elif isinstance(request, pb.LogSettingsRequest):
        control.log_settings({k: _setting_value(v) for k, v in request.settings.items()})
    elif isinstance(request, pb.TraceSettingRequest):
        changes = {key: list(value.value) for key, value in request.settings.items()}
        control.trace_settings("", changes)  # a model's: the runtime's record (stand-in)


def grpc_control(data: bytes) -> None:
    """A repository, shared memory, log or trace message (chosen by the first byte)."""
    if not data:
        return
    kind = _MESSAGES[data[0] % len(_MESSAGES)]
    try:
        request = kind.FromString(data[1:])
    except DecodeError:
        return  # grpcio answers INTERNAL "failed to deserialize" before the servicer runs
    control, loop = _control()
    try:
        loop.run_until_complete(_serve(control, request))
    except ApplianceError:
        pass
    finally:
        control.shared_memory.unregister()


# -- the shared memory registry ------------------------------------------------------------------

# Removed at exit; under atheris (whose exit skips atexit) fuzz.run names it and removes it.
SHM_NAME = os.environ.get("EDGE_FUZZ_SHM") or f"edge-fuzz-{os.getpid()}"
SHM_BYTES = 256
_made: list[str] = []


def _own_key(key: str) -> bool:
    """Whether `key` names no shared memory object but this process's own (the fuzzer must
    never open, let alone write, another program's)."""
    name = key.lstrip("/")
    if name == SHM_NAME:
        return True
    try:
        return not os.path.lexists(os.path.join(SHM_ROOT, name))
    except ValueError:  # a NUL: no object has that name
        return True


def _object() -> None:
    if not _made:
        path = os.path.join(SHM_ROOT, SHM_NAME)
        with open(path, "wb") as handle:
            handle.write(bytes(SHM_BYTES))
        _made.append(path)
        import atexit

        atexit.register(lambda: os.path.exists(path) and os.unlink(path))


def _number(data: bytes, at: int) -> int:
    """Eight bytes as a signed number, mostly small (the edges come from the high bytes)."""
    raw = int.from_bytes(data[at : at + 8].ljust(8, b"\0"), "little", signed=True)
    return raw if abs(raw) > 1 << 62 else raw % 1024 - 16


def shm_registry(data: bytes) -> None:
    """Register a window of this process's own shared memory object with fuzzed key
    decorations, offsets and sizes, then read inputs from it and write outputs into it with
    fuzzed windows, datatypes and shapes; only InvalidInput (and its kin) may come out."""
    _object()
    registry = SharedMemoryRegistry()
    key = ("/" * (data[0] % 3) if data else "") + SHM_NAME
    if len(data) > 1 and data[1] & 1:
        key += data[2:6].decode("latin-1")  # mostly a name no object has
    offset, byte_size = _number(data, 6), _number(data, 14)
    datatypes = ("INT32", "FP32", "BYTES", "BOOL", "UINT8", "FP64", "X")
    try:
        if _own_key(key) and "\0" not in key:  # the control service refuses a NUL first
            registry.register("r", key, offset, byte_size)
        target = ShmTarget("r", _number(data, 22), _number(data, 30))
        datatype = datatypes[(data[38] if len(data) > 38 else 0) % len(datatypes)]
        shape = tuple(b % 9 for b in data[39:42])
        with registry.request_scope():
            read_input(registry, target, datatype, shape, "input 'x'", LIMITS)
        array = np.frombuffer(data[42:] or b"\0", dtype=np.uint8)
        if datatype == "BYTES":
            array = np.array([data[42:]], dtype=np.object_)
        with registry.request_scope():
            write_output(registry, target, array, datatype if datatype != "X" else "UINT8", "o")
    except ApplianceError:
        pass
    finally:
        registry.unregister()
