"""Tensor bytes <-> numpy (appliance/common/tensors.py), BYTES encoding included."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import pytest
from tritonclient.utils import deserialize_bytes_tensor, serialize_byte_tensor

from appliance.common.errors import InvalidInput
from appliance.common.tensors import (
    decode_bytes,
    element_count,
    encode_bytes,
    from_list,
    from_raw,
    to_list,
    to_raw,
)

WHERE = "model 'm' input 'X'"


def _one(item: bytes) -> bytes:
    return struct.pack("<I", len(item)) + item


NUMERIC = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
}
ITEMS = [b"", b"a", "h\u00e9llo \u2713".encode(), b"\x00\xff\xfe", b"x" * 70000]


def objects(items: list[Any]) -> np.ndarray:
    array = np.empty(len(items), dtype=np.object_)
    array[:] = items
    return array


def extremes(datatype: str) -> np.ndarray:
    dtype = np.dtype(NUMERIC[datatype])
    if dtype.kind == "b":
        return np.array([True, False, True, True, False, False], dtype=dtype)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return np.array([info.min, info.max, 0, 1, info.max - 1, info.min + 1], dtype=dtype)
    finfo = np.finfo(dtype)
    return np.array([finfo.min, finfo.max, np.nan, np.inf, -np.inf, -0.0], dtype=dtype)


# ---- BYTES -----------------------------------------------------------------------------------


def test_encode_bytes_is_length_prefixed() -> None:
    assert encode_bytes(objects([b"ab", b"", b"\xff"])) == (
        b"\x02\x00\x00\x00ab" + b"\x00\x00\x00\x00" + b"\x01\x00\x00\x00\xff"
    )


def test_encode_bytes_accepts_str_and_other_objects() -> None:
    assert encode_bytes(objects(["\u00e9", 7])) == b"\x02\x00\x00\x00\xc3\xa9\x01\x00\x00\x007"


def test_bytes_round_trip() -> None:
    array = objects(ITEMS)
    raw = encode_bytes(array)
    decoded = decode_bytes(raw, len(ITEMS), WHERE)
    assert decoded.dtype == np.object_
    assert decoded.tolist() == ITEMS


def test_bytes_match_tritonclient_encoding() -> None:
    """The server's BYTES encoding is exactly tritonclient's, both ways."""
    array = objects(ITEMS).reshape(1, 5)
    assert encode_bytes(array) == serialize_byte_tensor(array).item()
    assert deserialize_bytes_tensor(encode_bytes(array)).tolist() == ITEMS
    assert decode_bytes(serialize_byte_tensor(array).item(), 5, WHERE).tolist() == ITEMS


def test_decode_bytes_from_memoryview_slice() -> None:
    raw = b"junk" + encode_bytes(objects([b"ab", b"c"])) + b"tail"
    view = memoryview(raw)[4:-4]
    assert decode_bytes(view, 2, WHERE).tolist() == [b"ab", b"c"]


def test_decode_zero_elements() -> None:
    assert decode_bytes(b"", 0, WHERE).shape == (0,)


@pytest.mark.parametrize(
    ("raw", "count", "message"),
    [
        (b"", 1, "BYTES data ends after 0 of 1 elements (truncated length prefix)"),
        (b"\x01\x00\x00", 1, "BYTES data ends after 0 of 1 elements (truncated length prefix)"),
        (
            struct.pack("<I", 1) + b"a" + b"\x02",
            2,
            "BYTES data ends after 1 of 2 elements (truncated length prefix)",
        ),
        (struct.pack("<I", 10) + b"abc", 1, "BYTES element 0 claims 10 bytes but only 3 remain"),
        (
            struct.pack("<I", 0) + struct.pack("<I", 2**32 - 1),
            2,
            "BYTES element 1 claims 4294967295 bytes but only 0 remain",
        ),
        (struct.pack("<I", 1) + b"ab", 1, "1 bytes left over after 1 BYTES elements"),
        (b"\x00\x00\x00\x00" * 3, 2, "4 bytes left over after 2 BYTES elements"),
    ],
    ids=[
        "empty",
        "short-prefix",
        "second-prefix-short",
        "too-long",
        "huge-length",
        "left-over",
        "extra-element",
    ],
)
def test_decode_bytes_errors(raw: bytes, count: int, message: str) -> None:
    with pytest.raises(InvalidInput) as info:
        decode_bytes(raw, count, WHERE)
    assert info.value.message == f"{WHERE}: {message}"


CLIENT = ("r1", "m", "X")  # a client's input: request id, model, input


@pytest.mark.parametrize(
    ("raw", "count", "message"),
    [
        (b"", 1, "expected 1 string elements for inference input 'X' for model 'm', got 0"),
        (
            _one(b"a") + b"\x01\x00",
            2,
            "incomplete string length indicator for inference input 'X' for model 'm', "
            "expecting 4 bytes but only 2 bytes available. Please make sure the string length "
            "indicator is in one buffer.",
        ),
        (
            _one(b"a") * 3,
            2,
            "unexpected number of string elements 3 for inference input 'X' for model 'm', "
            "expecting 2",
        ),
        (
            _one(b"a") * 14,
            16,
            "expected 16 string elements for inference input 'X' for model 'm', got 14",
        ),
    ],
    ids=["empty", "short-prefix", "one-past", "short-of-shape"],
)
def test_decode_client_bytes_in_tritons_words(raw: bytes, count: int, message: str) -> None:
    with pytest.raises(InvalidInput) as info:
        decode_bytes(raw, count, WHERE, CLIENT)
    assert info.value.message == f"[request id: r1] {message}"


def test_decode_client_bytes_element_past_the_data() -> None:
    with pytest.raises(InvalidInput) as info:
        decode_bytes(struct.pack("<I", 9) + b"ab", 1, WHERE, CLIENT)
    assert info.value.message == (
        "incomplete string data for inference input 'X', expecting string of length 9 but only "
        "2 bytes available"
    )
    assert decode_bytes(_one(b"ab") + _one(b""), 2, WHERE, CLIENT).tolist() == [b"ab", b""]


# ---- raw numeric -----------------------------------------------------------------------------


@pytest.mark.parametrize("datatype", list(NUMERIC))
def test_raw_round_trip(datatype: str) -> None:
    array = extremes(datatype).reshape(2, 3)
    raw = to_raw(array, datatype)
    assert bytes(raw) == array.tobytes()
    decoded = from_raw(raw, datatype, (2, 3), WHERE)
    assert decoded.dtype == array.dtype
    assert decoded.shape == (2, 3)
    assert decoded.tobytes() == array.tobytes()


def test_from_raw_is_a_view_without_copy() -> None:
    raw = bytearray(np.arange(4, dtype=np.int32).tobytes())
    array = from_raw(memoryview(raw), "INT32", (4,), WHERE)
    raw[0] = 9
    assert array[0] == 9


def test_to_raw_converts_dtype_and_layout() -> None:
    array = np.arange(6, dtype=np.int64).reshape(2, 3).T  # not contiguous, wrong dtype
    raw = to_raw(array, "INT32")
    assert bytes(raw) == np.ascontiguousarray(array, dtype=np.int32).tobytes()


def test_from_raw_bytes_tensor() -> None:
    raw = encode_bytes(objects([b"a", b"", b"c", b"dd"]))
    decoded = from_raw(raw, "BYTES", (2, 2), WHERE)
    assert decoded.shape == (2, 2)
    assert decoded.tolist() == [[b"a", b""], [b"c", b"dd"]]
    assert to_raw(decoded, "BYTES") == raw


@pytest.mark.parametrize(
    ("datatype", "shape", "size", "expected"),
    [
        ("INT32", (1, 16), 60, 64),
        ("INT32", (1, 16), 68, 64),
        ("FP16", (2, 3), 6, 12),
        ("UINT64", (3,), 0, 24),
        ("BOOL", (0, 4), 1, 0),
    ],
)
def test_from_raw_size_mismatch(
    datatype: str, shape: tuple[int, ...], size: int, expected: int
) -> None:
    with pytest.raises(InvalidInput) as info:
        from_raw(b"\x00" * size, datatype, shape, WHERE)
    assert info.value.message == (
        f"{WHERE}: unexpected total byte size {size}, expecting {expected} "
        f"({datatype} with shape {list(shape)})"
    )


def test_from_raw_unknown_datatype() -> None:
    with pytest.raises(InvalidInput, match=r"unknown datatype 'FLOAT'; expected one of BOOL, "):
        from_raw(b"\x00" * 4, "FLOAT", (1,), WHERE)


def test_negative_dimension() -> None:
    with pytest.raises(InvalidInput) as info:
        element_count((2, -1), WHERE)
    assert info.value.message == f"{WHERE}: shape [2, -1] has a negative dimension"
    assert element_count((2, 0, 5), WHERE) == 0
    assert element_count((), WHERE) == 1


# ---- JSON lists ------------------------------------------------------------------------------


@pytest.mark.parametrize("datatype", list(NUMERIC))
def test_from_list_flat_and_nested_agree(datatype: str) -> None:
    expected = extremes(datatype).reshape(2, 3)
    values = expected.tolist()
    flat = from_list([v for row in values for v in row], datatype, (2, 3), WHERE)
    nested = from_list(values, datatype, (2, 3), WHERE)
    for array in (flat, nested):
        assert array.dtype == expected.dtype
        assert array.shape == (2, 3)
        assert array.tobytes() == expected.tobytes()


def test_from_list_nested_three_levels() -> None:
    data = [[[1, 2], [3, 4]], [[5, 6], [7, 8]]]
    array = from_list(data, "INT16", (2, 4), WHERE)
    assert array.tolist() == [[1, 2, 3, 4], [5, 6, 7, 8]]


def test_from_list_bytes() -> None:
    array = from_list([["", "\u00e9"], ["a", "b"]], "BYTES", (4,), WHERE)
    assert array.dtype == np.object_
    assert array.tolist() == [b"", "\u00e9".encode(), b"a", b"b"]


def test_from_list_uint64_max() -> None:
    array = from_list([2**64 - 1, 0], "UINT64", (2,), WHERE)
    assert array.tolist() == [2**64 - 1, 0]


@pytest.mark.parametrize(
    ("data", "shape", "count"),
    [
        ([1, 2, 3], (2, 2), 3),
        ([[1, 2], [3, 4], [5, 6]], (2, 2), 6),
        ([], (1,), 0),
        ([1], (0,), 1),
    ],
)
def test_from_list_element_count(data: list[Any], shape: tuple[int, ...], count: int) -> None:
    with pytest.raises(InvalidInput) as info:
        from_list(data, "INT32", shape, WHERE)
    expected = int(np.prod(shape))
    assert info.value.message == (
        f"{WHERE}: unexpected number of elements {count}, expecting {expected} "
        f"for shape {list(shape)}"
    )


@pytest.mark.parametrize(
    ("data", "datatype"),
    [(["a", "b"], "INT32"), ([256, 0], "UINT8"), ([-1, 0], "UINT32"), ([None, 1.0], "INT64")],
)
def test_from_list_bad_values(data: list[Any], datatype: str) -> None:
    with pytest.raises(InvalidInput) as info:
        from_list(data, datatype, (2,), WHERE)
    assert info.value.message.startswith(f"{WHERE}: data is not a list of {datatype} values: ")


def test_from_list_ragged() -> None:
    with pytest.raises(InvalidInput, match="data is not a list of INT32 values"):
        from_list([[1, 2], [3]], "INT32", (3,), WHERE)


def test_to_list_values() -> None:
    assert to_list(np.array([[1, 2], [3, 4]], dtype=np.uint64), "UINT64") == [1, 2, 3, 4]
    floats = to_list(np.array([np.nan, np.inf, -0.0], dtype=np.float16), "FP16")
    assert np.isnan(floats[0])
    assert floats[1:] == [np.inf, -0.0]
    assert str(floats[2]) == "-0.0"
    assert to_list(objects([b"\xc3\xa9", b"", b"\xff"]), "BYTES") == ["\u00e9", "", "\ufffd"]


@pytest.mark.parametrize(("name", "leaf"), [("BYTES", "hello"), ("INT64", 123)])
def test_json_data_nested_past_tritonservers_limit_gets_its_words(name: str, leaf: object) -> None:
    """Triton's L0_http test_json_recursion_depth_limit: 120 levels are refused in its words,
    50 levels holding one value are a [1, 1] tensor (as there)."""

    def nested(depth: int) -> object:
        value: object = leaf
        for _ in range(depth):
            value = [value]
        return value

    with pytest.raises(
        InvalidInput, match=r"JSON nesting depth exceeds maximum allowed limit \(100\)"
    ):
        from_list(nested(120), name, (1, 1), "model 'm' input 'INPUT0'")
    array = from_list(nested(50), name, (1, 1), "model 'm' input 'INPUT0'")
    assert array.shape == (1, 1)
    assert array[0, 0] == (leaf.encode() if isinstance(leaf, str) else leaf)
