"""The device-memory layer: CUDA buffers, streams, pinned host memory, copies and IPC handles.

Everything that touches CUDA memory goes through `CudaDevice`, so the TensorRT backend and the
CUDA shared memory extension share one small, separately tested surface. Two implementations sit
behind it, tried in this order:

- pycuda (`pycuda.driver`), the TensorRT samples' choice; it builds from its source package
  against the CUDA toolkit where no wheel fits (JetPack, new CUDA majors).
- cuda-python (`cuda.bindings.driver`), NVIDIA's own bindings, shipped as wheels; used when
  pycuda is absent or cannot find a driver.

Both use the device's primary context (the one the CUDA runtime, TensorRT and ONNX Runtime use),
made current around each call with `activate()`: contexts are per thread, and model instances
run on worker threads that did not create them.

Example::

    device = open_device(0)
    with device.activate():
        stream = device.create_stream()
        buffer = device.alloc(1024)
        host = device.alloc_pinned(1024)
        host[:] = 7
        device.copy_to_device(buffer, host, stream)
        device.copy_to_host(host, buffer, stream)
        device.synchronize(stream)
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

log = logging.getLogger(__name__)

IPC_HANDLE_BYTES = 64  # sizeof(CUipcMemHandle)


class DeviceUnavailable(Exception):
    """No CUDA device can be used here; the message says why (no library, no driver, ...)."""


class DeviceError(Exception):
    """A CUDA call failed; the message names the call and CUDA's error."""


@dataclass(eq=False)
class DeviceBuffer:
    """`nbytes` of device memory at `ptr`; `owned` buffers are freed by `CudaDevice.free`,
    IPC-opened ones closed by `CudaDevice.close_ipc`."""

    ptr: int
    nbytes: int
    owned: bool = True
    handle: Any = None  # the library's own object, kept alive with the buffer


class CudaDevice(Protocol):
    """One CUDA device through one binding library."""

    library: str  # "pycuda" or "cuda-python"
    device_id: int
    name: str

    def activate(self) -> contextlib.AbstractContextManager[None]:
        """Make the device's primary context current on this thread for the block."""
        ...

    def alloc(self, nbytes: int) -> DeviceBuffer: ...

    def free(self, buffer: DeviceBuffer) -> None: ...

    def alloc_pinned(self, nbytes: int) -> np.ndarray[Any, np.dtype[np.uint8]]:
        """Page-locked host memory (fast, asynchronous copies), as a uint8 array."""
        ...

    def create_stream(self, non_blocking: bool = False) -> Any:
        """A new stream; `non_blocking` ones do not wait for work on the legacy default stream."""
        ...

    def stream_handle(self, stream: Any) -> int:
        """The raw cudaStream_t, for TensorRT's execute_async_v3."""
        ...

    def destroy_stream(self, stream: Any) -> None: ...

    def copy_to_device(
        self, dst: DeviceBuffer, src: np.ndarray[Any, Any], stream: Any, offset: int = 0
    ) -> None: ...

    def copy_to_host(
        self, dst: np.ndarray[Any, Any], src: DeviceBuffer, stream: Any, offset: int = 0
    ) -> None: ...

    def synchronize(self, stream: Any) -> None:
        """Wait for the stream's work; None: the context's (default-stream copies)."""
        ...

    def ipc_handle(self, buffer: DeviceBuffer) -> bytes:
        """The 64-byte handle another process opens the buffer with."""
        ...

    def open_ipc(self, handle: bytes, nbytes: int) -> DeviceBuffer:
        """Open another process's allocation; DeviceError when it is smaller than `nbytes`."""
        ...

    def close_ipc(self, buffer: DeviceBuffer) -> None: ...

    def memory_info(self) -> tuple[int, int]:
        """(free, total) bytes of device memory."""
        ...


def open_device(device_id: int = 0, library: str = "") -> CudaDevice:
    """The device through pycuda, else cuda-python ('library' forces one); DeviceUnavailable
    says why neither works."""
    reasons = []
    for name, factory in (("pycuda", PyCudaDevice), ("cuda-python", CudaPythonDevice)):
        if library and library != name:
            continue
        try:
            return factory(device_id)
        except DeviceUnavailable as exc:
            reasons.append(f"{name}: {exc}")
    raise DeviceUnavailable("; ".join(reasons) or f"unknown CUDA library '{library}'")


def _check_handle(handle: bytes) -> bytes:
    if len(handle) != IPC_HANDLE_BYTES:
        raise DeviceError(
            f"a CUDA IPC handle is {IPC_HANDLE_BYTES} bytes, got {len(handle)}"
        )
    return handle


def _host_pointer(array: np.ndarray[Any, Any]) -> int:
    if not array.flags.c_contiguous:
        raise DeviceError("host arrays copied to or from a device must be C-contiguous")
    return int(array.ctypes.data)


