"""The CUDA side of the shared memory registry: one namespace with system regions, bounds,
unregistering, and the host copies in and out. The device is a host-memory stand-in with the
CudaDevice interface (the real one is tested on a GPU in tests/gpu/); without any device the
real access object refuses with the reason."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from appliance.common.errors import InvalidInput, ModelNotFound, RequestTooLarge, Unsupported
from appliance.common.limits import RequestLimits
from appliance.common.types import ShmTarget
from appliance.services.cuda_shared_memory import CudaMemoryAccess
from appliance.services.shared_memory import (
    RegionExists,
    SharedMemoryRegistry,
    read_input,
    write_output,
)
from edge_backends.cuda_device import DeviceBuffer, DeviceError, _check_ipc_size


class HostDevice:
    """Device memory kept in host arrays: what an IPC handle names is looked up in `shared`."""

    library = "host"
    name = "host stand-in"
    device_id = 0

    def __init__(self, shared: dict[bytes, np.ndarray[Any, Any]]) -> None:
        self.shared = shared
        self.closed: list[bytes] = []
        self.copied = 0  # bytes moved between "device" and host

    @contextlib.contextmanager
    def activate(self) -> Iterator[None]:
        yield

    def open_ipc(self, handle: bytes, nbytes: int) -> DeviceBuffer:
        if handle not in self.shared:
            raise DeviceError("cuIpcOpenMemHandle: invalid argument")
        return DeviceBuffer(0, nbytes, owned=False, handle=handle)

    def close_ipc(self, buffer: DeviceBuffer) -> None:
        self.closed.append(buffer.handle)

    def copy_to_host(self, dst: Any, src: DeviceBuffer, stream: Any, offset: int = 0) -> None:
        dst[:] = self.shared[src.handle][offset : offset + dst.nbytes]
        self.copied += dst.nbytes

    def copy_to_device(self, dst: DeviceBuffer, src: Any, stream: Any, offset: int = 0) -> None:
        self.shared[dst.handle][offset : offset + src.nbytes] = src
        self.copied += src.nbytes

    def create_stream(self, non_blocking: bool = False) -> Any:
        return "stream"

    def destroy_stream(self, stream: Any) -> None:
        pass

    def synchronize(self, stream: Any) -> None:
        pass


class HostAccess(CudaMemoryAccess):
    def __init__(self, device: HostDevice) -> None:
        super().__init__(jetson=False)
        self.device = device

    def _device(self, device_id: int) -> Any:
        return self.device


@pytest.fixture
def memory() -> dict[bytes, np.ndarray[Any, Any]]:
    return {b"A" * 64: np.zeros(256, dtype=np.uint8)}


@pytest.fixture
def device(memory: dict[bytes, np.ndarray[Any, Any]]) -> HostDevice:
    return HostDevice(memory)


@pytest.fixture
def registry(device: HostDevice) -> SharedMemoryRegistry:
    return SharedMemoryRegistry(HostAccess(device))


def test_inputs_are_read_from_the_region_and_outputs_written_back(
    registry: SharedMemoryRegistry, memory: dict[bytes, np.ndarray[Any, Any]]
) -> None:
    region = memory[b"A" * 64]
    region[:64] = np.arange(16, dtype=np.int32).view(np.uint8)
    registry.register_cuda("gpu", b"A" * 64, 0, 256)
    assert registry.cuda_status() == [{"name": "gpu", "device_id": 0, "byte_size": 256}]
    array = read_input(registry, ShmTarget("gpu", 0, 64), "INT32", (1, 16), "input 'X'")
    np.testing.assert_array_equal(array.reshape(-1), np.arange(16))
    written = write_output(
        registry, ShmTarget("gpu", 128, 64), np.full(16, 7, np.int32), "INT32", "output 'Y'"
    )
    assert written == 64
    np.testing.assert_array_equal(region[128:192].view(np.int32), np.full(16, 7))


def test_windows_outside_the_region_are_refused(registry: SharedMemoryRegistry) -> None:
    registry.register_cuda("gpu", b"A" * 64, 0, 256)
    with pytest.raises(InvalidInput, match=r"Invalid offset \+ byte size .*input 'X': 200 \+ 64"):
        read_input(registry, ShmTarget("gpu", 200, 64), "INT32", (16,), "input 'X'")
    with pytest.raises(InvalidInput, match="more than shared_memory_byte_size"):
        write_output(registry, ShmTarget("gpu", 0, 8), np.zeros(16, np.int32), "INT32", "out")


def test_sizes_are_checked_before_anything_is_copied(
    registry: SharedMemoryRegistry, device: HostDevice
) -> None:
    registry.register_cuda("gpu", b"A" * 64, 0, 256)
    with pytest.raises(InvalidInput, match="shared_memory_byte_size 256 does not match the 4"):
        read_input(registry, ShmTarget("gpu", 0, 256), "INT32", (1,), "input 'X'")
    with pytest.raises(RequestTooLarge, match="more than the limit of 10 per input"):
        read_input(
            registry, ShmTarget("gpu", 0, 256), "BYTES", (1, 10**9), "input 'X'",
            RequestLimits(max_tensor_elements=10),
        )
    assert device.copied == 0


def test_a_claim_larger_than_the_shared_allocation_is_refused() -> None:
    closed: list[DeviceBuffer] = []
    buffer = DeviceBuffer(0x1000, 1 << 34, owned=False)
    with pytest.raises(DeviceError, match="larger than the shared allocation"):
        _check_ipc_size(buffer, 16, closed.append)
    assert closed == [buffer]  # and the handle is closed again
    _check_ipc_size(DeviceBuffer(0x1000, 16, owned=False), 16, closed.append)


def test_names_are_shared_with_system_regions(registry: SharedMemoryRegistry) -> None:
    registry.register_cuda("gpu", b"A" * 64, 0, 256)
    with pytest.raises(RegionExists, match="already in manager"):
        registry.register_cuda("gpu", b"A" * 64, 0, 256)
    with pytest.raises(RegionExists, match="already in manager"):
        registry.register("gpu", "/some_key", 0, 64)
    # Each kind's status and unregister see only their own regions.
    assert registry.status() == []
    with pytest.raises(ModelNotFound, match="'gpu' is registered as CUDA shared memory, not sys"):
        registry.status("gpu")  # tritonserver's text
    registry.unregister()  # all system regions: the CUDA one stays
    assert [r["name"] for r in registry.cuda_status()] == ["gpu"]


def test_unregister_closes_the_handle(registry: SharedMemoryRegistry, device: HostDevice) -> None:
    registry.register_cuda("gpu", b"A" * 64, 0, 256)
    registry.unregister_cuda("gpu")
    assert device.closed == [b"A" * 64]
    assert registry.cuda_status() == []
    with pytest.raises(ModelNotFound, match="Unable to find cuda shared memory region: 'gpu'"):
        registry.cuda_status("gpu")
    with pytest.raises(InvalidInput, match="Unable to find shared memory region: 'gpu'"):
        read_input(registry, ShmTarget("gpu", 0, 64), "INT32", (16,), "input 'X'")


def test_bad_registrations_say_what_is_wrong(registry: SharedMemoryRegistry) -> None:
    with pytest.raises(InvalidInput, match="failed to register CUDA shared memory region 'x'"):
        registry.register_cuda("x", b"B" * 64, 0, 64)  # a handle that opens nothing
    with pytest.raises(InvalidInput, match="byte_size must be an integer > 0"):
        registry.register_cuda("x", b"A" * 64, 0, 0)
    with pytest.raises(InvalidInput, match="device_id must be an integer >= 0"):
        registry.register_cuda("x", b"A" * 64, -1, 64)
    assert registry.cuda_status() == []


def test_jetson_and_missing_devices_are_unsupported_with_the_reason() -> None:
    with pytest.raises(Unsupported, match="not supported on Jetson"):
        CudaMemoryAccess(jetson=True).open("x", b"A" * 64, 0, 64)
    with pytest.raises(Unsupported, match="no usable CUDA device 3"):
        CudaMemoryAccess(jetson=False).open("x", b"A" * 64, 3, 64)
