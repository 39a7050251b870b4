"""Tensors of the embedding API: Triton's `DataType` and `Tensor`, over numpy arrays."""

from __future__ import annotations

import enum
from typing import Any

import numpy as np

from appliance.common.types import Array
from appliance.embed.errors import InvalidArgumentError
from edge_backends.datatypes import BY_TRITON, from_numpy


class DataType(enum.IntEnum):
    """Triton's TRITONSERVER_DataType, same names and numbers."""

    INVALID = 0
    BOOL = 1
    UINT8 = 2
    UINT16 = 3
    UINT32 = 4
    UINT64 = 5
    INT8 = 6
    INT16 = 7
    INT32 = 8
    INT64 = 9
    FP16 = 10
    FP32 = 11
    FP64 = 12
    BYTES = 13
    BF16 = 14


class MemoryType(enum.IntEnum):
    """Triton's TRITONSERVER_MemoryType: every tensor of this API is in CPU memory."""

    CPU = 0
    CPU_PINNED = 1
    GPU = 2


_KDLCPU = 1  # DLPack's kDLCPU device type


class Tensor:
    """An output (or input) tensor: a numpy array with Triton's datatype and shape.

    `numpy.from_dlpack(tensor)` and `numpy.asarray(tensor)` give the array without a copy;
    `to_bytes_array()` / `to_string_array()` a BYTES tensor's elements, as Triton's.
    """

    __slots__ = ("_array", "data_type", "shape")

    def __init__(self, data_type: DataType, shape: tuple[int, ...], array: Array) -> None:
        self.data_type = data_type
        self.shape = list(shape)
        self._array = array

    @staticmethod
    def from_dlpack(obj: Any) -> Tensor:
        """A tensor over a DLPack-capable host array (numpy, a CPU torch tensor), no copy."""
        return Tensor._from_array(np.from_dlpack(obj))

    @staticmethod
    def from_bytes_array(array: Any) -> Tensor:
        tensor = Tensor._from_array(_bytes_array(np.asarray(array, dtype=np.object_)))
        return tensor

    from_string_array = from_bytes_array

    @staticmethod
    def _from_array(array: Array) -> Tensor:
        try:
            name = from_numpy(array.dtype).triton
        except ValueError as exc:
            raise InvalidArgumentError(str(exc)) from None
        return Tensor(DataType[name], tuple(array.shape), array)

    # ---- views -------------------------------------------------------------------------------

    def to_numpy(self) -> Array:
        """The array itself (not in Triton's API, which goes through DLPack)."""
        return self._array

    def __array__(self, dtype: Any = None, copy: Any = None) -> Array:
        return self._array if dtype is None else self._array.astype(dtype)

    def __dlpack__(self, *, stream: Any = None, **kwargs: Any) -> Any:
        if self.data_type == DataType.BYTES:
            raise InvalidArgumentError(
                "a BYTES tensor has no DLPack form; use to_bytes_array() or to_string_array()"
            )
        if stream is None:
            return self._array.__dlpack__()
        return self._array.__dlpack__(stream=stream)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (_KDLCPU, 0)

    def to_bytes_array(self) -> Array:
        """A BYTES tensor's elements as an object array of bytes."""
        if self.data_type != DataType.BYTES:
            raise InvalidArgumentError(f"Tensor has data type {self.data_type.name} not BYTES")
        return _bytes_array(self._array)

    def to_string_array(self) -> Array:
        return self.to_bytes_array().astype(str)

    def to_host(self) -> Tensor:
        return self

    @property
    def memory_type(self) -> MemoryType:
        return MemoryType.CPU

    @property
    def memory_type_id(self) -> int:
        return 0

    @property
    def data_ptr(self) -> int:
        return int(self._array.ctypes.data)

    @property
    def size(self) -> int:
        return int(self._array.nbytes)

    def __repr__(self) -> str:
        return f"Tensor(data_type={self.data_type.name}, shape={self.shape})"


def _bytes_array(array: Array) -> Array:
    """An object array of bytes (str items UTF-8 encoded), as the server's BYTES tensors are."""
    if array.dtype == np.object_ and all(isinstance(v, bytes) for v in array.flat):
        return array
    flat = [v if isinstance(v, bytes) else str(v).encode() for v in array.flat]
    out = np.empty(len(flat), dtype=np.object_)
    out[:] = flat
    shaped: Array = out.reshape(array.shape)
    return shaped


def input_array(name: str, value: Any, expected: str | None) -> tuple[str, Array]:
    """A request input as (datatype, array): the caller's numpy array itself when its dtype
    is the input's (no copy), a list or a str / bytes array converted once."""
    if isinstance(value, Tensor):
        array = value.to_numpy()
    elif isinstance(value, np.ndarray):
        array = value
    elif hasattr(value, "__dlpack__") and not isinstance(value, list | tuple):
        array = np.from_dlpack(value)
    else:
        array = np.asarray(value)
    if array.dtype.kind in "SUO":
        return "BYTES", _bytes_array(array)
    try:
        datatype = from_numpy(array.dtype).triton
    except ValueError:
        raise InvalidArgumentError(
            f"input '{name}': numpy dtype {array.dtype} has no Triton datatype"
        ) from None
    # A Python list of numbers becomes int64 / float64: made the datatype the model expects.
    listed = not isinstance(value, np.ndarray | Tensor)
    if listed and expected is not None and expected not in (datatype, "BYTES"):
        return expected, np.asarray(value, dtype=BY_TRITON[expected].numpy)
    return datatype, array
