"""Tensors through POSIX shared memory between the server and a Python model's process.

Each side owns one growing arena and writes its tensors there; the other side maps it by
name and reads views. BYTES (object) tensors are small in practice and travel pickled with
the message instead.

Segments are opened here rather than through `multiprocessing.shared_memory`, whose segments
register with multiprocessing's resource tracker, a process of its own (13 MiB RSS; launch.py).
Their lifetime needs no tracker: the reader unlinks a segment's name as soon as it has mapped
it, so once the other side has read an arena nothing is left in /dev/shm to leak, whichever
process dies and however; until then its writer unlinks it when it closes the arena. A writer
whose reader was replaced (the model's process restarted) starts a fresh arena.
"""

from __future__ import annotations

import contextlib
import importlib
import mmap
import os
from typing import Any

import numpy as np

# CPython's own module behind multiprocessing.shared_memory (POSIX), without type stubs.
_posixshmem: Any = importlib.import_module("_posixshmem")

# (name, dtype str or "object", shape, offset, nbytes or pickled object array)
TensorMeta = tuple[str, str, tuple[int, ...], int, Any]

PREFIX = "/edge-py-"  # every arena's name starts with it


class Segment:
    """One mapped POSIX shared memory segment; `unlink` removes its name, not the mapping."""

    def __init__(self, name: str, size: int = 0) -> None:
        create = size > 0
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = _posixshmem.shm_open(name, flags, mode=0o600)
        try:
            if create:
                os.ftruncate(fd, size)
            else:
                size = os.fstat(fd).st_size
            self._mmap = mmap.mmap(fd, size)
        except BaseException:
            if create:
                with contextlib.suppress(OSError):
                    _posixshmem.shm_unlink(name)
            raise
        finally:
            os.close(fd)
        self.name = name
        self.size = size
        self.buf = memoryview(self._mmap)

    @staticmethod
    def create(tag: str, size: int) -> Segment:
        # os.urandom, not secrets: secrets imports hmac and OpenSSL (3.6 MiB a model process).
        return Segment(f"{PREFIX}{tag}-{os.getpid()}-{os.urandom(6).hex()}", size)

    def unlink(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            _posixshmem.shm_unlink(self.name)

    def close(self) -> None:
        self.buf.release()
        self._mmap.close()


class Arena:
    """A shared memory block this process writes tensors into; grows by replacement."""

    def __init__(self, prefix: str) -> None:
        self._prefix = prefix
        self._shm: Segment | None = None
        # The last layout written: each tensor's (name, dtype, shape, view into the segment),
        # and its metas. A model's requests mostly repeat one layout: writing it again is a
        # copy per tensor (0.4 us for two small tensors, where laying it out costs 5).
        self._layout: list[tuple[str, np.dtype, tuple[int, ...], np.ndarray]] = []
        self._metas: list[TensorMeta] = []

    @property
    def name(self) -> str:
        return self._shm.name if self._shm is not None else ""

    def write(self, tensors: dict[str, np.ndarray]) -> list[TensorMeta]:
        layout = self._layout
        if layout and len(layout) == len(tensors):
            for (name, array), known in zip(tensors.items(), layout, strict=True):
                known_name, dtype, shape, view = known
                if name != known_name or array.shape != shape or array.dtype != dtype:
                    break
                view[...] = array
            else:
                return self._metas
        return self._lay_out(tensors)

    def _lay_out(self, tensors: dict[str, np.ndarray]) -> list[TensorMeta]:
        self._layout = []
        sizes = [a.nbytes for a in tensors.values() if a.dtype != np.object_]
        needed = sum(sizes) + 64 * len(sizes)
        if needed and (self._shm is None or self._shm.size < needed):
            self.close()
            self._shm = Segment.create(self._prefix, max(needed * 2, 1 << 16))
        metas: list[TensorMeta] = []
        layout = []
        offset = 0
        for name, array in tensors.items():
            if array.dtype == np.object_:
                metas.append((name, "object", tuple(array.shape), 0, array))
                continue
            assert self._shm is not None
            offset = (offset + 63) & ~63
            view = np.ndarray(array.shape, dtype=array.dtype, buffer=self._shm.buf, offset=offset)
            view[...] = array
            layout.append((name, array.dtype, array.shape, view))
            metas.append((name, array.dtype.str, tuple(array.shape), offset, array.nbytes))
            offset += array.nbytes
        if len(layout) == len(metas):  # no BYTES tensor (their payload is in the metas)
            self._layout, self._metas = layout, metas
        return metas

    def close(self) -> None:
        """Unmap, and remove the name if the reader never did."""
        self._layout = []
        if self._shm is not None:
            self._shm.unlink()
            self._shm.close()
            self._shm = None


class Reader:
    """Maps the other side's arena by name (re-maps when it grows) and reads tensors."""

    def __init__(self) -> None:
        self._shm: Segment | None = None
        # The last metas read without BYTES tensors, and their views into the segment: the
        # same layout again reads as a fresh view of each (35 ns, where making one is 600).
        self._metas: list[TensorMeta] | None = None
        self._views: list[tuple[str, np.ndarray]] = []

    def read(self, arena: str, metas: list[TensorMeta], copy: bool) -> dict[str, np.ndarray]:
        if arena and (self._shm is None or self._shm.name != arena):
            self.close()
            self._shm = Segment(arena)
            self._shm.unlink()  # mapped by both sides now: nothing left to leak
        elif metas == self._metas:  # (a BYTES meta never equals one: its dtype differs)
            if copy:
                return {name: view.copy() for name, view in self._views}
            return {name: view.view() for name, view in self._views}
        out = {}
        views = []
        for name, dtype, shape, offset, payload in metas:
            if dtype == "object":
                out[name] = payload
                continue
            assert self._shm is not None
            view = np.ndarray(shape, dtype=np.dtype(dtype), buffer=self._shm.buf, offset=offset)
            views.append((name, view))
            out[name] = view.copy() if copy else view.view()
        if len(views) == len(metas):
            self._metas, self._views = metas, views
        return out

    def close(self) -> None:
        self._metas, self._views = None, []  # (the segment's buffer is released below)
        if self._shm is not None:
            self._shm.close()
            self._shm = None


# Small tensors in messages (decoupled responses, BLS calls and their answers) travel as
# (dtype str, shape, bytes): pickling a numpy array costs about 9 us each way, these 1.
Packed = dict[str, Any]


def pack(arrays: dict[str, np.ndarray]) -> Packed:
    """`arrays` for a message; object (BYTES) arrays stay arrays."""
    return {
        name: array
        if array.dtype == np.object_
        else (array.dtype.str, array.shape, np.ascontiguousarray(array).tobytes())
        for name, array in arrays.items()
    }


def unpack(packed: Packed) -> dict[str, np.ndarray]:
    """The arrays of `pack`, each writable and its own."""
    out = {}
    for name, value in packed.items():
        if isinstance(value, tuple):
            dtype, shape, data = value
            value = np.frombuffer(bytearray(data), dtype=np.dtype(dtype)).reshape(shape)
        out[name] = value
    return out
