"""Triton's system shared memory extension: regions a local client registers, tensors in them.

A client creates a POSIX shared memory object (`tritonclient.utils.shared_memory`, or
`shm_open` in any language) and registers a window of it under a name: key, offset, byte
size. The object is opened once, at registration, and its file descriptor kept. A request then
names, per input, the region, an offset into the window and a byte size; outputs may name a
region too, and the server writes the result there and the response carries only its shape.

The object belongs to the client, who can shrink it at any time (`ftruncate`). Touching a
mapping past the end of a shrunk object raises SIGBUS, which no Python code can catch: it
kills the server. So the server never maps a region. Every read and write first checks the
object's current size (`fstat`), refused with the region's name when the window no longer
fits, and then copies with `preadv`/`pwritev` on the descriptor: the kernel does the copy and
a shrink that races with it shows up as a short count (refused too), never as a fault. An
input is thus one copy out of the object, two to four times a memcpy's time (0.9 ms for 8 MiB;
docs/benchmarks/history.md, `python -m bench.shm_copy`).

Unregistering a region that requests use waits for them, as tritonserver does: a request holds
the regions it names from its decoding until its response is written (`request_scope`, entered
by the front end around each request), and unregistering a held region succeeds at once but
takes effect when the last request holding it is done; until then the region is still listed,
still usable, and its name still taken. Outside a request scope nothing is held: a region
unregistered before a request's output is written fails that request with tritonserver's
"Unable to find shared memory region". Every offset and size is checked against the window on
every request, with tritonserver's texts first.
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import os
import stat
import threading
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from appliance.common.errors import ApplianceError, ErrorCode, InvalidInput, ModelNotFound
from appliance.common.limits import RequestLimits
from appliance.common.serialization import decode_bytes, encode_bytes
from appliance.common.tensors import datatype, element_count
from appliance.common.types import Array, RequestedOutput, ShmTarget
from appliance.services.cuda_shared_memory import CudaMemoryAccess, CudaRegion

SHM_ROOT = "/dev/shm"


class RegionExists(ApplianceError):
    code = ErrorCode.ALREADY_EXISTS


class TooManyRegions(ApplianceError):
    """The cap on registered regions is reached (--max-shm-regions): each system region holds
    a file descriptor, and descriptors past the process's limit make every new connection
    fail. RESOURCE_EXHAUSTED, gRPC's code for a quota; HTTP answers 429."""

    code = ErrorCode.RESOURCE_EXHAUSTED


# Regions registered at once, by default (--max-shm-regions). Each system region holds a file
# descriptor; the server keeps at most half of its descriptor limit for regions, so that the
# rest stays for connections, model files and the Python models' pipes (`region_cap`).
DEFAULT_MAX_REGIONS = 1024


