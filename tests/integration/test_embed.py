"""The embedding API (appliance/embed/): Triton's in-process `tritonserver` and `tritonfrontend`
names on this server, end to end, with real models and the real tritonclient (issue 38)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from appliance import tritonfrontend, tritonserver
from configs.generate import SIMPLE_CONFIG, save, simple_model
from tests.integration.models import PY_REPEAT, PY_REPEAT_CONFIG

IDENTITY_CONFIG = """\
name: "identity_fp32"
backend: "identity"
max_batch_size: 0
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
"""


def _repository(root: Path) -> Path:
    save(simple_model(), root / "simple" / "1" / "model.onnx")
    (root / "simple" / "config.pbtxt").write_text(SIMPLE_CONFIG)
    save(simple_model(), root / "later" / "1" / "model.onnx")  # loaded by the test
    (root / "later" / "config.pbtxt").write_text(SIMPLE_CONFIG.replace('"simple"', '"later"'))
    (root / "identity_fp32" / "1").mkdir(parents=True)
    (root / "identity_fp32" / "config.pbtxt").write_text(IDENTITY_CONFIG)
    (root / "py_repeat" / "1").mkdir(parents=True)
    (root / "py_repeat" / "1" / "model.py").write_text(PY_REPEAT)
    config = PY_REPEAT_CONFIG.replace("{name}", "py_repeat")
    (root / "py_repeat" / "config.pbtxt").write_text(config)
    return root


class Logs:
    def __init__(self) -> None:
        self.lines: list[tuple[tritonserver.LogLevel, str]] = []

    def __call__(self, level: tritonserver.LogLevel, message: str) -> None:
        self.lines.append((level, message))


@pytest.fixture(scope="module")
def logs() -> Logs:
    return Logs()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, logs: Logs) -> Iterator[tritonserver.Server]:
    repo = _repository(tmp_path_factory.mktemp("embed-models"))
    options = tritonserver.Options(
        model_repository=str(repo),
        model_control_mode=tritonserver.ModelControlMode.EXPLICIT,
        startup_models=["simple", "identity_fp32", "py_repeat"],
        log_info=True,
        log_callback=logs,
        server_args=[
            "--model-store-dir", str(tmp_path_factory.mktemp("embed-store")),
            "--allow-client-shm=true",
        ],
    )  # fmt: skip
    started = tritonserver.Server(options).start(wait_until_ready=True)
    yield started
    started.stop()


def _simple_inputs() -> dict[str, np.ndarray[Any, Any]]:
    return {
        "INPUT0": np.arange(16, dtype=np.int32).reshape(1, 16),
        "INPUT1": np.ones((1, 16), dtype=np.int32),
    }


def test_start_ready_models_and_metadata(server: tritonserver.Server) -> None:
    assert server.ready()
    assert server.live()
    models = server.models()
    assert models[("simple", 1)].state == "READY"
    assert models[("later", -1)].state is None  # in the repository, not loaded
    assert models["simple"].name == "simple"
    with pytest.raises(KeyError, match="Unknown Model"):
        models["absent"]
    assert server.metadata()["name"] == "triton"
    meta = server.model("simple").metadata()
    assert meta["inputs"][0] == {"name": "INPUT0", "datatype": "INT32", "shape": [-1, 16]}
    assert server.model("simple").config()["max_batch_size"] == 8


def test_infer_returns_the_outputs_as_numpy(server: tritonserver.Server) -> None:
    inputs = _simple_inputs()
    responses = list(server.model("simple").infer(inputs=inputs))
    assert len(responses) == 1
    assert responses[0].final
    assert responses[0].error is None
    out = responses[0].outputs
    assert out["OUTPUT0"].data_type == tritonserver.DataType.INT32
    np.testing.assert_array_equal(np.from_dlpack(out["OUTPUT0"]), inputs["INPUT0"] + 1)
    np.testing.assert_array_equal(np.asarray(out["OUTPUT1"]), inputs["INPUT0"] - 1)
    stats = server.model("simple").statistics()["model_stats"][0]
    assert int(stats["inference_stats"]["success"]["count"]) >= 1


def test_infer_from_several_threads_at_once(server: tritonserver.Server) -> None:
    from concurrent.futures import ThreadPoolExecutor

    def calls(start: int) -> list[int]:
        got = []
        for i in range(start, start + 50):
            inputs = {"INPUT0": np.full((1, 16), i, np.int32), "INPUT1": np.ones((1, 16), np.int32)}
            (response,) = server.model("simple").infer(inputs=inputs)
            got.append(int(np.from_dlpack(response.outputs["OUTPUT1"])[0, 3]))
        return got

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(calls, range(0, 200, 50)))
    assert results == [[i - 1 for i in range(s, s + 50)] for s in range(0, 200, 50)]


def test_input_arrays_are_not_copied(server: tritonserver.Server) -> None:
    """The identity backend hands its input back: the output is the caller's own memory."""
    data = np.arange(8, dtype=np.float32)
    (response,) = server.model("identity_fp32").infer(inputs={"INPUT0": data})
    out = np.from_dlpack(response.outputs["OUTPUT0"])
    np.testing.assert_array_equal(out, data)
    assert np.shares_memory(out, data)


