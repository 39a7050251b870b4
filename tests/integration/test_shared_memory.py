"""System shared memory, driven as Triton's own examples do (tritonclient.utils.shared_memory)."""

from __future__ import annotations

import base64
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from tests.serverproc import ServerProcess

BYTES = 16 * 4  # one INT32 [1, 16] tensor


@pytest.fixture
def regions() -> Iterator[dict[str, Any]]:
    """An input region holding INPUT0 and INPUT1, and an output region for both outputs."""
    tag = uuid.uuid4().hex[:8]
    inputs = shm.create_shared_memory_region(f"in-{tag}", f"/edge_in_{tag}", BYTES * 2)
    outputs = shm.create_shared_memory_region(f"out-{tag}", f"/edge_out_{tag}", BYTES * 2)
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 3, dtype=np.int32)
    shm.set_shared_memory_region(inputs, [a, b])
    yield {"tag": tag, "in": inputs, "out": outputs, "a": a, "b": b}
    shm.destroy_shared_memory_region(inputs)
    shm.destroy_shared_memory_region(outputs)


def _register(client: Any, r: dict[str, Any]) -> tuple[str, str]:
    tag = r["tag"]
    client.register_system_shared_memory(f"in-{tag}", f"/edge_in_{tag}", BYTES * 2)
    client.register_system_shared_memory(f"out-{tag}", f"/edge_out_{tag}", BYTES * 2)
    return f"in-{tag}", f"out-{tag}"


def _io(module: Any, inp: str, out: str) -> tuple[list[Any], list[Any]]:
    inputs = [
        module.InferInput("INPUT0", [1, 16], "INT32"),
        module.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    inputs[0].set_shared_memory(inp, BYTES, offset=0)
    inputs[1].set_shared_memory(inp, BYTES, offset=BYTES)
    outputs = [module.InferRequestedOutput("OUTPUT0"), module.InferRequestedOutput("OUTPUT1")]
    outputs[0].set_shared_memory(out, BYTES, offset=0)
    outputs[1].set_shared_memory(out, BYTES, offset=BYTES)
    return inputs, outputs


def _check_outputs(result: Any, r: dict[str, Any]) -> None:
    # The response carries shapes only; the data is in the client's output region.
    output = result.get_output("OUTPUT0")
    shape = output["shape"] if isinstance(output, dict) else list(output.shape)
    assert [int(d) for d in shape] == [1, 16]
    total = shm.get_contents_as_numpy(r["out"], np.int32, [1, 16], offset=0)
    diff = shm.get_contents_as_numpy(r["out"], np.int32, [1, 16], offset=BYTES)
    np.testing.assert_array_equal(total, r["a"] + r["b"])
    np.testing.assert_array_equal(diff, r["a"] - r["b"])


def test_http_register_infer_status_unregister(server: ServerProcess, regions: dict) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    inp, out = _register(client, regions)
    status = {s["name"]: s for s in client.get_system_shared_memory_status()}
    assert status[inp]["key"] == f"/edge_in_{regions['tag']}"
    assert int(status[inp]["byte_size"]) == BYTES * 2
    inputs, outputs = _io(httpclient, inp, out)
    _check_outputs(client.infer("simple", inputs, outputs=outputs), regions)
    client.unregister_system_shared_memory(inp)
    client.unregister_system_shared_memory(out)
    names = {s["name"] for s in client.get_system_shared_memory_status()}
    assert inp not in names
    assert out not in names


def test_grpc_register_infer_status_unregister(server: ServerProcess, regions: dict) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    inp, out = _register(client, regions)
    status = client.get_system_shared_memory_status(as_json=True)["regions"]
    assert status[out]["key"] == f"/edge_out_{regions['tag']}"
    inputs, outputs = _io(grpcclient, inp, out)
    _check_outputs(client.infer("simple", inputs, outputs=outputs), regions)
    client.unregister_system_shared_memory()  # all
    assert client.get_system_shared_memory_status(as_json=True).get("regions", {}) == {}


def test_grpc_mixes_shared_memory_and_in_band_tensors(server: ServerProcess, regions: dict) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    inp, out = _register(client, regions)
    try:
        inputs = [
            grpcclient.InferInput("INPUT0", [1, 16], "INT32"),
            grpcclient.InferInput("INPUT1", [1, 16], "INT32"),
        ]
        inputs[0].set_data_from_numpy(np.ones((1, 16), np.int32) * 10)  # in the message
        inputs[1].set_shared_memory(inp, BYTES, offset=BYTES)  # b, from shared memory
        outputs = [
            grpcclient.InferRequestedOutput("OUTPUT0"),
            grpcclient.InferRequestedOutput("OUTPUT1"),
        ]
        outputs[1].set_shared_memory(out, BYTES, offset=BYTES)
        result = client.infer("simple", inputs, outputs=outputs)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), 10 + regions["b"])
        diff = shm.get_contents_as_numpy(regions["out"], np.int32, [1, 16], offset=BYTES)
        np.testing.assert_array_equal(diff, 10 - regions["b"])
    finally:
        client.unregister_system_shared_memory()


