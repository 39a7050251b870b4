"""Copies in and out of shared memory regions when the client's object changes under them.

System shared memory: the size is checked before every copy, and an object shrunk between the
check and the copy gives a short read (refused), never SIGBUS. CUDA shared memory: a copy the
device refuses is INVALID_ARGUMENT naming the region, not an internal error.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from appliance.common.errors import InvalidInput
from appliance.common.types import ShmTarget
from appliance.services import shared_memory
from appliance.services.cuda_shared_memory import CudaMemoryAccess
from appliance.services.shared_memory import SharedMemoryRegistry, read_input, write_output
from edge_backends.cuda_device import DeviceBuffer, DeviceError

SIZE = 4096


@pytest.fixture
def shm_object() -> Iterator[tuple[str, Path]]:
    key = f"/edge_unit_{uuid.uuid4().hex[:8]}"
    path = Path(shared_memory.SHM_ROOT) / key[1:]
    path.write_bytes(np.arange(SIZE // 4, dtype=np.int32).tobytes())
    yield key, path
    path.unlink(missing_ok=True)


@pytest.fixture
def registry(shm_object: tuple[str, Path]) -> SharedMemoryRegistry:
    registry = SharedMemoryRegistry()
    registry.register("r", shm_object[0], 1024, SIZE - 1024)
    return registry


def test_reads_and_writes_go_through_the_window(
    registry: SharedMemoryRegistry, shm_object: tuple[str, Path]
) -> None:
    array = read_input(registry, ShmTarget("r", 16, 64), "INT32", (16,), "input 'X'")
    np.testing.assert_array_equal(array, np.arange(16) + (1024 + 16) // 4)
    written = write_output(registry, ShmTarget("r", 0, 64), np.full(16, 7, np.int32), "INT32", "o")
    assert written == 64
    data = np.frombuffer(shm_object[1].read_bytes(), np.int32)
    np.testing.assert_array_equal(data[256:272], np.full(16, 7))
    assert shm_object[1].stat().st_size == SIZE


def test_a_shrunk_object_is_refused_before_reading_or_writing(
    registry: SharedMemoryRegistry, shm_object: tuple[str, Path]
) -> None:
    os.truncate(shm_object[1], 1024 + 32)
    with pytest.raises(InvalidInput, match=r"region 'r' .* is now 1056 bytes, too small for 64"):
        read_input(registry, ShmTarget("r", 0, 64), "INT32", (16,), "input 'X'")
    with pytest.raises(InvalidInput, match=r"^o: shared memory region 'r' .* is now 1056 bytes"):
        write_output(registry, ShmTarget("r", 0, 64), np.zeros(16, np.int32), "INT32", "o")
    assert shm_object[1].stat().st_size == 1024 + 32  # nothing was written


def test_a_shrink_between_the_check_and_the_copy_is_a_refusal(
    registry: SharedMemoryRegistry, shm_object: tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race, made deterministic: the object shrinks right after the size check."""
    check = shared_memory.Region._check_size

    def check_then_shrink(self: Any, offset: int, byte_size: int, where: str) -> int:
        position = check(self, offset, byte_size, where)
        os.truncate(shm_object[1], 1024)
        return position

    monkeypatch.setattr(shared_memory.Region, "_check_size", check_then_shrink)
    with pytest.raises(InvalidInput, match=r"is now 1024 bytes.*shrunk after it was registered"):
        read_input(registry, ShmTarget("r", 0, 64), "INT32", (16,), "input 'X'")


def test_unregistering_keeps_the_descriptor_until_the_last_copy(
    registry: SharedMemoryRegistry,
) -> None:
    region = registry._regions["r"]
    assert isinstance(region, shared_memory.Region)
    fd = region.descriptor.fd
    registry.unregister("r")
    os.fstat(fd)  # still open: this request's copy can still go through it
    assert region.read(0, 4, "input 'X'").nbytes == 4
    del region
    with pytest.raises(OSError, match="Bad file descriptor"):
        os.fstat(fd)


class FailingDevice:
    """A CUDA device whose copies fail, as a bad region would make them."""

    @contextlib.contextmanager
    def activate(self) -> Iterator[None]:
        yield

    def open_ipc(self, handle: bytes, nbytes: int) -> DeviceBuffer:
        return DeviceBuffer(0, nbytes, owned=False, handle=handle)

    def close_ipc(self, buffer: DeviceBuffer) -> None:
        pass

    def create_stream(self, non_blocking: bool = False) -> Any:
        return "stream"

    def destroy_stream(self, stream: Any) -> None:
        pass

    def copy_to_host(self, dst: Any, src: DeviceBuffer, stream: Any, offset: int = 0) -> None:
        raise DeviceError("cuMemcpyDtoHAsync: an illegal memory access was encountered")

    def copy_to_device(self, dst: DeviceBuffer, src: Any, stream: Any, offset: int = 0) -> None:
        raise DeviceError("cuMemcpyHtoDAsync: invalid argument")

    def synchronize(self, stream: Any) -> None:
        pass


class FailingAccess(CudaMemoryAccess):
    def __init__(self) -> None:
        super().__init__(jetson=False)

    def _device(self, device_id: int) -> Any:
        return FailingDevice()


def test_a_failed_device_copy_is_invalid_argument_naming_the_region() -> None:
    registry = SharedMemoryRegistry(FailingAccess())
    registry.register_cuda("gpu", b"A" * 64, 0, 256)
    with pytest.raises(InvalidInput, match="input 'X': cannot read CUDA shared memory region "
                       "'gpu' on device 0: cuMemcpyDtoHAsync: an illegal memory access"):
        read_input(registry, ShmTarget("gpu", 0, 64), "INT32", (16,), "input 'X'")
    with pytest.raises(InvalidInput, match="o: cannot write CUDA shared memory region 'gpu'"):
        write_output(registry, ShmTarget("gpu", 0, 64), np.zeros(16, np.int32), "INT32", "o")
