"""System shared memory regions: requests hold the regions they use, so unregistering one
waits for them (tritonserver's behaviour); tritonserver's error texts and codes."""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Iterator

import numpy as np
import pytest

from appliance.common.errors import ErrorCode, InvalidInput, ModelNotFound
from appliance.services.shared_memory import (
    ARENA_KEY_PREFIX,
    SHM_ROOT,
    RegionExists,
    RegionNotFound,
    SharedMemoryRegistry,
    shm_target,
)

SIZE = 64


@pytest.fixture
def key() -> Iterator[str]:
    """A POSIX shared memory object of SIZE bytes."""
    name = f"edge_unit_{uuid.uuid4().hex[:10]}"
    path = os.path.join(SHM_ROOT, name)
    with open(path, "wb") as f:
        f.write(bytes(range(SIZE)))
    yield f"/{name}"
    os.unlink(path)


def _names(registry: SharedMemoryRegistry) -> list[str]:
    return [r["name"] for r in registry.status()]


def _output(region: str, offset: int = 0, byte_size: int = 8) -> dict[str, object]:
    return {
        "shared_memory_region": region,
        "shared_memory_offset": offset,
        "shared_memory_byte_size": byte_size,
    }


def test_unregistering_a_region_a_request_holds_waits_for_the_request(key: str) -> None:
    registry = SharedMemoryRegistry()
    registry.register("out", key, 0, SIZE)
    with registry.request_scope():
        target = shm_target(_output("out"), "model 'm' output 'Y'")  # decoding: held
        registry.unregister("out")  # succeeds at once ...
        assert _names(registry) == ["out"]  # ... but the region stays while it is held
        with pytest.raises(RegionExists, match="'out' already in manager"):
            registry.register("out", key, 0, SIZE)
        # The response is written after the unregister, into the region the request named.
        assert target is not None
        registry.write(target.region, 0, np.full(8, 7, np.uint8), "model 'm' output 'Y'")
    assert _names(registry) == []  # gone once the request is done
    with open(os.path.join(SHM_ROOT, key.lstrip("/")), "rb") as f:
        assert f.read(8) == bytes([7] * 8)
    with pytest.raises(RegionNotFound, match="Unable to find shared memory region: 'out'"):
        registry.read("out", 0, 8, "model 'm' input 'X'")


def test_a_region_goes_when_the_last_request_holding_it_is_done(key: str) -> None:
    registry = SharedMemoryRegistry()
    registry.register("in", key, 0, SIZE)
    first, second = registry.request_scope(), registry.request_scope()
    first.__enter__()
    registry.read("in", 0, 8, "first")
    first_holds_only = threading.Event()

    def other_request() -> None:  # another task or thread: its own scope
        with registry.request_scope():
            registry.read("in", 8, 8, "second")
            first_holds_only.wait(5)

    thread = threading.Thread(target=other_request)
    thread.start()
    registry.unregister()  # all
    assert _names(registry) == ["in"]
    first.__exit__(None, None, None)
    assert _names(registry) == ["in"]  # the second request still holds it
    first_holds_only.set()
    thread.join(5)
    assert _names(registry) == []
    del second


def test_without_a_request_scope_unregister_is_immediate(key: str) -> None:
    registry = SharedMemoryRegistry()
    registry.register("r", key, 0, SIZE)
    registry.read("r", 0, 8, "outside any request")
    registry.unregister("r")
    assert _names(registry) == []
    registry.register("r", key, 0, SIZE)  # the name is free again


def test_a_request_scope_checks_an_output_window_at_decoding(key: str) -> None:
    """As tritonserver: a bad output window is refused before the model runs."""
    registry = SharedMemoryRegistry()
    registry.register("out", key, 0, SIZE)
    with registry.request_scope():
        with pytest.raises(InvalidInput, match=r"Invalid offset \+ byte size .*'out'"):
            shm_target(_output("out", 60, 8), "model 'm' output 'Y'")
        with pytest.raises(RegionNotFound):
            shm_target(_output("nope"), "model 'm' output 'Y'")
    assert shm_target(_output("out", 60, 8), "outside a scope: checked at the write") is not None