def test_a_bad_request_raises_with_the_servers_message(server: tritonserver.Server) -> None:
    wrong = {"INPUT0": np.ones((1, 16), np.float32), "INPUT1": np.ones((1, 16), np.int32)}
    with pytest.raises(tritonserver.InvalidArgumentError, match="expects 'INT32'"):
        list(server.model("simple").infer(inputs=wrong))
    (response,) = server.model("nope").infer(inputs=_simple_inputs(), raise_on_error=False)
    assert isinstance(response.error, tritonserver.TritonError)
    assert "unknown model: 'nope'" in str(response.error)


async def test_async_infer(server: tritonserver.Server) -> None:
    inputs = _simple_inputs()
    got = [r async for r in server.model("simple").async_infer(inputs=inputs)]
    assert [r.final for r in got] == [True]
    np.testing.assert_array_equal(np.from_dlpack(got[0].outputs["OUTPUT0"]), inputs["INPUT0"] + 1)
    # Several at once, on this loop, while the server's own loop runs them.
    many = await asyncio.gather(*(_one(server, i) for i in range(8)))
    assert many == [i + 1 for i in range(8)]


async def _one(server: tritonserver.Server, i: int) -> int:
    inputs = {"INPUT0": np.full((1, 16), i, np.int32), "INPUT1": np.ones((1, 16), np.int32)}
    async for response in server.model("simple").async_infer(inputs=inputs):
        return int(np.from_dlpack(response.outputs["OUTPUT0"])[0, 0])
    raise AssertionError("no response")


def test_decoupled_model_gives_each_response_then_a_final_one(
    server: tritonserver.Server,
) -> None:
    responses = list(server.model("py_repeat").infer(inputs={"IN": np.array([3], np.int32)}))
    assert [r.final for r in responses] == [False, False, False, True]
    values = [int(np.from_dlpack(r.outputs["OUT"])[0]) for r in responses[:3]]
    assert values == [0, 1, 2]
    assert responses[3].outputs == {}


async def test_decoupled_async(server: tritonserver.Server) -> None:
    model = server.model("py_repeat")
    got = [r async for r in model.async_infer(inputs={"IN": np.array([2], np.int32)})]
    assert [r.final for r in got] == [False, False, True]


def test_response_queue_gets_the_responses_unread(server: tritonserver.Server) -> None:
    import queue

    responses: queue.SimpleQueue[tritonserver.InferenceResponse] = queue.SimpleQueue()
    model = server.model("py_repeat")
    iterator = model.infer(inputs={"IN": np.array([2], np.int32)}, response_queue=responses)
    got = [responses.get(timeout=30) for _ in range(3)]  # the iterator not read yet
    assert [r.final for r in got] == [False, False, True]
    assert [r.final for r in iterator] == [False, False, True]
    assert responses.empty()


async def test_async_response_queue(server: tritonserver.Server) -> None:
    responses: asyncio.Queue[tritonserver.InferenceResponse] = asyncio.Queue()
    model = server.model("simple")
    iterator = model.async_infer(inputs=_simple_inputs(), response_queue=responses)
    first = await asyncio.wait_for(responses.get(), 30)
    assert first.final
    assert [r.final async for r in iterator] == [True]


def test_request_parameters_must_be_plain_values(server: tritonserver.Server) -> None:
    with pytest.raises(tritonserver.InvalidArgumentError, match="'bad'"):
        server.model("simple").infer(inputs=_simple_inputs(), parameters={"bad": {"x": 1}})


