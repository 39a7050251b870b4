"""A local client that shrinks its own shared memory object must not crash the server.

Reading or writing a mapping past the end of a shrunk object raises SIGBUS, which kills a
Python process. The server reads and writes regions through the object's file descriptor
instead, and checks the object's current size first: a shrunk object is refused with
INVALID_ARGUMENT naming the region, and a client that shrinks it during the copy gets a
refusal or a short read reported as an error, never a dead server.
"""

from __future__ import annotations

import os
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from onnx import TensorProto
from tritonclient.utils import InferenceServerException

from configs.generate import SIMPLE_CONFIG, identity_model, save, simple_model
from tests.serverproc import ServerProcess

BYTES = 16 * 4  # one INT32 [1, 16] tensor
BIG_ELEMENTS = 1 << 20  # 4 MiB of FP32: a copy long enough for a shrink to land inside it


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server of this module's own: a crash here must not take the session's server down."""
    root = tmp_path_factory.mktemp("hostile_shm")
    save(simple_model(), root / "simple" / "1" / "model.onnx")
    (root / "simple" / "config.pbtxt").write_text(SIMPLE_CONFIG)
    save(identity_model(TensorProto.FLOAT, ["batch", "n"]), root / "big" / "1" / "model.onnx")
    (root / "big" / "config.pbtxt").write_text(
        'name: "big"\nbackend: "onnxruntime"\nmax_batch_size: 1\n'
        'input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]\n'
        'output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]\n'
    )
    proc = ServerProcess(
        root,
        "--allow-client-shm=true",
        log_path=tmp_path_factory.mktemp("hostile_logs") / "server.log",
    )
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()


class Region:
    """A POSIX shared memory object the test owns, created as tritonclient does."""

    def __init__(self, byte_size: int) -> None:
        tag = uuid.uuid4().hex[:8]
        self.name = f"hostile-{tag}"
        self.key = f"/edge_hostile_{tag}"
        self.byte_size = byte_size
        self.handle = shm.create_shared_memory_region(self.name, self.key, byte_size)
        self.path = Path("/dev/shm") / self.key.lstrip("/")

    def shrink(self, size: int = 0) -> None:
        os.truncate(self.path, size)

    def restore(self) -> None:
        os.truncate(self.path, self.byte_size)

    def destroy(self) -> None:
        shm.destroy_shared_memory_region(self.handle)


@pytest.fixture
def make_region() -> Iterator[Callable[[int], Region]]:
    made: list[Region] = []

    def make(byte_size: int) -> Region:
        made.append(Region(byte_size))
        return made[-1]

    yield make
    for region in made:
        region.destroy()


def _client(server: ServerProcess, protocol: str) -> tuple[Any, Any]:
    if protocol == "http":
        return httpclient, httpclient.InferenceServerClient(server.http_url)
    return grpcclient, grpcclient.InferenceServerClient(server.grpc_url)


def _simple_request(module: Any, inp: str, out: str | None) -> tuple[list[Any], list[Any]]:
    inputs = [
        module.InferInput("INPUT0", [1, 16], "INT32"),
        module.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    inputs[0].set_shared_memory(inp, BYTES, offset=0)
    inputs[1].set_shared_memory(inp, BYTES, offset=BYTES)
    outputs = [module.InferRequestedOutput("OUTPUT0"), module.InferRequestedOutput("OUTPUT1")]
    if out is not None:
        outputs[0].set_shared_memory(out, BYTES, offset=0)
        outputs[1].set_shared_memory(out, BYTES, offset=BYTES)
    return inputs, outputs


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_shrunk_input_object_is_refused_naming_the_region(
    server: ServerProcess, make_region: Callable[[int], Region], protocol: str
) -> None:
    module, client = _client(server, protocol)
    region = make_region(BYTES * 2)
    shm.set_shared_memory_region(
        region.handle, [np.arange(16, dtype=np.int32), np.ones(16, np.int32)]
    )
    client.register_system_shared_memory(region.name, region.key, BYTES * 2)
    try:
        region.shrink(0)
        inputs, outputs = _simple_request(module, region.name, None)
        with pytest.raises(InferenceServerException) as caught:
            client.infer("simple", inputs, outputs=outputs)
        message = caught.value.message()
        assert f"shared memory region '{region.name}'" in message
        assert "is now 0 bytes" in message
        assert caught.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")
        assert client.is_server_live()
        # Grown back, the same registration works again.
        region.restore()
        shm.set_shared_memory_region(
            region.handle, [np.arange(16, dtype=np.int32), np.ones(16, np.int32)]
        )
        result = client.infer("simple", inputs, outputs=outputs)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0")[0], np.arange(16) + 1)
    finally:
        client.unregister_system_shared_memory(region.name)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_shrunk_output_object_is_refused_naming_the_region(
    server: ServerProcess, make_region: Callable[[int], Region], protocol: str
) -> None:
    module, client = _client(server, protocol)
    source = make_region(BYTES * 2)
    target = make_region(BYTES * 2)
    shm.set_shared_memory_region(source.handle, [np.ones(16, np.int32), np.ones(16, np.int32)])
    client.register_system_shared_memory(source.name, source.key, BYTES * 2)
    client.register_system_shared_memory(target.name, target.key, BYTES * 2)
    try:
        target.shrink(BYTES // 2)
        inputs, outputs = _simple_request(module, source.name, target.name)
        with pytest.raises(InferenceServerException) as caught:
            client.infer("simple", inputs, outputs=outputs)
        message = caught.value.message()
        assert f"shared memory region '{target.name}'" in message
        assert f"is now {BYTES // 2} bytes" in message
        assert client.is_server_live()
        # The refusal wrote nothing: the object was not grown back by the server.
        assert target.path.stat().st_size == BYTES // 2
    finally:
        client.unregister_system_shared_memory(source.name)
        client.unregister_system_shared_memory(target.name)


def test_shrinking_during_the_copies_never_kills_the_server(
    server: ServerProcess, make_region: Callable[[int], Region]
) -> None:
    """The race: the object shrinks and grows again while large tensors are copied in and out.
    Every request either succeeds or is refused naming the region; the server stays up."""
    data = np.arange(BIG_ELEMENTS, dtype=np.float32)
    source = make_region(data.nbytes)
    target = make_region(data.nbytes)
    shm.set_shared_memory_region(source.handle, [data])
    client = httpclient.InferenceServerClient(server.http_url)
    client.register_system_shared_memory(source.name, source.key, data.nbytes)
    client.register_system_shared_memory(target.name, target.key, data.nbytes)
    stop = threading.Event()

    def flip() -> None:
        # Shrink and grow both objects as fast as possible. A grown object reads as zeros.
        while not stop.is_set():
            source.shrink(data.nbytes // 3)
            target.shrink(data.nbytes // 3)
            source.restore()
            target.restore()

    flipper = threading.Thread(target=flip)
    flipper.start()
    refusals: list[InferenceServerException] = []
    succeeded = 0
    try:
        for _ in range(40):
            inp = httpclient.InferInput("INPUT0", [1, BIG_ELEMENTS], "FP32")
            inp.set_shared_memory(source.name, data.nbytes)
            out = httpclient.InferRequestedOutput("OUTPUT0")
            out.set_shared_memory(target.name, data.nbytes)
            try:
                client.infer("big", [inp], outputs=[out])
                succeeded += 1
            except InferenceServerException as exc:
                refusals.append(exc)
    finally:
        stop.set()
        flipper.join()
        client.unregister_system_shared_memory(source.name)
        client.unregister_system_shared_memory(target.name)
    assert server.proc.poll() is None, server.log()[-2000:]
    assert client.is_server_live()
    assert succeeded + len(refusals) == 40
    # Every refusal is the client's fault, said as such: 400 naming the region.
    assert [(e.status(), "shared memory region" in e.message()) for e in refusals] == [
        ("400", True)
    ] * len(refusals), [e.message() for e in refusals]


# ---- a symbolic link in /dev/shm (issue 31, item 4) --------------------------------------------


@pytest.fixture
def planted_link(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """/dev/shm/<name> -> a file of the test's own outside /dev/shm (standing in for one only
    root may read): a local user's attempt to read and overwrite it through inferences."""
    secret = tmp_path / "secret"
    secret.write_bytes(b"S" * BYTES * 2)
    tag = uuid.uuid4().hex[:8]
    link = Path("/dev/shm") / f"edge_link_{tag}"
    link.symlink_to(secret)
    try:
        yield f"/{link.name}", secret
    finally:
        link.unlink()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_symbolic_link_in_dev_shm_is_refused(
    server: ServerProcess, planted_link: tuple[str, Path], protocol: str
) -> None:
    key, secret = planted_link
    module, client = _client(server, protocol)
    with pytest.raises(InferenceServerException) as caught:
        client.register_system_shared_memory("planted", key, BYTES * 2)
    assert caught.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")
    message = caught.value.message()
    assert f"Unable to open shared memory region: '{key}'" in message
    assert "symbolic link" in message
    assert "planted" not in str(client.get_system_shared_memory_status())
    # Nothing reaches the file through the name: an infer naming it finds no region.
    inputs, outputs = _simple_request(module, "planted", "planted")
    with pytest.raises(InferenceServerException, match="Unable to find shared memory region"):
        client.infer("simple", inputs, outputs=outputs)
    assert secret.read_bytes() == b"S" * BYTES * 2