def test_http_input_from_shared_memory_output_in_the_response(
    server: ServerProcess, regions: dict
) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    inp, out = _register(client, regions)
    try:
        inputs, _ = _io(httpclient, inp, out)
        result = client.infer("simple", inputs)  # outputs come back in the body
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), regions["a"] + regions["b"])
    finally:
        client.unregister_system_shared_memory()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_bad_windows_get_precise_errors(
    server: ServerProcess, regions: dict, protocol: str
) -> None:
    module: Any = httpclient if protocol == "http" else grpcclient
    url = server.http_url if protocol == "http" else server.grpc_url
    client = module.InferenceServerClient(url)
    inp, out = _register(client, regions)
    try:
        inputs, outputs = _io(module, inp, out)
        inputs[1].set_shared_memory(inp, BYTES, offset=BYTES + 8)  # runs past the region
        with pytest.raises(
            InferenceServerException, match="Invalid offset \\+ byte size for shared memory region"
        ):
            client.infer("simple", inputs, outputs=outputs)
        inputs, outputs = _io(module, inp, out)
        inputs[0].set_shared_memory(inp, BYTES - 4, offset=0)  # one element short
        with pytest.raises(
            InferenceServerException,
            match=r"input byte size mismatch for input 'INPUT0' for model 'simple'\. Expected 64, "
            r"got 60",
        ):
            client.infer("simple", inputs, outputs=outputs)
        inputs, outputs = _io(module, inp, out)
        outputs[0].set_shared_memory(out, 8, offset=0)  # too small for the output
        with pytest.raises(InferenceServerException, match="more than shared_memory_byte_size"):
            client.infer("simple", inputs, outputs=outputs)
        inputs, outputs = _io(module, "no-such-region", out)
        with pytest.raises(
            InferenceServerException, match="Unable to find shared memory region: 'no-such-region'"
        ) as err:
            client.infer("simple", inputs, outputs=outputs)
        assert err.value.status() in ("404", "StatusCode.NOT_FOUND")  # as tritonserver
        inputs, outputs = _io(module, inp, out)
        outputs[1].set_shared_memory(out, BYTES, offset=BYTES * 2)  # starts past the region
        with pytest.raises(
            InferenceServerException, match=f"Invalid offset for shared memory region: '{out}'"
        ) as err:
            client.infer("simple", inputs, outputs=outputs)
        assert err.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")
        with pytest.raises(InferenceServerException, match="already in manager"):
            client.register_system_shared_memory(inp, f"/edge_in_{regions['tag']}", BYTES)
        with pytest.raises(InferenceServerException, match="Unable to open shared memory region"):
            client.register_system_shared_memory("ghost", "/edge_no_such_key", BYTES)
        with pytest.raises(
            InferenceServerException, match="failed to register shared memory region 'big': inv"
        ):
            client.register_system_shared_memory("big", f"/edge_in_{regions['tag']}", BYTES * 4)
        # And the server still serves everything else.
        inputs, outputs = _io(module, inp, out)
        _check_outputs(client.infer("simple", inputs, outputs=outputs), regions)
    finally:
        client.unregister_system_shared_memory()


def test_region_unregistered_mid_stream(server: ServerProcess, regions: dict) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    inp, out = _register(client, regions)
    results: list[Any] = []
    done = threading.Event()

    def callback(result: Any, error: Any) -> None:
        results.append(error if error is not None else result)
        if len(results) == 2:
            done.set()

    client.start_stream(callback=callback)
    try:
        inputs, outputs = _io(grpcclient, inp, out)
        client.async_stream_infer("simple", inputs, outputs=outputs, request_id="1")
        deadline = threading.Event()
        for _ in range(100):
            if results:
                break
            deadline.wait(0.05)
        client.unregister_system_shared_memory(inp)
        client.async_stream_infer("simple", inputs, outputs=outputs, request_id="2")
        assert done.wait(10)
    finally:
        client.stop_stream()
        client.unregister_system_shared_memory()
    first, second = results
    _check_outputs(first, regions)
    assert isinstance(second, InferenceServerException)
    assert "Unable to find shared memory region" in second.message()
    assert client.is_server_live()


