"""Triton's BYTES tensor serialization: each element is a 4-byte little-endian length, then
its bytes. Used on the wire (binary tensor data, gRPC raw contents) and in warm-up files."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from appliance.common.errors import IncompleteBytes, InvalidInput
from appliance.common.types import Array

_LEN = struct.Struct("<I")

__all__ = ["as_bytes_item", "decode_bytes", "encode_bytes"]


def decode_bytes(raw: Any, count: int, where: str, input_name: str = "") -> Array:
    """Length-prefixed BYTES elements -> object array of bytes. With `input_name` (a client's
    input) an element that runs past the data is refused in tritonserver's words."""
    view = memoryview(raw).cast("B")
    offset, end = 0, len(view)
    # Allocated only as elements are found: a huge shape with little data costs nothing.
    items: list[bytes] = []
    for i in range(count):
        if offset + 4 > end:
            raise InvalidInput(
                f"{where}: BYTES data ends after {i} of {count} elements (truncated length prefix)"
            )
        (length,) = _LEN.unpack_from(view, offset)
        offset += 4
        if offset + length > end and input_name:
            raise IncompleteBytes(
                f"incomplete string data for inference input '{input_name}', expecting string "
                f"of length {length} but only {end - offset} bytes available"
            )
        if offset + length > end:
            raise InvalidInput(
                f"{where}: BYTES element {i} claims {length} bytes but only {end - offset} remain"
            )
        items.append(bytes(view[offset : offset + length]))
        offset += length
    if offset != end:
        raise InvalidInput(f"{where}: {end - offset} bytes left over after {count} BYTES elements")
    out = np.empty(count, dtype=np.object_)
    out[:] = items
    return out


def as_bytes_item(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    return str(value).encode("utf-8")


def encode_bytes(array: Array) -> bytes:
    """Object / string array -> length-prefixed bytes."""
    parts = []
    for item in array.ravel():
        data = as_bytes_item(item)
        parts.append(_LEN.pack(len(data)))
        parts.append(data)
    return b"".join(parts)
