"""Triton's system shared memory extension: regions a local client registers, tensors in them.

A client creates a POSIX shared memory object (`tritonclient.utils.shared_memory`, or
`shm_open` in any language) and registers a window of it under a name: key, offset, byte
size. The window is mapped once, at registration. A request then names, per input, the region,
an offset into the window and a byte size, and the server reads the tensor from there without
a copy: the array handed to the backend is a view of the mapping. Outputs may name a region
too; the server writes the result there and the response carries only its shape.

Unregistering while requests use a region is safe: the registry forgets it, and the mapping
stays alive for as long as any request's arrays still view it (the arrays hold the mmap), then
closes. Every offset and size is checked against the window on every request.
"""

from __future__ import annotations

import mmap
import os
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from appliance.errors import ApplianceError, ErrorCode, InvalidInput, ModelNotFound
from appliance.limits import RequestLimits
from appliance.serialization import decode_bytes, encode_bytes
from appliance.services.cuda_shared_memory import CudaMemoryAccess, CudaRegion
from appliance.tensors import datatype, element_count
from appliance.types import Array, RequestedOutput, ShmTarget

SHM_ROOT = "/dev/shm"


class RegionExists(ApplianceError):
    code = ErrorCode.ALREADY_EXISTS


@dataclass(frozen=True)
class Region:
    name: str
    key: str
    offset: int
    byte_size: int
    view: memoryview  # the registered window: [offset, offset + byte_size) of the object

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "key": self.key, "offset": self.offset,
                "byte_size": self.byte_size}


def _map(key: str, offset: int, byte_size: int) -> memoryview:
    """Map [offset, offset + byte_size) of the shared memory object `key` read-write."""
    name = key.lstrip("/")
    if not name or "/" in name:
        raise InvalidInput(f"shared memory key '{key}' is not a POSIX shared memory name")
    path = os.path.join(SHM_ROOT, name)
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError as exc:
        raise InvalidInput(
            f"unable to open shared memory region key '{key}': {exc.strerror}"
        ) from None
    try:
        size = os.fstat(fd).st_size
        if offset + byte_size > size:
            raise InvalidInput(
                f"shared memory key '{key}' is {size} bytes; offset {offset} + byte_size "
                f"{byte_size} lies beyond its end"
            )
        # mmap offsets must be page-aligned: map from the page start, view from the offset.
        start = offset - offset % mmap.ALLOCATIONGRANULARITY
        mapping = mmap.mmap(fd, byte_size + offset - start, offset=start)
    finally:
        os.close(fd)
    return memoryview(mapping)[offset - start :]