@pytest.mark.parametrize(
    ("offset", "byte_size", "text"),
    [
        (SIZE, 0, "Invalid offset for shared memory region: 'w'"),
        (SIZE + 8, 4, "Invalid offset for shared memory region: 'w'"),
        (2**64 - 32, 4, "Invalid offset for shared memory region: 'w'"),
        (1, SIZE, "Invalid offset \\+ byte size for shared memory region: 'w'"),
        (0, SIZE + 1, "Invalid offset \\+ byte size for shared memory region: 'w'"),
    ],
)
def test_bad_windows_get_tritonservers_texts(
    key: str, offset: int, byte_size: int, text: str
) -> None:
    registry = SharedMemoryRegistry()
    registry.register("w", key, 0, SIZE)
    with pytest.raises(InvalidInput, match=f"^{text} \\(model 'm' input 'X': ") as err:
        registry.read("w", offset, byte_size, "model 'm' input 'X'")
    assert err.value.code is ErrorCode.INVALID_ARG


def test_a_byte_size_past_2_to_the_64_is_tritonservers_overflow(key: str) -> None:
    registry = SharedMemoryRegistry()
    registry.register("w", key, 0, SIZE)
    with pytest.raises(InvalidInput, match=r"^Integer overflow detected: byte_size \("):
        registry.read("w", 32, 2**64 - 32, "model 'm' output 'Y'")


def test_an_unknown_region_is_not_found_as_tritonserver_answers() -> None:
    registry = SharedMemoryRegistry()
    with pytest.raises(RegionNotFound, match=r"^Unable to find shared memory region: 'x' ") as err:
        registry.read("x", 0, 4, "model 'm' input 'X'")
    assert err.value.code is ErrorCode.NOT_FOUND  # 404 / NOT_FOUND, as tritonserver
    with pytest.raises(ModelNotFound, match="Unable to find system shared memory region: 'x'"):
        registry.status("x")


@pytest.mark.parametrize(
    ("key_text", "message"),
    [
        ("/", "cannot register shared memory region 'r' - invalid shm key '/'"),
        ("///", "cannot register shared memory region 'r' - invalid shm key '///'"),
        (
            "/triton_python_backend_shm_region_x",
            "cannot register shared memory region 'r' with key "
            "'/triton_python_backend_shm_region_x' as the key contains the reserved prefix "
            "'triton_python_backend_shm_region_'",
        ),
        ("/edge_no_such_object", "Unable to open shared memory region: '/edge_no_such_object'"),
        ("/a/b", "Unable to open shared memory region: '/a/b'"),
    ],
)
def test_registration_errors_get_tritonservers_texts(key_text: str, message: str) -> None:
    with pytest.raises(InvalidInput) as err:
        SharedMemoryRegistry().register("r", key_text, 0, 16)
    assert str(err.value).startswith(message), str(err.value)


def test_a_python_model_arena_cannot_be_registered(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The server's own tensor arenas (their names are edge_backends/python/shm.py's PREFIX)
    are never a client's region, even while one is named in /dev/shm."""
    from edge_backends.python.shm import PREFIX

    assert PREFIX.lstrip("/") == ARENA_KEY_PREFIX
    key = f"{PREFIX}client-{uuid.uuid4().hex[:8]}"
    fd = os.open(f"/dev/shm{key}", os.O_CREAT | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, 64)
        with pytest.raises(
            InvalidInput, match=f"contains the reserved prefix '{ARENA_KEY_PREFIX}'"
        ):
            SharedMemoryRegistry().register("r", key, 0, 16)
    finally:
        os.close(fd)
        os.unlink(f"/dev/shm{key}")


def test_a_window_past_the_object_is_invalid_args(key: str) -> None:
    with pytest.raises(InvalidInput) as err:
        SharedMemoryRegistry().register("big", key, 0, SIZE * 2)
    assert str(err.value).startswith("failed to register shared memory region 'big': invalid args")
    assert f"is {SIZE} bytes" in str(err.value)
