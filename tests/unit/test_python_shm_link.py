"""A Python model's tensors through shared memory and its messages through a Link: a layout
written or read again (the cached views), layouts that change, BYTES tensors, a grown arena,
and the link's reuse of a repeated execute message."""

from __future__ import annotations

import multiprocessing
import os
import struct
from collections.abc import Iterator

import numpy as np
import pytest

from edge_backends.python.channel import Link
from edge_backends.python.shm import Arena, Reader


@pytest.fixture
def ends() -> Iterator[tuple[Arena, Reader]]:
    arena, reader = Arena("test"), Reader()
    yield arena, reader
    reader.close()
    arena.close()


def _round_trip(
    arena: Arena, reader: Reader, tensors: dict[str, np.ndarray], copy: bool = False
) -> dict[str, np.ndarray]:
    metas = arena.write(tensors)
    return reader.read(arena.name, metas, copy=copy)


def test_a_repeated_layout_carries_each_write_and_fresh_arrays(ends: tuple[Arena, Reader]) -> None:
    arena, reader = ends
    first = _round_trip(arena, reader, {"A": np.arange(4, dtype=np.float32)})
    np.testing.assert_array_equal(first["A"], [0, 1, 2, 3])
    metas = arena.write({"A": np.full(4, 7, dtype=np.float32)})
    assert metas is arena.write({"A": np.full(4, 7, dtype=np.float32)})  # the layout's own
    second = reader.read(arena.name, list(metas), copy=False)  # equal metas, another list
    np.testing.assert_array_equal(second["A"], [7, 7, 7, 7])
    assert second["A"] is not first["A"]  # a model's array is its own object
    second["A"].shape = (2, 2)  # reshaping a model's array leaves the next request's alone
    third = _round_trip(arena, reader, {"A": np.full(4, 9, dtype=np.float32)})
    assert third["A"].shape == (4,)
    copied = _round_trip(arena, reader, {"A": np.full(4, 3, dtype=np.float32)}, copy=True)
    arena.write({"A": np.zeros(4, dtype=np.float32)})
    np.testing.assert_array_equal(copied["A"], [3, 3, 3, 3])  # a copy keeps its values


@pytest.mark.parametrize(
    "changed",
    [
        {"A": np.arange(6, dtype=np.float32)},  # shape
        {"A": np.arange(4, dtype=np.int32)},  # dtype
        {"B": np.arange(4, dtype=np.float32)},  # name
        {"A": np.arange(4, dtype=np.float32), "B": np.ones(2, dtype=np.int8)},  # count
        {"A": np.arange(4, dtype=np.float32).reshape(2, 2)},
    ],
)
def test_a_changed_layout_is_laid_out_again(
    ends: tuple[Arena, Reader], changed: dict[str, np.ndarray]
) -> None:
    arena, reader = ends
    _round_trip(arena, reader, {"A": np.arange(4, dtype=np.float32)})
    got = _round_trip(arena, reader, changed)
    assert set(got) == set(changed)
    for name, array in changed.items():
        assert got[name].dtype == array.dtype
        np.testing.assert_array_equal(got[name], array)
    back = _round_trip(arena, reader, {"A": np.arange(4, dtype=np.float32) + 1})
    np.testing.assert_array_equal(back["A"], [1, 2, 3, 4])


def test_bytes_tensors_travel_in_the_metas_every_time(ends: tuple[Arena, Reader]) -> None:
    arena, reader = ends
    for text in (b"one", b"two"):
        words = np.array([text, b"x"], dtype=np.object_)
        got = _round_trip(arena, reader, {"A": np.arange(2, dtype=np.int64), "S": words})
        assert got["S"].tolist() == [text, b"x"]
        np.testing.assert_array_equal(got["A"], [0, 1])


def test_a_grown_arena_is_mapped_again(ends: tuple[Arena, Reader]) -> None:
    arena, reader = ends
    _round_trip(arena, reader, {"A": np.zeros(4, dtype=np.float32)})
    small = arena.name
    big = np.arange(1 << 16, dtype=np.float64)
    got = _round_trip(arena, reader, {"A": big})
    assert arena.name != small
    np.testing.assert_array_equal(got["A"], big)
    del got
    got = _round_trip(arena, reader, {"A": big[::-1].copy()})
    np.testing.assert_array_equal(got["A"], big[::-1])


def _framed(message: tuple[object, ...]) -> bytes:
    return Link.frame(*message)


def test_a_link_gives_a_repeated_execute_message_again_and_parses_others() -> None:
    reader_end, writer_end = multiprocessing.Pipe(duplex=False)
    link = Link(reader_end)
    link.memo = ("execute",)
    fd = writer_end.fileno()
    try:
        execute = ("execute", "arena", [("A", "<f4", (4,), 0, 16)], ["B"], None, [], True)
        os.write(fd, _framed(execute))
        first = link.recv()
        os.write(fd, _framed(execute))
        assert link.recv() is first  # the same bytes: the same message
        other = ("execute", "arena", [("A", "<f4", (5,), 0, 20)], ["B"], None, [], True)
        os.write(fd, _framed(other))
        assert link.recv() == other
        reply = ("reply", 1, True, {"x": 1})
        received = []
        for _ in range(2):  # never kept: a reply's payload goes to the model
            os.write(fd, _framed(reply))
            received.append(link.recv())
        assert received == [reply, reply]
        assert received[0] is not received[1]
        # A message split over reads, and two in one read, still arrive whole.
        data = _framed(execute)
        os.write(fd, data[:3])
        os.write(fd, data[3:] + _framed(other))
        assert link.recv() == execute
        assert link.recv() == other
        assert struct.unpack_from("<I", data)[0] == len(data) - 4
    finally:
        link.close()
        writer_end.close()
