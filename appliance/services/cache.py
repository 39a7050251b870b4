"""The response cache: model outputs keyed on model, version and the exact input bytes.

Server-wide, bounded in bytes, least recently used out first (Triton's `--cache-config
local,size=N`); a model opts in with `response_cache { enable: true }`.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterable

import numpy as np

from appliance.common.serialization import encode_bytes
from appliance.common.types import Array

CachedOutputs = dict[str, Array]


def cache_key(model: str, version: int, inputs: Iterable[tuple[str, Array]]) -> bytes:
    """A digest of everything that determines the outputs."""
    digest = hashlib.blake2b(f"{model}\0{version}".encode(), digest_size=32)
    for name, array in sorted(inputs, key=lambda item: item[0]):
        digest.update(f"\0{name}\0{array.dtype.str}\0{array.shape}\0".encode())
        if array.dtype.kind == "O":
            digest.update(encode_bytes(array))
        else:
            digest.update(np.ascontiguousarray(array).data)
    return digest.digest()


class ResponseCache:
    """LRU over whole responses, bounded by the bytes of the arrays it holds."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.used_bytes = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self._entries: OrderedDict[bytes, tuple[CachedOutputs, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: bytes) -> CachedOutputs | None:
        entry = self._entries.get(key)
        if entry is None:
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return entry[0]

    def put(self, key: bytes, outputs: CachedOutputs) -> bool:
        """Store a response; False when it is larger than the whole cache."""
        size = sum(_size(a) for a in outputs.values())
        if size > self.max_bytes:
            return False
        old = self._entries.pop(key, None)
        if old is not None:
            self.used_bytes -= old[1]
        while self._entries and self.used_bytes + size > self.max_bytes:
            _, (_, evicted) = self._entries.popitem(last=False)
            self.used_bytes -= evicted
            self.evictions += 1
        self._entries[key] = (outputs, size)
        self.used_bytes += size
        return True


def _size(array: Array) -> int:
    if array.dtype.kind == "O":
        return sum(len(x) if isinstance(x, bytes | str) else 8 for x in array.reshape(-1))
    return int(array.nbytes)