def region_cap(wanted: int, nofile_limit: int) -> int:
    """The regions that may be registered at once: `wanted`, but never more than half of the
    process's descriptor limit (RLIMIT_NOFILE), which keeps the rest for accepting
    connections."""
    return max(0, min(wanted, nofile_limit // 2))


class RegionNotFound(InvalidInput):
    """A request names a region that is not registered: NOT_FOUND, as tritonserver answers."""

    code = ErrorCode.NOT_FOUND


class RequestHolds:
    """The regions one request holds (name -> times held), until its response is written
    and `release` is called (once; again is harmless). As a context manager (what
    `SharedMemoryRegistry.request_holds` gives): the request in scope while the block runs."""

    __slots__ = ("_token", "names", "registry", "released")

    def __init__(self, registry: SharedMemoryRegistry) -> None:
        self.registry = registry
        self.names: dict[str, int] = {}
        self.released = False
        self._token: contextvars.Token[RequestHolds | None] | None = None

    def release(self) -> None:
        if not self.released:
            self.released = True
            if self.names:  # most requests name no region: nothing to give back
                self.registry._release(self)

    def __enter__(self) -> RequestHolds:
        self._token = _current.set(self)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._token is not None:
            _current.reset(self._token)
            self._token = None


# The request being decoded or answered on this task (SharedMemoryRegistry.request_scope).
_current: contextvars.ContextVar[RequestHolds | None] = contextvars.ContextVar(
    "shared_memory_request", default=None
)


class _Descriptor:
    """An open file descriptor, closed when the last holder lets go of it (a request copying
    through an unregistered region keeps it open; closing it under the copy could let the
    number be reused by another file)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._close = weakref.finalize(self, os.close, fd)


@dataclass(frozen=True)
class Region:
    name: str
    key: str
    offset: int
    byte_size: int
    descriptor: _Descriptor  # the shared memory object, opened read-write at registration

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "key": self.key, "offset": self.offset,
                "byte_size": self.byte_size}

    def _check_size(self, offset: int, byte_size: int, where: str) -> int:
        """The object's position of `offset` in the window; refused when the object has
        shrunk since registration so that the bytes are no longer there."""
        start = self.offset + offset
        size = os.fstat(self.descriptor.fd).st_size
        if start + byte_size > size:
            raise InvalidInput(self._shrunk(where, size, offset, byte_size))
        return start

    def _shrunk(self, where: str, size: int, offset: int, byte_size: int) -> str:
        return (
            f"{where}: shared memory region '{self.name}' (key '{self.key}') is now {size} "
            f"bytes, too small for {byte_size} bytes at offset {offset} of its window (which "
            f"starts at {self.offset}): the object was shrunk after it was registered"
        )

    def read(self, offset: int, byte_size: int, where: str) -> np.ndarray[Any, Any]:
        """A copy of `byte_size` bytes at `offset` in the window (uint8)."""
        position = self._check_size(offset, byte_size, where)
        data = np.empty(byte_size, dtype=np.uint8)
        view = data.data
        done = 0
        while done < byte_size:  # Linux moves at most about 2 GiB per call
            count = self._io(os.preadv, view[done:], position + done, where)
            if count == 0:  # shrunk between the size check and the copy
                size = os.fstat(self.descriptor.fd).st_size
                raise InvalidInput(self._shrunk(where, size, offset, byte_size))
            done += count
        return data

    def write(self, offset: int, data: np.ndarray[Any, Any], where: str) -> None:
        """Copy `data` (contiguous bytes) to `offset` in the window."""
        position = self._check_size(offset, data.nbytes, where)
        view = data.data.cast("B")
        done = 0
        while done < len(view):
            # A shrink racing with this write makes the kernel grow the object back up to
            # the end of what is written (inside the window): harmless, and no fault.
            count = self._io(os.pwritev, view[done:], position + done, where)
            if count == 0:
                raise InvalidInput(f"{where}: shared memory region '{self.name}' takes no data")
            done += count

    def _io(self, call: Any, view: memoryview, position: int, where: str) -> int:
        try:
            return int(call(self.descriptor.fd, [view], position))
        except OSError as exc:  # e.g. ENOSPC: the client's tmpfs is full
            raise InvalidInput(
                f"{where}: shared memory region '{self.name}' (key '{self.key}'): {exc.strerror}"
            ) from None


_SIZE_MAX = 2**64 - 1

# Keys of the Python backend's own regions, which no client may register (as tritonserver).
RESERVED_KEY_PREFIX = "triton_python_backend_shm_region_"
# This server's Python-model tensor arenas (edge_backends/python/shm.py PREFIX): named in
# /dev/shm only until both sides have mapped them, but a client must never map one meanwhile.
ARENA_KEY_PREFIX = "edge-py-"


def _open(name: str, key: str, offset: int, byte_size: int) -> _Descriptor:
    """Open the shared memory object `key` read-write; its window must lie inside it.
    tritonserver's texts first, then what was found."""
    object_name = key.lstrip("/")
    if not object_name:
        raise InvalidInput(
            f"cannot register shared memory region '{name}' - invalid shm key '{key}'"
        )
    for reserved in (RESERVED_KEY_PREFIX, ARENA_KEY_PREFIX):
        if object_name.startswith(reserved):
            raise InvalidInput(
                f"cannot register shared memory region '{name}' with key '{key}' as the key "
                f"contains the reserved prefix '{reserved}'"
            )
    try:
        if "/" in object_name:  # shm_open refuses it too
            raise FileNotFoundError(2, "not a POSIX shared memory name")
        # As glibc's shm_open: never through a symbolic link (a local user could link
        # /dev/shm/x to a file only root may read, and read and write it through inferences);
        # O_NONBLOCK so that a FIFO planted there cannot hold the registration open.
        fd = os.open(
            os.path.join(SHM_ROOT, object_name),
            os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
        )
    except OSError as exc:
        reason = exc.strerror
        if exc.errno == errno.ELOOP:
            reason = "it is a symbolic link, which shared memory objects never are"
        raise InvalidInput(f"Unable to open shared memory region: '{key}' ({reason})") from None
    descriptor = _Descriptor(fd)
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):  # a device, FIFO or socket is no shared memory object
        raise InvalidInput(
            f"Unable to open shared memory region: '{key}' (not a shared memory object: not "
            "a regular file)"
        )
    if info.st_nlink > 1:  # a hard link to a file outside /dev/shm (tmpfs is one mount)
        raise InvalidInput(
            f"Unable to open shared memory region: '{key}' (it has {info.st_nlink} links; a "
            "shared memory object has one)"
        )
    size = info.st_size
    if offset + byte_size > size:
        raise InvalidInput(
            f"failed to register shared memory region '{name}': invalid args (key '{key}' is "
            f"{size} bytes; offset {offset} + byte_size {byte_size} lies beyond its end)"
        )
    return descriptor


class SharedMemoryRegistry:
    """The registered system and CUDA shared memory regions, by name (one namespace, as in
    Triton). Thread-safe."""

    def __init__(
        self, cuda: CudaMemoryAccess | None = None, max_regions: int = DEFAULT_MAX_REGIONS
    ) -> None:
        self.max_regions = max_regions  # system and CUDA regions together
        self._regions: dict[str, Region | CudaRegion] = {}
        self._lock = threading.Lock()
        self._cuda = cuda or CudaMemoryAccess()
        self._holders: dict[str, int] = {}  # region name -> requests holding it
        self._retiring: set[str] = set()  # unregistered while held: removed once released

    # ---- requests hold the regions they use ----------------------------------------------------

    @contextlib.contextmanager
    def request_scope(self) -> Iterator[None]:
        """Around one request, from its decoding until its response is written: every region
        it reads or names for an output is held, so that unregistering one meanwhile takes
        effect only after this request (tritonserver's behaviour)."""
        with self.request_holds() as holds:
            try:
                yield
            finally:
                holds.release()

    def request_holds(self) -> RequestHolds:
        """`request_scope` for a request answered after the block (in another task): the
        regions named inside it are held until the caller calls `release()` on what it
        yields. A class, not a generator: it is on every infer request's path."""
        return RequestHolds(self)

    def _hold(self, name: str) -> None:
        """Hold `name` for the request in scope, if any (the caller checked it exists)."""
        holds = _current.get()
        if holds is None or holds.registry is not self or name in holds.names:
            return
        with self._lock:
            if name in self._regions:
                holds.names[name] = 1
                self._holders[name] = self._holders.get(name, 0) + 1

    def _release(self, holds: RequestHolds) -> None:
        closed: list[CudaRegion] = []
        with self._lock:
            for name in holds.names:
                left = self._holders.get(name, 0) - 1
                if left > 0:
                    self._holders[name] = left
                    continue
                self._holders.pop(name, None)
                if name in self._retiring:
                    self._retiring.discard(name)
                    region = self._regions.pop(name, None)
                    if isinstance(region, CudaRegion):
                        closed.append(region)
        for region in closed:
            self._cuda.close(region)
        holds.names.clear()

    def _forget(self, names: list[str]) -> list[Region | CudaRegion]:
        """Under the lock: remove the regions no request holds, mark the others to go when
        released; the removed ones."""
        removed = []
        for name in names:
            if self._holders.get(name):
                self._retiring.add(name)
            else:
                removed.append(self._regions.pop(name))
        return removed

    def hold(self, target: ShmTarget, where: str) -> None:
        """At decoding: check a tensor's window now (as tritonserver does, before the model
        runs) and hold its region for the request in scope."""
        self._region(target.region, target.offset, target.byte_size, where)

    def register_cuda(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        if not name:
            # tritonserver's words (its CUDA IPC open of such a request fails), then why
            raise InvalidInput(
                "failed to register shared memory region: invalid args (a CUDA shared memory "
                "region needs a name)"
            )
        with self._lock:
            self._check_room(name)
        region = self._cuda.open(name, raw_handle, device_id, byte_size)
        try:
            with self._lock:
                self._check_room(name)
                self._regions[name] = region
        except ApplianceError:
            self._cuda.close(region)
            raise

    def unregister_cuda(self, name: str = "") -> None:
        """Unregister one CUDA region ('': all); one a request holds goes when it is done."""
        with self._lock:
            names = [name] if name else list(self._regions)
            gone = [n for n in names if isinstance(self._regions.get(n), CudaRegion)]
            removed = self._forget(gone)
        for region in removed:
            assert isinstance(region, CudaRegion)
            self._cuda.close(region)

    def cuda_status(self, name: str = "") -> list[dict[str, Any]]:
        with self._lock:
            found = [r for n, r in sorted(self._regions.items())
                     if isinstance(r, CudaRegion) and (not name or n == name)]
        if name and not found:
            if isinstance(self._regions.get(name), Region):
                raise ModelNotFound(
                    f"The region named '{name}' is registered as system shared memory, not "
                    "CUDA shared memory"
                )
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
            self._check_room(name)
        descriptor = _open(name, key, offset, byte_size)
        with self._lock:
            self._check_room(name)
            self._regions[name] = Region(name, key, offset, byte_size, descriptor)

    def _check_room(self, name: str) -> None:
        """Under the lock: `name` is free and the cap leaves room for one more region."""
        if name in self._regions:
            raise RegionExists(f"shared memory region '{name}' already in manager")
        if len(self._regions) >= self.max_regions:
            raise TooManyRegions(
                f"cannot register shared memory region '{name}': {len(self._regions)} regions "
                f"are registered, the most this server allows (--max-shm-regions "
                f"{self.max_regions}); unregister regions no longer used"
            )

    def unregister(self, name: str = "") -> None:
        """Unregister one system region ('': all). One a request holds stays registered until
        that request is done (tritonserver's behaviour); a copy under way always finishes."""
        with self._lock:
            names = [name] if name else list(self._regions)
            self._forget([n for n in names if isinstance(self._regions.get(n), Region)])

    def status(self, name: str = "") -> list[dict[str, Any]]:
        with self._lock:
            if name:
                region = self._regions.get(name)
                if isinstance(region, CudaRegion):
                    raise ModelNotFound(
                        f"The region named '{name}' is registered as CUDA shared memory, not "
                        "system shared memory"
                    )
                if region is None:
                    raise ModelNotFound(
                        f"Unable to find system shared memory region: '{name}'"
                    )
                return [region.status()]
            return [r.status() for _, r in sorted(self._regions.items()) if isinstance(r, Region)]

    def _region(
        self, name: str, offset: int, byte_size: int, where: str
    ) -> Region | CudaRegion:
        """A registered region whose window holds `byte_size` bytes at `offset`, held for the
        request in scope. tritonserver's texts first (its order of checks), then where."""
        region = self._regions.get(name)
        context = f" ({where})" if where else ""
        if region is None:
            raise RegionNotFound(f"Unable to find shared memory region: '{name}'{context}")
        if offset < 0 or offset >= region.byte_size:
            raise InvalidInput(
                f"Invalid offset for shared memory region: '{name}'"
                f"{_detail(where, f'offset {offset}, its window is {region.byte_size} bytes')}"
            )
        if byte_size > _SIZE_MAX - offset:  # tritonserver's size_t check, and its text
            raise InvalidInput(
                f"Integer overflow detected: byte_size ({byte_size}) + offset ({offset}) "
                f"exceeds maximum value ({_SIZE_MAX}) for region '{name}'"
            )
        if byte_size < 0 or offset + byte_size > region.byte_size:
            raise InvalidInput(
                f"Invalid offset + byte size for shared memory region: '{name}'"
                f"{_detail(where, f'{offset} + {byte_size} > its {region.byte_size} bytes')}"
            )
        self._hold(name)
        return region

    def read(self, name: str, offset: int, byte_size: int, where: str) -> np.ndarray[Any, Any]:
        """A host copy (uint8) of `byte_size` bytes at `offset` in a registered region."""
        region = self._region(name, offset, byte_size, where)
        if isinstance(region, CudaRegion):
            return self._cuda.read(region, offset, byte_size, where)
        return region.read(offset, byte_size, where)

    def write(self, name: str, offset: int, data: np.ndarray[Any, Any], where: str) -> None:
        """Copy bytes (a contiguous uint8 array) into a registered region."""
        region = self._region(name, offset, data.nbytes, where)
        if isinstance(region, CudaRegion):
            self._cuda.write(region, offset, data, where)
        else:
            region.write(offset, data, where)


def _detail(where: str, what: str) -> str:
    return f" ({where}: {what})" if where else f" ({what})"


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
    target = ShmTarget(region, offset, byte_size)
    holds = _current.get()
    if holds is not None:  # in a request scope: checked and held from now on
        holds.registry.hold(target, where)
    return target


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
    names: tuple[str, str, str] | None = None,
) -> Array:
    """An input tensor copied out of a registered region (a CUDA region: to the host). Sizes
    are checked before anything is read. `names` (request id, model, input) words a size
    that does not fit the shape as tritonserver does."""
    dtype = datatype(datatype_name, where)
    count = element_count(shape, where)
    if limits is not None:
        limits.check_elements(count, shape, where)
    if dtype.itemsize == 0:
        window = registry.read(target.region, target.offset, target.byte_size, where)
        return decode_bytes(window.data, count, where, names).reshape(shape)
    expected = count * dtype.itemsize
    if target.byte_size != expected and names is not None:
        request_id, model, input_name = names
        raise InvalidInput(
            f"[request id: {request_id or '<id_unknown>'}] input byte size mismatch for input "
            f"'{input_name}' for model '{model}'. Expected {expected}, got {target.byte_size}"
        )
    if target.byte_size != expected:
        raise InvalidInput(
            f"{where}: shared_memory_byte_size {target.byte_size} does not match the "
            f"{expected} bytes of {datatype_name} with shape {list(shape)}"
        )
    window = registry.read(target.region, target.offset, target.byte_size, where)
    array: Array = window.view(dtype.numpy).reshape(shape)
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
    registry.hold(target, where)  # the window the request declared, as tritonserver checks it
    if size > target.byte_size:
        raise InvalidInput(
            f"{where}: the output is {size} bytes, more than shared_memory_byte_size "
            f"{target.byte_size} of region '{target.region}'"
        )
    registry.write(
        target.region, target.offset, np.frombuffer(data, dtype=np.uint8, count=size), where
    )
    return size