def test_load_and_unload(server: tritonserver.Server) -> None:
    assert not server.model("later").ready()
    model = server.load("later")
    assert model.ready()
    (response,) = model.infer(inputs=_simple_inputs())
    assert response.error is None
    server.unload("later")
    assert not server.model("later").ready()
    (response,) = server.model("later").infer(inputs=_simple_inputs(), raise_on_error=False)
    assert response.error is not None
    with pytest.raises(tritonserver.TritonError, match="absent"):
        server.load("absent")


def test_log_callback_gets_the_servers_lines(server: tritonserver.Server, logs: Logs) -> None:
    lines = [m for level, m in logs.lines if level == tritonserver.LogLevel.INFO]
    assert any("model 'simple' version 1 is READY" in line for line in lines), lines[:5]


def test_front_ends_on_the_server_serve_tritonclient(server: tritonserver.Server) -> None:
    http = tritonfrontend.KServeHttp(server, tritonfrontend.KServeHttp.Options(port=0))
    grpc = tritonfrontend.KServeGrpc(server, tritonfrontend.KServeGrpc.Options(port=0))
    metrics = tritonfrontend.Metrics(server, tritonfrontend.Metrics.Options(port=0))
    with http, grpc, metrics:
        with pytest.raises(tritonserver.AlreadyExistsError, match="already running"):
            http.start()
        for module, port in ((httpclient, http.port), (grpcclient, grpc.port)):
            client = module.InferenceServerClient(f"127.0.0.1:{port}")
            inputs = [module.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
            for tensor, data in zip(inputs, _simple_inputs().values(), strict=True):
                tensor.set_data_from_numpy(data)
            result = client.infer("simple", inputs)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.arange(1, 17)[None])
            client.close()
        import urllib.request

        text = urllib.request.urlopen(f"http://127.0.0.1:{metrics.port}/metrics").read().decode()
        assert 'nv_inference_count{model="simple",version="1"}' in text
        # The embedded server's models: one loaded here is served there at once.
        port = http.port
    assert port is not None
    with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port)):
        pass  # stopped: nothing listens any more


def test_restricted_apis_and_shared_memory_on_a_front_end(server: tritonserver.Server) -> None:
    options = tritonfrontend.KServeHttp.Options(
        port=0, restricted_protocols=["model-repository:admin-key=s3cret"]
    )
    with tritonfrontend.KServeHttp(server, options) as http:
        client = httpclient.InferenceServerClient(f"127.0.0.1:{http.port}")
        with pytest.raises(InferenceServerException, match="admin-key") as err:
            client.unload_model("simple")
        assert err.value.status() == "403"
        assert server.model("simple").ready()  # the refused call did nothing
        client.get_model_repository_index(headers={"admin-key": "s3cret"})
        # System shared memory, as the command line's front end serves it.
        import tritonclient.utils.shared_memory as shm

        region = shm.create_shared_memory_region("embed_in", "/embed_in", 128)
        try:
            shm.set_shared_memory_region(region, [np.full((1, 16), 5, np.int32),
                                                  np.ones((1, 16), np.int32)])  # fmt: skip
            client.register_system_shared_memory("embed_in", "/embed_in", 128)
            inputs = [httpclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
            inputs[0].set_shared_memory("embed_in", 64, 0)
            inputs[1].set_shared_memory("embed_in", 64, 64)
            result = client.infer("simple", inputs)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.full((1, 16), 6))
            client.unregister_system_shared_memory("embed_in")
        finally:
            shm.destroy_shared_memory_region(region)
        client.close()


def test_http_front_end_refuses_a_web_pages_rebinding_host(server: tritonserver.Server) -> None:
    """A page in the device's browser cannot reach the embedded server through a DNS name
    that points at loopback: the Host check of the command line's front end applies."""
    import http.client

    with tritonfrontend.KServeHttp(server, tritonfrontend.KServeHttp.Options(port=0)) as front:
        connection = http.client.HTTPConnection("127.0.0.1", front.port, timeout=10)
        connection.request("GET", "/v2/models/simple", headers={"Host": "evil.example"})
        answer = connection.getresponse()
        assert answer.status == 403
        assert b"evil.example" in answer.read()
        connection.close()


def test_front_ends_listen_on_loopback_unless_told() -> None:
    """Triton's bindings default to 0.0.0.0; a device's front ends to loopback."""
    assert tritonfrontend.KServeHttp.Options().address == "127.0.0.1"
    assert tritonfrontend.KServeGrpc.Options().address == "127.0.0.1"
    assert tritonfrontend.Metrics.Options().address == "127.0.0.1"