class PyCudaDevice:
    """CudaDevice through pycuda.driver."""

    library = "pycuda"

    def __init__(self, device_id: int) -> None:
        try:
            import pycuda.driver as cuda
        except ImportError as exc:  # also: libcuda.so missing (pycuda links the driver)
            raise DeviceUnavailable(f"cannot import pycuda.driver ({exc})") from exc
        try:
            cuda.init()
            count = cuda.Device.count()
            if device_id >= count:
                raise DeviceUnavailable(f"no CUDA device {device_id} ({count} found)")
            self._device = cuda.Device(device_id)
            self._context = self._device.retain_primary_context()
        except cuda.Error as exc:
            raise DeviceUnavailable(f"CUDA driver: {exc}") from exc
        self._cuda = cuda
        self.device_id = device_id
        self.name = str(self._device.name())

    @contextlib.contextmanager
    def activate(self) -> Iterator[None]:
        self._context.push()
        try:
            yield
        finally:
            self._cuda.Context.pop()

    def alloc(self, nbytes: int) -> DeviceBuffer:
        try:
            allocation = self._cuda.mem_alloc(max(1, nbytes))
        except self._cuda.Error as exc:
            raise DeviceError(f"cuMemAlloc({nbytes}): {exc}") from exc
        return DeviceBuffer(int(allocation), nbytes, handle=allocation)

    def free(self, buffer: DeviceBuffer) -> None:
        if buffer.owned and buffer.handle is not None:
            buffer.handle.free()
            buffer.handle = None

    def alloc_pinned(self, nbytes: int) -> np.ndarray[Any, np.dtype[np.uint8]]:
        try:
            array: np.ndarray[Any, np.dtype[np.uint8]] = self._cuda.pagelocked_empty(
                (max(1, nbytes),), np.uint8
            )
        except self._cuda.Error as exc:
            raise DeviceError(f"cuMemHostAlloc({nbytes}): {exc}") from exc
        return array[:nbytes]

    def create_stream(self, non_blocking: bool = False) -> Any:
        return self._cuda.Stream(flags=1 if non_blocking else 0)  # 1: CU_STREAM_NON_BLOCKING

    def stream_handle(self, stream: Any) -> int:
        return int(stream.handle)

    def destroy_stream(self, stream: Any) -> None:
        pass  # pycuda destroys a Stream when it is collected

    def copy_to_device(
        self, dst: DeviceBuffer, src: np.ndarray[Any, Any], stream: Any, offset: int = 0
    ) -> None:
        _bounds(dst, offset, src.nbytes)
        self._cuda.memcpy_htod_async(dst.ptr + offset, np.ascontiguousarray(src), stream)

    def copy_to_host(
        self, dst: np.ndarray[Any, Any], src: DeviceBuffer, stream: Any, offset: int = 0
    ) -> None:
        _bounds(src, offset, dst.nbytes)
        _host_pointer(dst)
        self._cuda.memcpy_dtoh_async(dst, src.ptr + offset, stream)

    def synchronize(self, stream: Any) -> None:
        if stream is None:
            self._cuda.Context.synchronize()
        else:
            stream.synchronize()

    def ipc_handle(self, buffer: DeviceBuffer) -> bytes:
        return bytes(self._cuda.mem_get_ipc_handle(buffer.ptr))

    def open_ipc(self, handle: bytes, nbytes: int) -> DeviceBuffer:
        try:
            opened = self._cuda.IPCMemoryHandle(bytearray(_check_handle(handle)))
            _, size = self._cuda.mem_get_address_range(int(opened))
        except self._cuda.Error as exc:
            raise DeviceError(f"cuIpcOpenMemHandle: {exc}") from exc
        buffer = DeviceBuffer(int(opened), nbytes, owned=False, handle=opened)
        _check_ipc_size(buffer, int(size), self.close_ipc)
        return buffer

    def close_ipc(self, buffer: DeviceBuffer) -> None:
        if buffer.handle is not None:
            buffer.handle.close()
            buffer.handle = None

    def memory_info(self) -> tuple[int, int]:
        free, total = self._cuda.mem_get_info()
        return int(free), int(total)


