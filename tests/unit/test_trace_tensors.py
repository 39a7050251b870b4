"""Level TENSORS: each traced tensor as Triton's trace entry, its `data` written as
tritonserver writes it and bounded (a huge tensor is cut with a marker)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from appliance.ops.trace import MAX_TENSOR_CHARS, MAX_TENSOR_ELEMENTS, Tracer, tensor_entry


def _data(datatype: str, array: np.ndarray) -> str:  # type: ignore[type-arg]
    return str(
        tensor_entry(1, "TENSOR_QUEUE_INPUT", "X", datatype, array.shape, array)["tensor"]["data"]
    )


def test_an_entry_is_tritons_shape() -> None:
    array = np.array([[1.5, -2.0, 1 / 3]], np.float32)
    assert tensor_entry(7, "TENSOR_BACKEND_OUTPUT", "OUT", "FP32", (1, 3), array) == {
        "id": 7,
        "activity": "TENSOR_BACKEND_OUTPUT",
        "tensor": {"name": "OUT", "data": "1.5,-2,0.333333", "shape": "1,3", "dtype": "FP32"},
    }


@pytest.mark.parametrize(
    ("datatype", "array", "data"),
    [
        ("FP64", np.array([1e-7, 123456789.0, np.inf, np.nan]), "1e-07,1.23457e+08,inf,nan"),
        ("BOOL", np.array([True, False]), "1,0"),
        ("INT64", np.array([-(2**62), 5], np.int64), f"{-(2**62)},5"),
        ("UINT8", np.array([0, 255], np.uint8), "0,255"),  # numbers: tritonserver's are chars
        (
            "BYTES",
            np.array([b"a", b'say "hi"', b"\xff"], np.object_),
            '"a","say "hi"","\\xff"',
        ),
        ("FP16", np.ones(4, np.float16), ""),  # tritonserver writes no FP16 / BF16 values
    ],
)
def test_data_is_written_as_tritonserver_writes_it(
    datatype: str,
    array: np.ndarray,  # type: ignore[type-arg]
    data: str,
) -> None:
    assert _data(datatype, array) == data


def test_a_huge_tensor_is_cut_with_a_marker() -> None:
    entry = tensor_entry(1, "TENSOR_QUEUE_INPUT", "X", "INT32", (10**7,), np.zeros(10**7, np.int32))
    tensor = entry["tensor"]
    assert tensor["truncated"] is True
    assert (
        tensor["data"]
        == ",".join(["0"] * MAX_TENSOR_ELEMENTS) + "...(truncated: 10000000 elements in all)"
    )
    assert tensor["shape"] == "10000000"
    # A few huge BYTES elements: cut at MAX_TENSOR_CHARS characters.
    words = np.array([b"x" * 10**6] * 3, np.object_)
    tensor = tensor_entry(1, "TENSOR_QUEUE_INPUT", "X", "BYTES", (3,), words)["tensor"]
    assert tensor["truncated"] is True
    assert tensor["data"].endswith("...(truncated: 3 elements in all)")
    assert len(json.dumps(tensor)) < MAX_TENSOR_CHARS + 200
    # At the bound, nothing is cut.
    assert (
        "truncated"
        not in tensor_entry(
            1,
            "TENSOR_QUEUE_INPUT",
            "X",
            "INT8",
            (MAX_TENSOR_ELEMENTS,),
            np.ones(MAX_TENSOR_ELEMENTS, np.int8),
        )["tensor"]
    )


def test_a_strided_view_formats_only_what_it_shows() -> None:
    array = np.arange(12, dtype=np.int32).reshape(3, 4)[:, ::2]
    assert _data("INT32", array) == "0,2,4,6,8,10"


@pytest.mark.parametrize(
    ("level", "active"), [("OFF", False), ("TIMESTAMPS", True), ("TENSORS", True)]
)
def test_tensors_alone_traces(level: str, active: bool) -> None:
    tracer = Tracer(trace_file="/nonexistent/trace.jsonl", level=level, rate=1)
    assert tracer.active is active
    assert bool(tracer.sample("m")) is active
    assert tracer.tensors("m") is (level == "TENSORS")
    assert tracer.update("", {"trace_level": ["TIMESTAMPS", "TENSORS"]})["trace_level"] == [
        "TIMESTAMPS",
        "TENSORS",
    ]
    assert tracer.tensors("m")
