"""Tensors through POSIX shared memory between the server and a Python model's process.

Each side owns one growing arena and writes its tensors there; the other side maps it by
name and reads views. BYTES (object) tensors are small in practice and travel pickled with
the message instead.
"""

from __future__ import annotations

import contextlib
from multiprocessing import shared_memory
from typing import Any

import numpy as np

# (name, dtype str or "object", shape, offset, nbytes or pickled object array)
TensorMeta = tuple[str, str, tuple[int, ...], int, Any]


class Arena:
    """A shared memory block this process writes tensors into; grows by replacement."""

    def __init__(self, prefix: str) -> None:
        self._prefix = prefix
        self._shm: shared_memory.SharedMemory | None = None

    @property
    def name(self) -> str:
        return self._shm.name if self._shm is not None else ""

    def write(self, tensors: dict[str, np.ndarray]) -> list[TensorMeta]:
        sizes = [a.nbytes for a in tensors.values() if a.dtype != np.object_]
        needed = sum(sizes) + 64 * len(sizes)
        if needed and (self._shm is None or self._shm.size < needed):
            self.close()
            self._shm = shared_memory.SharedMemory(create=True, size=max(needed * 2, 1 << 16))
        metas: list[TensorMeta] = []
        offset = 0
        for name, array in tensors.items():
            if array.dtype == np.object_:
                metas.append((name, "object", tuple(array.shape), 0, array))
                continue
            assert self._shm is not None
            offset = (offset + 63) & ~63
            view = np.ndarray(array.shape, dtype=array.dtype, buffer=self._shm.buf, offset=offset)
            view[...] = array
            metas.append((name, array.dtype.str, tuple(array.shape), offset, array.nbytes))
            offset += array.nbytes
        return metas

    def close(self) -> None:
        if self._shm is not None:
            self._shm.close()
            with contextlib.suppress(FileNotFoundError):
                self._shm.unlink()
            self._shm = None


class Reader:
    """Maps the other side's arena by name (re-maps when it grows) and reads tensors."""

    def __init__(self) -> None:
        self._shm: shared_memory.SharedMemory | None = None

    def read(self, arena: str, metas: list[TensorMeta], copy: bool) -> dict[str, np.ndarray]:
        if arena and (self._shm is None or self._shm.name != arena.lstrip("/")):
            self.close()
            # The server and its model processes share one resource tracker (spawn), which
            # keeps one entry per name: the owner's unlink clears it, attaching adds nothing.
            self._shm = shared_memory.SharedMemory(name=arena)
        out = {}
        for name, dtype, shape, offset, payload in metas:
            if dtype == "object":
                out[name] = payload
                continue
            assert self._shm is not None
            view = np.ndarray(shape, dtype=np.dtype(dtype), buffer=self._shm.buf, offset=offset)
            out[name] = view.copy() if copy else view
        return out

    def close(self) -> None:
        if self._shm is not None:
            self._shm.close()
            self._shm = None