class CudaPythonDevice:
    """CudaDevice through cuda-python's driver API bindings (cuda.bindings.driver)."""

    library = "cuda-python"

    def __init__(self, device_id: int) -> None:
        try:
            from cuda.bindings import driver
        except ImportError:
            try:  # cuda-python before 12.6 named the module cuda.cuda
                from cuda import cuda as driver
            except ImportError as exc:
                raise DeviceUnavailable(f"cannot import cuda.bindings.driver ({exc})") from exc
        self._driver = driver
        try:
            self._call("cuInit", 0)
            count = self._call("cuDeviceGetCount")
        except (DeviceError, RuntimeError) as exc:  # RuntimeError: libcuda.so not found
            raise DeviceUnavailable(f"CUDA driver: {exc}") from exc
        if device_id >= count:
            raise DeviceUnavailable(f"no CUDA device {device_id} ({count} found)")
        self._device = self._call("cuDeviceGet", device_id)
        self._context = self._call("cuDevicePrimaryCtxRetain", self._device)
        raw_name = self._call("cuDeviceGetName", 256, self._device)
        self.name = bytes(raw_name).split(b"\0", 1)[0].decode(errors="replace")
        self.device_id = device_id

    def _call(self, name: str, *args: Any) -> Any:
        """Call a driver function; raise DeviceError on a CUresult other than success."""
        result = getattr(self._driver, name)(*args)
        status, values = result[0], result[1:]
        if int(status) != 0:
            _, text = self._driver.cuGetErrorString(status)
            detail = text.decode() if isinstance(text, bytes) else str(status)
            raise DeviceError(f"{name}: {detail}")
        if not values:
            return None
        return values[0] if len(values) == 1 else values

    @contextlib.contextmanager
    def activate(self) -> Iterator[None]:
        self._call("cuCtxPushCurrent", self._context)
        try:
            yield
        finally:
            self._call("cuCtxPopCurrent")

    def alloc(self, nbytes: int) -> DeviceBuffer:
        ptr = self._call("cuMemAlloc", max(1, nbytes))
        return DeviceBuffer(int(ptr), nbytes, handle=ptr)

    def free(self, buffer: DeviceBuffer) -> None:
        if buffer.owned and buffer.handle is not None:
            self._call("cuMemFree", buffer.handle)
            buffer.handle = None

    def alloc_pinned(self, nbytes: int) -> np.ndarray[Any, np.dtype[np.uint8]]:
        size = max(1, nbytes)
        ptr = int(self._call("cuMemHostAlloc", size, 0))
        storage = (ctypes.c_uint8 * size).from_address(ptr)
        array: np.ndarray[Any, np.dtype[np.uint8]] = np.frombuffer(storage, dtype=np.uint8)  # type: ignore[call-overload]
        weakref.finalize(storage, self._free_host, ptr)  # when the last view of it is gone
        return array[:nbytes]

    def _free_host(self, ptr: int) -> None:
        """Free pinned memory from whichever thread collects it: with the context current, and
        a failure logged rather than lost."""
        try:
            with self.activate():
                self._call("cuMemFreeHost", ptr)
        except DeviceError as exc:
            log.warning("pinned host memory at %#x was not freed: %s", ptr, exc)

    def create_stream(self, non_blocking: bool = False) -> Any:
        return self._call("cuStreamCreate", 1 if non_blocking else 0)

    def stream_handle(self, stream: Any) -> int:
        return int(stream)

    def destroy_stream(self, stream: Any) -> None:
        self._call("cuStreamDestroy", stream)

    def copy_to_device(
        self, dst: DeviceBuffer, src: np.ndarray[Any, Any], stream: Any, offset: int = 0
    ) -> None:
        _bounds(dst, offset, src.nbytes)
        src = np.ascontiguousarray(src)
        self._call(
            "cuMemcpyHtoDAsync", dst.ptr + offset, _host_pointer(src), src.nbytes, stream or 0
        )

    def copy_to_host(
        self, dst: np.ndarray[Any, Any], src: DeviceBuffer, stream: Any, offset: int = 0
    ) -> None:
        _bounds(src, offset, dst.nbytes)
        self._call(
            "cuMemcpyDtoHAsync", _host_pointer(dst), src.ptr + offset, dst.nbytes, stream or 0
        )

    def synchronize(self, stream: Any) -> None:
        if stream is None:
            self._call("cuCtxSynchronize")
        else:
            self._call("cuStreamSynchronize", stream)

    def ipc_handle(self, buffer: DeviceBuffer) -> bytes:
        handle = self._call("cuIpcGetMemHandle", buffer.ptr)
        return bytes(handle.reserved)

    def open_ipc(self, handle: bytes, nbytes: int) -> DeviceBuffer:
        raw = self._driver.CUipcMemHandle()
        raw.reserved = _check_handle(handle)
        flags = self._driver.CUipcMem_flags.CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
        ptr = self._call("cuIpcOpenMemHandle", raw, flags)
        buffer = DeviceBuffer(int(ptr), nbytes, owned=False, handle=ptr)
        _, size = self._call("cuMemGetAddressRange", ptr)
        _check_ipc_size(buffer, int(size), self.close_ipc)
        return buffer

    def close_ipc(self, buffer: DeviceBuffer) -> None:
        if buffer.handle is not None:
            self._call("cuIpcCloseMemHandle", buffer.handle)
            buffer.handle = None

    def memory_info(self) -> tuple[int, int]:
        free, total = self._call("cuMemGetInfo")
        return int(free), int(total)


def _check_ipc_size(buffer: DeviceBuffer, size: int, close: Any) -> None:
    """A client may claim more bytes than it shared: copies past the allocation would fault the
    whole context (every GPU model in the process), so refuse the claim."""
    if buffer.nbytes > size:
        close(buffer)
        raise DeviceError(
            f"byte_size {buffer.nbytes} is larger than the shared allocation ({size} bytes)"
        )


def _bounds(buffer: DeviceBuffer, offset: int, nbytes: int) -> None:
    if offset < 0 or offset + nbytes > buffer.nbytes:
        raise DeviceError(
            f"copy of {nbytes} bytes at offset {offset} lies outside a {buffer.nbytes}-byte "
            "device buffer"
        )