def test_frontend_options_are_checked(server: tritonserver.Server) -> None:
    with pytest.raises(tritonserver.InvalidArgumentError, match="port"):
        tritonfrontend.KServeHttp.Options(port=-15)
    with pytest.raises(tritonserver.InvalidArgumentError, match="Incorrect type for options"):
        tritonfrontend.KServeGrpc(server, {"port": 8001})
    bad = tritonfrontend.KServeHttp.Options(port=0, restricted_protocols=["nonsense:k=v"])
    with pytest.raises(tritonserver.InvalidArgumentError, match="nonsense"):
        tritonfrontend.KServeHttp(server, bad).start()


def test_stop_ends_the_server_and_its_front_ends(tmp_path: Path) -> None:
    save(simple_model(), tmp_path / "repo" / "simple" / "1" / "model.onnx")
    (tmp_path / "repo" / "simple" / "config.pbtxt").write_text(SIMPLE_CONFIG)
    server = tritonserver.Server(
        model_repository=str(tmp_path / "repo"),
        server_args=["--model-store-dir", str(tmp_path / "store")],
    ).start(wait_until_ready=True)
    http = tritonfrontend.KServeHttp(server, tritonfrontend.KServeHttp.Options(port=0))
    http.start()
    port = http.port
    assert port is not None
    client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
    assert client.is_model_ready("simple")
    # Client shared memory stays off without --allow-client-shm, as on the command line.
    with pytest.raises(InferenceServerException, match="allow-client-shm") as err:
        client.register_system_shared_memory("r", "/embed_never", 64)
    assert err.value.status() == "403"
    client.close()
    server.stop()
    with pytest.raises(tritonserver.InvalidArgumentError, match="Server not started"):
        server.ready()
    with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port)):
        pass
    http.stop()  # after the server: nothing left to stop, no error
    with pytest.raises(tritonserver.InvalidArgumentError, match="Server not started"):
        server.model("simple")


def test_tracing_set_over_a_front_end_traces_in_process_requests_too(tmp_path: Path) -> None:
    from tests.integration.test_trace import _lines

    save(simple_model(), tmp_path / "repo" / "simple" / "1" / "model.onnx")
    (tmp_path / "repo" / "simple" / "config.pbtxt").write_text(SIMPLE_CONFIG)
    trace_file = tmp_path / "trace.jsonl"
    options = tritonserver.Options(
        model_repository=str(tmp_path / "repo"),
        server_args=["--model-store-dir", str(tmp_path / "store"), f"--trace-file={trace_file}"],
    )
    with tritonserver.Server(options) as server:
        with tritonfrontend.KServeHttp(server, tritonfrontend.KServeHttp.Options(port=0)) as front:
            client = httpclient.InferenceServerClient(f"127.0.0.1:{front.port}")
            client.update_trace_settings(
                "simple", {"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_count": "2"}
            )
            model = server.model("simple")
            (response,) = model.infer(inputs=_simple_inputs(), request_id="in-process")
            assert response.request_id == "in-process"
            inputs = [httpclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
            for tensor, data in zip(inputs, _simple_inputs().values(), strict=True):
                tensor.set_data_from_numpy(data)
            client.infer("simple", inputs, request_id="over-http")
            client.close()
        lines = _lines(trace_file, 2)
    assert [line["request_id"] for line in lines] == ["in-process", "over-http"]
    assert all(line["model_name"] == "simple" for line in lines)


def test_a_failed_start_raises_and_leaves_nothing_running(tmp_path: Path) -> None:
    (tmp_path / "repo" / "broken").mkdir(parents=True)
    (tmp_path / "repo" / "broken" / "config.pbtxt").write_text("this is not a config")
    server = tritonserver.Server(
        model_repository=str(tmp_path / "repo"),
        server_args=["--model-store-dir", str(tmp_path / "store")],
    )
    with pytest.raises(tritonserver.TritonError, match="broken"):
        server.start()
    with pytest.raises(tritonserver.InvalidArgumentError, match="Server not started"):
        server.ready()
    with pytest.raises(tritonserver.UnsupportedError, match="backend_directory"):
        tritonserver.Server(model_repository="x", backend_directory="/elsewhere").start()