def test_a_fifo_in_dev_shm_is_refused_without_blocking(server: ServerProcess) -> None:
    """Not a regular file: refused at once (O_NONBLOCK: opening a FIFO never waits)."""
    name = f"edge_fifo_{uuid.uuid4().hex[:8]}"
    fifo = Path("/dev/shm") / name
    os.mkfifo(fifo)
    try:
        client = httpclient.InferenceServerClient(server.http_url, network_timeout=10)
        with pytest.raises(InferenceServerException, match="not a regular file") as caught:
            client.register_system_shared_memory("fifo", f"/{name}", BYTES)
        assert caught.value.status() == "400"
    finally:
        fifo.unlink()


# ---- the cap on registered regions (issue 31, item 7) ------------------------------------------

OPEN_FILES = 256  # the server's open-file limit in the test below: regions may take half


def test_regions_are_capped_below_the_open_file_limit(
    tmp_path: Path, make_region: Callable[[int], Region]
) -> None:
    """With 256 descriptors and the default --max-shm-regions, 128 regions register, the next
    is refused with RESOURCE_EXHAUSTED (HTTP 429) naming the cap, and new connections still
    work. Without the cap a client takes every descriptor and the server accepts none."""
    root = tmp_path / "models"
    save(simple_model(), root / "simple" / "1" / "model.onnx")
    (root / "simple" / "config.pbtxt").write_text(SIMPLE_CONFIG)
    # Soft and hard at 256: the server cannot raise it further.
    launcher = (
        sys.executable,
        "-c",
        "import os, resource, sys; "
        f"resource.setrlimit(resource.RLIMIT_NOFILE, ({OPEN_FILES}, {OPEN_FILES})); "
        "os.execv(sys.argv[1], sys.argv[1:])",
    )
    region = make_region(BYTES)
    cap = OPEN_FILES // 2
    with ServerProcess(
        root, "--allow-client-shm=true", log_path=tmp_path / "server.log", launcher=launcher
    ) as proc:
        client = httpclient.InferenceServerClient(proc.http_url)
        for i in range(cap):
            client.register_system_shared_memory(f"r{i}", region.key, BYTES)
        with pytest.raises(InferenceServerException) as caught:
            client.register_system_shared_memory("one-more", region.key, BYTES)
        assert caught.value.status() == "429"
        assert f"{cap} regions are registered" in caught.value.message()
        assert "--max-shm-regions" in caught.value.message()
        grpc_client = grpcclient.InferenceServerClient(proc.grpc_url)
        with pytest.raises(InferenceServerException) as caught:
            grpc_client.register_system_shared_memory("one-more", region.key, BYTES)
        assert caught.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
        # Fresh connections are accepted and served.
        for _ in range(20):
            fresh = httpclient.InferenceServerClient(proc.http_url)
            assert fresh.is_server_live()
            fresh.close()
        inputs, outputs = _simple_request(httpclient, "missing", None)
        with pytest.raises(InferenceServerException, match="Unable to find"):
            client.infer("simple", inputs, outputs=outputs)
        # Unregistering makes room again.
        client.unregister_system_shared_memory("r0")
        client.register_system_shared_memory("one-more", region.key, BYTES)
        client.unregister_system_shared_memory()
        assert "the most this server allows" not in proc.log()
