"""The one table that maps Triton datatypes to numpy, ONNX and model-config names."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class DataType:
    """One Triton datatype and its spellings elsewhere."""

    triton: str  # wire name: "FP32"
    config: str  # model config enum name: "TYPE_FP32"
    numpy: np.dtype[Any]  # object dtype for BYTES
    onnx: str  # onnxruntime's type string: "tensor(float)"
    itemsize: int  # bytes per element; 0 for BYTES (variable length)


_TABLE = (
    DataType("BOOL", "TYPE_BOOL", np.dtype(np.bool_), "tensor(bool)", 1),
    DataType("UINT8", "TYPE_UINT8", np.dtype(np.uint8), "tensor(uint8)", 1),
    DataType("UINT16", "TYPE_UINT16", np.dtype(np.uint16), "tensor(uint16)", 2),
    DataType("UINT32", "TYPE_UINT32", np.dtype(np.uint32), "tensor(uint32)", 4),
    DataType("UINT64", "TYPE_UINT64", np.dtype(np.uint64), "tensor(uint64)", 8),
    DataType("INT8", "TYPE_INT8", np.dtype(np.int8), "tensor(int8)", 1),
    DataType("INT16", "TYPE_INT16", np.dtype(np.int16), "tensor(int16)", 2),
    DataType("INT32", "TYPE_INT32", np.dtype(np.int32), "tensor(int32)", 4),
    DataType("INT64", "TYPE_INT64", np.dtype(np.int64), "tensor(int64)", 8),
    DataType("FP16", "TYPE_FP16", np.dtype(np.float16), "tensor(float16)", 2),
    DataType("FP32", "TYPE_FP32", np.dtype(np.float32), "tensor(float)", 4),
    DataType("FP64", "TYPE_FP64", np.dtype(np.float64), "tensor(double)", 8),
    DataType("BYTES", "TYPE_STRING", np.dtype(np.object_), "tensor(string)", 0),
)

BY_TRITON: dict[str, DataType] = {d.triton: d for d in _TABLE}
BY_CONFIG: dict[str, DataType] = {d.config: d for d in _TABLE}
BY_ONNX: dict[str, DataType] = {d.onnx: d for d in _TABLE}
_BY_NUMPY: dict[np.dtype[Any], DataType] = {d.numpy: d for d in _TABLE}


def from_numpy(dtype: np.dtype[Any]) -> DataType:
    """The Triton datatype of a numpy dtype; bytes and str arrays are BYTES."""
    if dtype.kind in ("S", "U", "O"):
        return BY_TRITON["BYTES"]
    try:
        return _BY_NUMPY[dtype]
    except KeyError:
        raise ValueError(f"numpy dtype {dtype} has no Triton datatype") from None
