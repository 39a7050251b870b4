"""The response cache: model outputs keyed on model, version and the exact input bytes.

Server-wide, bounded in bytes, least recently used out first (Triton's `--cache-config
local,size=N`); a model opts in with `response_cache { enable: true }`. An entry counts what
Triton's cache stores of a response (core's `CacheEntry`, packed): a count of outputs, then for
each its name, datatype, shape and data with their sizes, so a budget too small for a response
stores nothing, as in Triton (L0_response_cache's insertion failure with 200 bytes).
"""

from __future__ import annotations

import hashlib
import logging
from collections import OrderedDict
from collections.abc import Iterable

import numpy as np

from appliance.common.serialization import encode_bytes
from appliance.common.types import Array
from edge_backends.datatypes import from_numpy

log = logging.getLogger(__name__)

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
        size = entry_size(outputs)
        if size > self.max_bytes:
            log.error(
                "Failed to insert key [%s] into response cache: Requested byte_size: %d is "
                "greater than total cache size: %d",
                key.hex(),
                size,
                self.max_bytes,
            )
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


def entry_size(outputs: CachedOutputs) -> int:
    """The bytes Triton's cache entry of these outputs takes: a 4-byte output count, and per
    output 8 bytes of its size, its name and datatype with 4-byte lengths, its shape (4 bytes
    and 8 per dimension) and its data with an 8-byte length."""
    size = 4
    for name, array in outputs.items():
        datatype = from_numpy(array.dtype).triton if array.dtype.kind != "O" else "BYTES"
        size += 8 + 4 + len(name.encode()) + 4 + len(datatype) + 4 + 8 * array.ndim + 8
        size += _data_size(array)
    return size


def _data_size(array: Array) -> int:
    if array.dtype.kind == "O":  # BYTES: a 4-byte length before each element
        return sum(4 + (len(x) if isinstance(x, bytes | str) else 8) for x in array.reshape(-1))
    return int(array.nbytes)