class SharedMemoryRegistry:
    """The registered system and CUDA shared memory regions, by name (one namespace, as in
    Triton). Thread-safe."""

    def __init__(self, cuda: CudaMemoryAccess | None = None) -> None:
        self._regions: dict[str, Region | CudaRegion] = {}
        self._lock = threading.Lock()
        self._cuda = cuda or CudaMemoryAccess()

    def register_cuda(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        if not name:
            raise InvalidInput("a CUDA shared memory region needs a name")
        with self._lock:
            if name in self._regions:
                raise RegionExists(f"shared memory region '{name}' already in manager")
        region = self._cuda.open(name, raw_handle, device_id, byte_size)
        with self._lock:
            if name not in self._regions:
                self._regions[name] = region
                return
        self._cuda.close(region)
        raise RegionExists(f"shared memory region '{name}' already in manager")

    def unregister_cuda(self, name: str = "") -> None:
        with self._lock:
            names = [name] if name else list(self._regions)
            gone = [r for n in names if isinstance(r := self._regions.get(n), CudaRegion)]
            for region in gone:
                del self._regions[region.name]
        for region in gone:
            self._cuda.close(region)

    def cuda_status(self, name: str = "") -> list[dict[str, Any]]:
        with self._lock:
            found = [r for n, r in sorted(self._regions.items())
                     if isinstance(r, CudaRegion) and (not name or n == name)]
        if name and not found:
            raise ModelNotFound(f"Unable to find cuda shared memory region: '{name}'")
        return [r.status() for r in found]

    def cuda_region(self, name: str) -> CudaRegion | None:
        region = self._regions.get(name)
        return region if isinstance(region, CudaRegion) else None

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        if not name:
            raise InvalidInput("a shared memory region needs a name")
        if type(offset) is not int or offset < 0:
            raise InvalidInput(f"shared memory region '{name}': offset must be an integer >= 0")
        if type(byte_size) is not int or byte_size <= 0:
            raise InvalidInput(f"shared memory region '{name}': byte_size must be an integer > 0")
        with self._lock:
            if name in self._regions:
                raise RegionExists(f"shared memory region '{name}' already in manager")
        view = _map(key, offset, byte_size)
        with self._lock:
            if name in self._regions:
                raise RegionExists(f"shared memory region '{name}' already in manager")
            self._regions[name] = Region(name, key, offset, byte_size, view)

    def unregister(self, name: str = "") -> None:
        """Forget one region ('' : all). Requests still using it keep their mapping."""
        with self._lock:
            for key in [name] if name else list(self._regions):
                if isinstance(self._regions.get(key), Region):
                    del self._regions[key]

    def status(self, name: str = "") -> list[dict[str, Any]]:
        with self._lock:
            if name:
                region = self._regions.get(name)
                if not isinstance(region, Region):
                    raise ModelNotFound(
                        f"Unable to find system shared memory region: '{name}'"
                    )
                return [region.status()]
            return [r.status() for _, r in sorted(self._regions.items()) if isinstance(r, Region)]

    def window(self, name: str, offset: int, byte_size: int, where: str) -> memoryview:
        """`byte_size` bytes at `offset` in a registered region, bounds-checked."""
        region = self._regions.get(name)
        if region is None:
            raise InvalidInput(f"{where}: unable to find shared memory region: '{name}'")
        if offset < 0 or byte_size < 0 or offset + byte_size > region.byte_size:
            raise InvalidInput(
                f"{where}: invalid offset + byte size for shared memory region '{name}': "
                f"{offset} + {byte_size} > its {region.byte_size} bytes"
            )
        if isinstance(region, CudaRegion):  # device memory: a host copy of the window
            return self._cuda.read(region, offset, byte_size).data
        return region.view[offset : offset + byte_size]

    def write_window(self, name: str, offset: int, data: np.ndarray[Any, Any], where: str) -> None:
        """Copy bytes into a registered region, bounds-checked."""
        cuda = self.cuda_region(name)
        if cuda is None:
            window = self.window(name, offset, data.nbytes, where)
            np.frombuffer(window, dtype=np.uint8)[:] = data
            return
        if offset < 0 or offset + data.nbytes > cuda.byte_size:
            raise InvalidInput(
                f"{where}: invalid offset + byte size for shared memory region '{name}': "
                f"{offset} + {data.nbytes} > its {cuda.byte_size} bytes"
            )
        self._cuda.write(cuda, offset, data)


def _int_parameter(params: dict[str, Any], key: str, where: str, default: int | None) -> int:
    value = params.get(key, default)
    if type(value) is not int:
        raise InvalidInput(f"{where}: parameter '{key}' must be an integer, got {value!r}")
    return value


def shm_target(params: dict[str, Any], where: str) -> ShmTarget | None:
    """The shared memory window a tensor's parameters name, if any."""
    region = params.get("shared_memory_region")
    if region is None:
        return None
    if type(region) is not str:
        raise InvalidInput(f"{where}: 'shared_memory_region' must be a string")
    byte_size = _int_parameter(params, "shared_memory_byte_size", where, None)
    offset = _int_parameter(params, "shared_memory_offset", where, 0)
    return ShmTarget(region, offset, byte_size)


def shm_targets(outputs: list[RequestedOutput] | None) -> dict[str, ShmTarget]:
    """Output name -> its shared memory window, for the outputs that have one."""
    if not outputs:
        return {}
    return {o.name: o.shm for o in outputs if o.shm is not None}


def read_input(
    registry: SharedMemoryRegistry,
    target: ShmTarget,
    datatype_name: str,
    shape: tuple[int, ...],
    where: str,
    limits: RequestLimits | None = None,
) -> Array:
    """An input tensor viewed in place in a registered region (BYTES are decoded: a copy; a
    CUDA region is copied to the host). Sizes are checked before anything is read."""
    dtype = datatype(datatype_name, where)
    count = element_count(shape, where)
    if limits is not None:
        limits.check_elements(count, shape, where)
    if dtype.itemsize == 0:
        window = registry.window(target.region, target.offset, target.byte_size, where)
        return decode_bytes(window, count, where).reshape(shape)
    expected = count * dtype.itemsize
    if target.byte_size != expected:
        raise InvalidInput(
            f"{where}: shared_memory_byte_size {target.byte_size} does not match the "
            f"{expected} bytes of {datatype_name} with shape {list(shape)}"
        )
    window = registry.window(target.region, target.offset, target.byte_size, where)
    array: Array = np.frombuffer(window, dtype=dtype.numpy, count=count).reshape(shape)
    array.flags.writeable = False  # the client's memory: a backend must not write into it
    return array


def write_output(
    registry: SharedMemoryRegistry, target: ShmTarget, array: Array, datatype_name: str,
    where: str,
) -> int:
    """Copy an output into its region; the number of bytes written."""
    if datatype_name == "BYTES":
        data: Any = encode_bytes(array)
        size = len(data)
    else:
        wanted = np.ascontiguousarray(array, dtype=datatype(datatype_name, where).numpy)
        data, size = wanted, wanted.nbytes
    if size > target.byte_size:
        raise InvalidInput(
            f"{where}: the output is {size} bytes, more than shared_memory_byte_size "
            f"{target.byte_size} of region '{target.region}'"
        )
    registry.write_window(
        target.region, target.offset, np.frombuffer(data, dtype=np.uint8, count=size), where
    )
    return size
