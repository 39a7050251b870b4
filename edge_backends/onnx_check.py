"""Checks on an .onnx file before ONNX Runtime opens it: what it would read and allocate.

ONNX Runtime follows a tensor's external data `location` wherever it points and reads as many
bytes as the tensor declares, so a hostile model could read a file outside its folder into
its weights (and out through its outputs), or make the load read a 10 GB sparse file into
memory. This reads the protobuf wire format itself (the `onnx` package is not a runtime
dependency) and refuses, before any allocation:
- external data outside the model's folder (absolute, `..`, or through a symlink);
- external data declared past the end of its file;
- weights (inline and external) declaring more than the per-load budget: half the machine's
  physical memory;
- graphs nested deeper than `MAX_GRAPH_DEPTH` (If / Loop / Scan bodies).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

# protobuf's own parsers stop at 100 nested messages, three per level (graph, node,
# attribute); this walk stops at the same depth, before recursing further itself.
MAX_GRAPH_DEPTH = 32
# TensorProto.DataType -> bytes per element (STRING and UNDEFINED: 0, not sized here).
_ITEM_BYTES = {
    1: 4,
    2: 1,
    3: 1,
    4: 2,
    5: 2,
    6: 4,
    7: 8,
    9: 1,
    10: 2,
    11: 8,
    12: 4,
    13: 8,
    14: 8,
    15: 16,
    16: 2,
    17: 1,
    18: 1,
    19: 1,
    20: 1,
    21: 1,
    22: 1,
}


class OnnxFileProblem(ValueError):
    """Why an .onnx file is refused before it is opened."""


class _Unparsed(OnnxFileProblem):
    """Not protobuf as this reads it: ONNX Runtime's parser refuses it with its own words."""


def load_budget_bytes() -> int:
    """Half the machine's physical memory: the most weights one load may declare."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2
    except (ValueError, OSError):
        return 1 << 62


def _varint(data: memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise _Unparsed("a truncated varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _fields(data: memoryview) -> Iterator[tuple[int, int, int | memoryview]]:
    """(field number, wire type, value) of one message's fields."""
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
            yield number, wire, value
        elif wire == 2:
            size, pos = _varint(data, pos)
            if pos + size > len(data):
                raise _Unparsed("a field past the end")
            yield number, wire, data[pos : pos + size]
            pos += size
        elif wire in (1, 5):
            pos += 8 if wire == 1 else 4
        else:
            raise _Unparsed(f"wire type {wire}")


def _dims(number: int, wire: int, value: int | memoryview) -> list[int]:
    if wire == 0 and isinstance(value, int):
        return [value]
    if isinstance(value, memoryview):  # packed
        out, pos = [], 0
        while pos < len(value):
            item, pos = _varint(value, pos)
            out.append(item)
        return out
    return []


class _Walk:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.declared = 0

    def tensor(self, data: memoryview) -> None:
        dims: list[int] = []
        dtype, location, offset, length, external = 0, "", 0, -1, False
        for number, wire, value in _fields(data):
            if number == 1:
                dims += _dims(number, wire, value)
            elif number == 2 and isinstance(value, int):
                dtype = value
            elif number == 14 and isinstance(value, int):
                external = value == 1
            elif number == 13 and isinstance(value, memoryview):
                entry = {
                    n: bytes(v).decode("utf-8", "replace")
                    for n, _, v in _fields(value)
                    if isinstance(v, memoryview)
                }
                key, text = entry.get(1, ""), entry.get(2, "")
                if key == "location":
                    location = text
                elif key == "offset" and text.isdigit():
                    offset = int(text)
                elif key == "length" and text.isdigit():
                    length = int(text)
        count = 1
        for dim in dims:
            count *= dim  # varints decode unsigned: a negative dim is a huge count here
        size = count * _ITEM_BYTES.get(dtype, 0)
        self.declared += size
        if external:
            self.external(location, offset, length if length >= 0 else size)

    def external(self, location: str, offset: int, length: int) -> None:
        path = self.folder / location
        if (
            not location
            or os.path.isabs(location)
            or not path.resolve().is_relative_to(self.folder.resolve())
        ):
            raise OnnxFileProblem(f"external data '{location}' lies outside the model's folder")
        try:
            size = path.stat().st_size
        except OSError as exc:
            raise OnnxFileProblem(f"external data '{location}': {exc.strerror}") from None
        if offset + length > size:
            raise OnnxFileProblem(
                f"external data '{location}' declares bytes {offset}..{offset + length} of a "
                f"{size}-byte file"
            )

    def graph(self, data: memoryview, depth: int) -> None:
        if depth > MAX_GRAPH_DEPTH:
            raise OnnxFileProblem(f"graphs nested deeper than {MAX_GRAPH_DEPTH} levels")
        for number, _, value in _fields(data):
            if not isinstance(value, memoryview):
                continue
            if number == 5:  # initializer
                self.tensor(value)
            elif number == 15:  # sparse_initializer: values (1), indices (2)
                for inner, _, part in _fields(value):
                    if inner in (1, 2) and isinstance(part, memoryview):
                        self.tensor(part)
            elif number == 1:  # node: attributes (5)
                for inner, _, attr in _fields(value):
                    if inner == 5 and isinstance(attr, memoryview):
                        self.attribute(attr, depth)

    def attribute(self, data: memoryview, depth: int) -> None:
        for number, _, value in _fields(data):
            if not isinstance(value, memoryview):
                continue
            if number in (5, 10):  # t, tensors
                self.tensor(value)
            elif number in (6, 11):  # g, graphs
                self.graph(value, depth + 1)


def check_onnx_file(path: Path, budget_bytes: int | None = None) -> None:
    """Raise OnnxFileProblem when the model at `path` must not be opened."""
    walk = _Walk(path.parent)
    size = path.stat().st_size
    if size >= 2**31:  # protobuf's own limit: ONNX Runtime refuses it too, after reading it
        raise OnnxFileProblem(f"the file has {size} bytes, over protobuf's 2 GB limit")
    with open(path, "rb") as file:
        data = memoryview(file.read())
    try:
        _walk_model(walk, data)
    except _Unparsed:
        return  # ONNX Runtime says what is wrong with it
    budget = load_budget_bytes() if budget_bytes is None else budget_bytes
    if walk.declared > budget:
        raise OnnxFileProblem(
            f"its tensors declare {walk.declared} bytes, more than this load's budget of "
            f"{budget} bytes (half the machine's memory)"
        )


def _walk_model(walk: _Walk, data: memoryview) -> None:
    for number, _, value in _fields(data):
        if number == 7 and isinstance(value, memoryview):  # ModelProto.graph
            walk.graph(value, 0)
        elif number == 20 and isinstance(value, memoryview):  # functions: nodes (3)
            for inner, _, node in _fields(value):
                if inner == 3 and isinstance(node, memoryview):
                    for attr_no, _, attr in _fields(node):
                        if attr_no == 5 and isinstance(attr, memoryview):
                            walk.attribute(attr, 1)
