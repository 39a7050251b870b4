"""Tensor bytes <-> numpy for both protocols (BYTES encoding in common/serialization.py)."""

from __future__ import annotations

from typing import Any

import numpy as np

from appliance.common.errors import InvalidInput
from appliance.common.limits import RequestLimits
from appliance.common.serialization import decode_bytes, encode_bytes
from appliance.common.types import Array
from edge_backends.datatypes import BY_TRITON, DataType


def datatype(name: str, where: str) -> DataType:
    dtype = BY_TRITON.get(name)
    if dtype is None:
        raise InvalidInput(
            f"{where}: unknown datatype '{name}'; expected one of {', '.join(BY_TRITON)}"
        )
    return dtype


# numpy 2 holds at most 64 dimensions (numpy 1: 32); a longer shape would fail in numpy.
MAX_DIMS = 64 if np.lib.NumpyVersion(np.__version__) >= "2.0.0" else 32
# numpy refuses a shape whose dimensions other than 0 multiply, times the item size (8 at most,
# BYTES object pointers included), past its index range, even when another dimension is 0.
INT64_MAX = 2**63 - 1
MAX_SHAPE_PRODUCT = INT64_MAX // 8


def element_count(shape: tuple[int, ...], where: str, limits: RequestLimits | None = None) -> int:
    """Elements of a declared shape, refused over the limit before anything is allocated.

    Every shape numpy could not hold is refused here with what is wrong, so no decoder reaches
    numpy with it: too many dimensions, a negative one, or dimensions whose product (zeros left
    out: `[2**62, 0, 2**62]` holds no element, yet numpy cannot make it) is out of range.
    """
    if len(shape) > MAX_DIMS:
        raise InvalidInput(
            f"{where}: shape has {len(shape)} dimensions, more than the {MAX_DIMS} allowed"
        )
    product = 1  # of the dimensions other than 0; Python integers do not overflow
    empty = False
    for d in shape:
        if d > 0:
            product *= d
        elif d == 0:
            empty = True
        else:
            raise InvalidInput(f"{where}: shape {list(shape)} has a negative dimension")
    count = 0 if empty else product
    # A shape no tensor can have is a bad request (400, in Triton's words), not one over this
    # server's size limits (413): checked before them.
    if count > INT64_MAX:
        raise InvalidInput(
            f"{where}: invalid shape {list(shape)}: it causes total element count to exceed "
            f"maximum size of {INT64_MAX}"
        )
    if product > MAX_SHAPE_PRODUCT:
        overflow = "" if empty else "byte size overflow for input: "  # Triton's words
        raise InvalidInput(
            f"{where}: {overflow}shape {list(shape)} is out of range: its dimensions other than 0 "
            f"multiply to {product}, more than {MAX_SHAPE_PRODUCT}"
        )
    if limits is not None:
        limits.check_elements(count, shape, where)
    return count


def from_raw(
    raw: Any,
    name: str,
    shape: tuple[int, ...],
    where: str,
    limits: RequestLimits | None = None,
    names: tuple[str, str, str] | None = None,
) -> Array:
    """Decode a tensor from its raw bytes (a view of `raw` where the dtype allows: no copy).
    `names` (request id, model, input) words a byte size mismatch as tritonserver does."""
    dtype = datatype(name, where)
    count = element_count(shape, where, limits)
    if dtype.itemsize == 0:
        return decode_bytes(raw, count, where, names).reshape(shape)
    expected = count * dtype.itemsize
    if len(raw) != expected and names is not None:
        request_id, model, input_name = names
        raise InvalidInput(
            f"[request id: {request_id or '<id_unknown>'}] input byte size mismatch for input "
            f"'{input_name}' for model '{model}'. Expected {expected}, got {len(raw)}"
        )
    if len(raw) != expected:
        raise InvalidInput(
            f"{where}: unexpected total byte size {len(raw)}, expecting {expected} "
            f"({name} with shape {list(shape)})"
        )
    return np.frombuffer(raw, dtype.numpy, count).reshape(shape)  # positional: half the cost


