"""The device-memory layer on a real GPU: buffers, streams, pinned memory, copies, IPC handles,
through each binding library present (pycuda, cuda-python)."""

from __future__ import annotations

import multiprocessing
from typing import Any

import numpy as np
import pytest

from edge_backends.cuda_device import IPC_HANDLE_BYTES, DeviceError, open_device
from tests.gpu.conftest import available_libraries

pytestmark = pytest.mark.gpu
LIBRARIES = available_libraries() or [
    pytest.param("none", marks=pytest.mark.skip(reason="no CUDA device (pycuda / cuda-python)"))
]


@pytest.mark.parametrize("library", LIBRARIES)
def test_round_trip_through_pinned_memory_and_a_stream(library: str) -> None:
    device = open_device(0, library)
    data = np.random.default_rng(7).integers(0, 255, 3 << 20, dtype=np.uint8)
    with device.activate():
        stream = device.create_stream()
        assert device.stream_handle(stream) != 0
        buffer = device.alloc(data.nbytes)
        pinned = device.alloc_pinned(data.nbytes)
        pinned[:] = data
        device.copy_to_device(buffer, pinned, stream)
        back = device.alloc_pinned(data.nbytes)
        device.copy_to_host(back, buffer, stream)
        device.synchronize(stream)
        np.testing.assert_array_equal(back, data)
        # An offset window, on the default stream.
        window = np.empty(1000, dtype=np.uint8)
        device.copy_to_host(window, buffer, None, offset=12345)
        device.synchronize(None)
        np.testing.assert_array_equal(window, data[12345:13345])
        with pytest.raises(DeviceError, match="outside"):
            device.copy_to_host(window, buffer, stream, offset=data.nbytes - 10)
        free, total = device.memory_info()
        assert 0 < free <= total
        device.free(buffer)


def _child_fills(library: str, handle: bytes, size: int, value: int, done: Any) -> None:
    device = open_device(0, library)
    with device.activate():
        buffer = device.open_ipc(handle, size)
        device.copy_to_device(buffer, np.full(size, value, dtype=np.uint8), None)
        device.synchronize(None)
        device.close_ipc(buffer)
    done.put("ok")


@pytest.mark.parametrize("library", LIBRARIES)
def test_ipc_handle_shares_memory_with_another_process(library: str) -> None:
    device = open_device(0, library)
    size = 1 << 20
    with device.activate():
        buffer = device.alloc(size)
        handle = device.ipc_handle(buffer)
    assert len(handle) == IPC_HANDLE_BYTES
    context = multiprocessing.get_context("spawn")
    done = context.Queue()
    child = context.Process(target=_child_fills, args=(library, handle, size, 42, done))
    child.start()
    assert done.get(timeout=60) == "ok"
    child.join(30)
    host = np.empty(size, dtype=np.uint8)
    with device.activate():
        device.copy_to_host(host, buffer, None)
        device.synchronize(None)
        device.free(buffer)
    assert (host == 42).all()