def test_unregister_while_a_request_reads_the_region_is_safe(server: ServerProcess) -> None:
    """A slow request keeps its view of the region after the region is unregistered."""
    tag = uuid.uuid4().hex[:8]
    data = np.random.default_rng(0).random((1, 1024), dtype=np.float32)
    region = shm.create_shared_memory_region(f"slow-{tag}", f"/edge_slow_{tag}", data.nbytes)
    shm.set_shared_memory_region(region, [data])
    client = httpclient.InferenceServerClient(server.http_url)
    client.register_system_shared_memory(f"slow-{tag}", f"/edge_slow_{tag}", data.nbytes)
    outcome: list[Any] = []

    def slow_request() -> None:
        own = httpclient.InferenceServerClient(server.http_url)
        inp = httpclient.InferInput("INPUT0", [1, 1024], "FP32")
        inp.set_shared_memory(f"slow-{tag}", data.nbytes)
        try:
            outcome.append(own.infer("slow", [inp]).as_numpy("OUTPUT0"))
        except InferenceServerException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=slow_request)
    thread.start()
    threading.Event().wait(0.05)
    client.unregister_system_shared_memory(f"slow-{tag}")
    thread.join(60)
    shm.destroy_shared_memory_region(region)
    assert len(outcome) == 1
    assert isinstance(outcome[0], np.ndarray), outcome[0]
    assert outcome[0].shape == (1, 1024)
    assert client.is_server_live()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_unregistering_an_output_region_while_a_request_runs(
    server: ServerProcess, protocol: str
) -> None:
    """A slow request names an output region; the region is unregistered while the request
    waits behind others. As tritonserver, the request's output is written to the region and the
    region goes when the request is done (the front ends hold the regions a request names from
    its decoding until its response is written); afterwards the region is gone and the server
    serves on. Without the hold, the queued request fails with "Unable to find"."""
    module: Any = httpclient if protocol == "http" else grpcclient
    url = server.http_url if protocol == "http" else server.grpc_url
    tag = uuid.uuid4().hex[:8]
    size = 1024 * 4
    region = shm.create_shared_memory_region(f"late-{tag}", f"/edge_late_{tag}", size)
    client = module.InferenceServerClient(url)
    client.register_system_shared_memory(f"late-{tag}", f"/edge_late_{tag}", size)
    data = np.arange(1024, dtype=np.float32).reshape(1, 1024)
    outcome: list[Any] = []

    def request(shm_output: bool) -> None:
        own = module.InferenceServerClient(url)
        inp = module.InferInput("INPUT0", [1, 1024], "FP32")
        inp.set_data_from_numpy(data)
        out = module.InferRequestedOutput("OUTPUT0")
        if shm_output:
            out.set_shared_memory(f"late-{tag}", size)
        try:
            own.infer("slow", [inp], outputs=[out])
            if shm_output:
                outcome.append("ok")
        except InferenceServerException as exc:
            if shm_output:
                outcome.append(exc)

    # Keep the model's instance busy so that the request waits in the queue.
    # (12 requests of tens of ms: ours waits well past the unregister, within the queue bound.)
    busy = [threading.Thread(target=request, args=(False,)) for _ in range(12)]
    for thread in busy:
        thread.start()
    threading.Event().wait(0.05)
    ours = threading.Thread(target=request, args=(True,))
    ours.start()
    threading.Event().wait(0.2)
    client.unregister_system_shared_memory(f"late-{tag}")
    for thread in [*busy, ours]:
        thread.join(60)
    try:
        assert outcome == ["ok"]  # tritonserver's behaviour: the request was waited for
        written = shm.get_contents_as_numpy(region, np.float32, [1, 1024])
        inp = module.InferInput("INPUT0", [1, 1024], "FP32")
        inp.set_data_from_numpy(data)
        expected = client.infer("slow", [inp]).as_numpy("OUTPUT0")
        np.testing.assert_allclose(written, expected, rtol=1e-6)
        status = client.get_system_shared_memory_status()
        names = [r["name"] for r in status] if protocol == "http" else list(status.regions)
        assert f"late-{tag}" not in names
        assert client.is_server_live()
    finally:
        shm.destroy_shared_memory_region(region)


DISABLED = (
    "Client shared memory is disabled. Start the server with '--allow-client-shm=true' to enable."
)


@pytest.mark.parametrize("module", [httpclient, grpcclient])
def test_without_allow_client_shm_regions_cannot_be_registered(  # type: ignore[no-untyped-def]
    start_server, model_repository, regions: dict, module: Any
) -> None:
    """tritonserver's default since 2026: a client may not map the device's shared memory
    objects unless the server allows it; status stays open (and empty)."""
    proc = start_server(model_repository)
    client = proc.client(module)
    http = module is httpclient
    with pytest.raises(InferenceServerException) as info:
        _register(client, regions)
    assert info.value.message().endswith(DISABLED)
    assert info.value.status() == ("403" if http else "StatusCode.PERMISSION_DENIED")
    for unregister in (
        client.unregister_system_shared_memory,
        client.unregister_cuda_shared_memory,
    ):
        with pytest.raises(InferenceServerException, match="Client shared memory is disabled"):
            unregister()
    handle = base64.b64encode(bytes(64)) if http else bytes(64)  # as each client takes it
    with pytest.raises(InferenceServerException, match="Client shared memory is disabled"):
        client.register_cuda_shared_memory("gpu", handle, 0, 64)
    status = client.get_system_shared_memory_status()
    assert (status if http else list(status.regions)) == []
    # A request naming a region finds none (and the server goes on serving).
    inputs, outputs = _io(module, f"in-{regions['tag']}", f"out-{regions['tag']}")
    with pytest.raises(InferenceServerException, match="Unable to find shared memory region"):
        client.infer("simple", inputs, outputs=outputs)
    assert client.is_server_live()