def to_raw(array: Array, datatype_name: str) -> bytes | memoryview:
    """A tensor's wire bytes (a view for contiguous numeric arrays: no copy)."""
    if datatype_name == "BYTES":
        return encode_bytes(array)
    wanted = BY_TRITON[datatype_name].numpy
    if array.dtype != wanted:
        array = array.astype(wanted)
    array = np.ascontiguousarray(array)
    return memoryview(array).cast("B")  # type: ignore[arg-type]  # ndarray is a buffer; stubs disagree


# JSON value types each datatype accepts; nothing is coerced ("7" is not an INT32, 1.5 is not
# an INT32 either, true is not 1), as Triton refuses them.
_INTEGERS = frozenset({int})
_JSON_TYPES: dict[str, frozenset[type]] = {
    "BOOL": frozenset({bool}),
    "BYTES": frozenset({str}),
    "FP16": frozenset({int, float}),
    "FP32": frozenset({int, float}),
    "FP64": frozenset({int, float}),
}


# Lists in a JSON tensor's `data` may nest this deep (tritonserver's HTTP_MAX_JSON_NESTING_DEPTH).
JSON_MAX_NESTING = 100


def _nesting(data: Any) -> int:
    """How deep lists nest in `data`, along the first elements (row-major data nests evenly)."""
    depth = 0
    while type(data) is list and data:
        data, depth = data[0], depth + 1
    return depth


def _check_json_types(data: list[Any], name: str, where: str) -> None:
    allowed = _JSON_TYPES.get(name, _INTEGERS)
    kinds = set(map(type, data))
    if kinds <= allowed:  # a flat list of the right kind: every request that is right
        return
    flat = data
    if list in kinds:  # nested (row-major) lists
        flat = np.asarray(data, dtype=np.object_).ravel().tolist()
        kinds = set(map(type, flat))
    bad = kinds.difference(allowed)
    if bad:
        if list in bad and _nesting(data) > JSON_MAX_NESTING:  # lists left past numpy's dims
            raise InvalidInput(
                f"{where}: JSON nesting depth exceeds maximum allowed limit ({JSON_MAX_NESTING})"
            )
        first = next(v for v in flat if type(v) in bad)
        raise InvalidInput(
            f"{where}: data is not a list of {name} values: it holds {first!r} "
            f"({type(first).__name__})"
        )


def from_list(
    data: Any, name: str, shape: tuple[int, ...], where: str, limits: RequestLimits | None = None
) -> Array:
    """A tensor from JSON data (flat or nested, row-major); values must have the JSON type of
    the datatype."""
    dtype = datatype(name, where)
    count = element_count(shape, where, limits)
    if type(data) is not list:
        raise InvalidInput(f"{where}: 'data' must be a list, got {type(data).__name__}")
    _check_json_types(data, name, where)
    try:
        if dtype.itemsize == 0:
            flat = np.asarray(data, dtype=np.object_).ravel()
            array = np.empty(flat.size, dtype=np.object_)
            for i, item in enumerate(flat):
                array[i] = item.encode("utf-8")
        else:
            array = np.asarray(data, dtype=dtype.numpy)
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidInput(f"{where}: data is not a list of {name} values: {exc}") from exc
    if array.size != count:
        raise InvalidInput(
            f"{where}: unexpected number of elements {array.size}, expecting {count} "
            f"for shape {list(shape)}"
        )
    return array.reshape(shape)  # flat or nested alike: row-major


def to_list(array: Array, datatype_name: str) -> list[Any]:
    """A tensor as flat JSON-ready values."""
    flat = array.ravel()
    if datatype_name == "BYTES":
        return [
            x.decode("utf-8", errors="replace") if isinstance(x, bytes) else str(x) for x in flat
        ]
    return flat.tolist()  # type: ignore[no-any-return]  # numpy stubs type tolist as Any
