"""Triton's CUDA shared memory extension: device memory a local client shares by IPC handle.

The client allocates GPU memory, takes its `cudaIpcMemHandle_t` (64 bytes) and registers it
with a name, device id and byte size; the server opens the handle once, at registration.
Inputs named in such a region are copied from the device to host memory for the backend (the
ONNX Runtime and Python backends take host arrays); outputs are copied back into the region.
The copies run on a non-blocking stream of the region's own, so they never wait for inference
on the GPU; they run where the codecs run (the event loop), which is fine for the tensor sizes
local clients send and would move to a worker thread if large tensors showed otherwise.
Region names share one namespace with system shared memory regions, as in Triton.

Unlike a system shared memory object, a device allocation cannot shrink under the server: its
size is checked against the allocation (`cuMemGetAddressRange`) at registration, every copy is
bounds-checked against the registered size, and the opened handle keeps the allocation alive
until it is closed, even after the client frees it. A copy the device still refuses is the
client's region at fault: INVALID_ARGUMENT naming the region, not an internal error.

Where CUDA IPC does not exist (a Jetson's integrated GPU, as Triton says too) or no CUDA device
can be opened, registering fails with UNSUPPORTED and the reason, and status lists nothing.
Unverified on hardware until tests/gpu/run_device_checks.sh runs on a GPU machine.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from appliance.common.errors import InvalidInput, Unsupported
from appliance.ops.buildinfo import JETSON_RELEASE
from edge_backends.cuda_device import (
    CudaDevice,
    DeviceBuffer,
    DeviceError,
    DeviceUnavailable,
    open_device,
)


@dataclass(frozen=True)
class CudaRegion:
    name: str
    device_id: int
    byte_size: int
    buffer: DeviceBuffer
    device: CudaDevice
    stream: Any  # non-blocking: copies don't wait for inference running on the device

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "device_id": self.device_id, "byte_size": self.byte_size}


class CudaMemoryAccess:
    """Opens IPC handles and copies between them and host memory, one device at a time."""

    def __init__(self, jetson: bool | None = None) -> None:
        self._jetson = JETSON_RELEASE.exists() if jetson is None else jetson
        self._devices: dict[int, CudaDevice] = {}
        self._lock = threading.Lock()

    def _device(self, device_id: int) -> CudaDevice:
        if self._jetson:
            raise Unsupported(
                "CUDA shared memory is not supported on Jetson: its integrated GPU has no CUDA "
                "IPC; use system shared memory (the GPU shares the host's memory)"
            )
        with self._lock:
            if device_id not in self._devices:
                try:
                    self._devices[device_id] = open_device(device_id)
                except DeviceUnavailable as exc:
                    raise Unsupported(
                        f"CUDA shared memory is not available: no usable CUDA device "
                        f"{device_id} ({exc})"
                    ) from None
            return self._devices[device_id]

    def open(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> CudaRegion:
        if type(device_id) is not int or device_id < 0:
            raise InvalidInput(
                f"CUDA shared memory region '{name}': device_id must be an integer >= 0"
            )
        if type(byte_size) is not int or byte_size <= 0:
            raise InvalidInput(
                f"CUDA shared memory region '{name}': byte_size must be an integer > 0"
            )
        device = self._device(device_id)
        try:
            with device.activate():
                buffer = device.open_ipc(raw_handle, byte_size)
                stream = device.create_stream(non_blocking=True)
        except DeviceError as exc:
            raise InvalidInput(
                f"failed to register CUDA shared memory region '{name}': {exc}"
            ) from None
        return CudaRegion(name, device_id, byte_size, buffer, device, stream)

    @staticmethod
    def close(region: CudaRegion) -> None:
        with region.device.activate():
            region.device.destroy_stream(region.stream)
            region.device.close_ipc(region.buffer)

    @staticmethod
    def read(region: CudaRegion, offset: int, byte_size: int, where: str) -> np.ndarray[Any, Any]:
        """A host copy of [offset, offset + byte_size) of the region."""
        device = region.device
        host = np.empty(byte_size, dtype=np.uint8)
        try:
            with device.activate():
                device.copy_to_host(host, region.buffer, region.stream, offset)
                device.synchronize(region.stream)
        except DeviceError as exc:
            raise InvalidInput(_copy_failed(where, region, "read", exc)) from None
        return host

    @staticmethod
    def write(region: CudaRegion, offset: int, data: np.ndarray[Any, Any], where: str) -> None:
        device = region.device
        try:
            with device.activate():
                device.copy_to_device(region.buffer, data, region.stream, offset)
                device.synchronize(region.stream)
        except DeviceError as exc:
            raise InvalidInput(_copy_failed(where, region, "write", exc)) from None


def _copy_failed(where: str, region: CudaRegion, what: str, exc: DeviceError) -> str:
    return (
        f"{where}: cannot {what} CUDA shared memory region '{region.name}' on device "
        f"{region.device_id}: {exc}"
    )
