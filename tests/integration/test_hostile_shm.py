"""A local client that shrinks its own shared memory object must not crash the server.

Reading or writing a mapping past the end of a shrunk object raises SIGBUS, which kills a
Python process. The server reads and writes regions through the object's file descriptor
instead, and checks the object's current size first: a shrunk object is refused with
INVALID_ARGUMENT naming the region, and a client that shrinks it during the copy gets a
refusal or a short read reported as an error, never a dead server.
"""

from __future__ import annotations

import os
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
