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


def decode_bytes(
    raw: Any, count: int, where: str, names: tuple[str, str, str] | None = None
) -> Array:
    """Length-prefixed BYTES elements -> object array of bytes. With `names` (request id,
    model, input: a client's input) the element count is checked as tritonserver does, in
    its words and its order (`_decode_client_bytes`)."""
    view = memoryview(raw).cast("B")
    if names is not None:
        return _decode_client_bytes(view, count, names)
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
        if offset + length > end:
            raise InvalidInput(
                f"{where}: BYTES element {i} claims {length} bytes but only {end - offset} remain"
            )
        items.append(bytes(view[offset : offset + length]))
        offset += length
    if offset != end:
        raise InvalidInput(f"{where}: {end - offset} bytes left over after {count} BYTES elements")
    return _object_array(items)


def _decode_client_bytes(view: memoryview, count: int, names: tuple[str, str, str]) -> Array:
    """A client's BYTES input, read to the end of its data as tritonserver's request
    validation reads it: a length prefix cut short, one element more than the shape holds,
    an element running past the data, or fewer elements than the shape holds, each refused
    in tritonserver's words (the first two with its `[request id: ...]` prefix)."""
    request_id, model, input_name = names
    prefix = f"[request id: {request_id or '<id_unknown>'}] "
    offset, end = 0, len(view)
    items: list[bytes] = []
    while offset < end:
        if end - offset < 4:
            raise InvalidInput(
                f"{prefix}incomplete string length indicator for inference input "
                f"'{input_name}' for model '{model}', expecting 4 bytes but only "
                f"{end - offset} bytes available. Please make sure the string length indicator "
                "is in one buffer."
            )
        if len(items) == count:
            raise InvalidInput(
                f"{prefix}unexpected number of string elements {count + 1} for inference "
                f"input '{input_name}' for model '{model}', expecting {count}"
            )
        (length,) = _LEN.unpack_from(view, offset)
        offset += 4
        if offset + length > end:  # found by the backend in tritonserver: counted as its
            raise IncompleteBytes(
                f"incomplete string data for inference input '{input_name}', expecting string "
                f"of length {length} but only {end - offset} bytes available"
            )
        items.append(bytes(view[offset : offset + length]))
        offset += length
    if len(items) != count:
        raise InvalidInput(
            f"{prefix}expected {count} string elements for inference input '{input_name}' "
            f"for model '{model}', got {len(items)}"
        )
    return _object_array(items)


def _object_array(items: list[bytes]) -> Array:
    out = np.empty(len(items), dtype=np.object_)
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
