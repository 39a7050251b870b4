"""The rest of `triton_python_backend_utils` on the real server, with tritonclient: coroutine
models, concurrent `async_exec`, BLS to decoupled models, `model_name` as bytes, custom metrics
on /metrics, the model loading API, the response sender of a model that is not decoupled, the
logger, `using_decoupled_model_transaction_policy`, what execute() is told of each request
(id, correlation id, flags, parameters, timeout, requested outputs; a batch as its requests),
and concurrent decoupled requests answered interleaved.

Each model here is written as for Triton; one server (explicit model control) serves them all.
"""

from __future__ import annotations

import json
import queue
import re
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.serverproc import ServerProcess

ADD_ONE = """\
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            time.sleep(0.02)  # long enough for concurrent callers to overlap
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x + 1)]))
        return out
"""
ADD_ONE_CONFIG = """\
backend: "python"
input [{ name: "X", data_type: TYPE_INT32, dims: [-1] }]
output [{ name: "Y", data_type: TYPE_INT32, dims: [-1] }]
instance_group [{ count: 2, kind: KIND_CPU }]
"""

# Eight async_exec calls in flight at once from one coroutine: each reply must reach its caller.
ASYNC_BLS = """\
import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            calls = [
                pb_utils.InferenceRequest(
                    model_name="py_add_one", requested_output_names=["Y"],
                    inputs=[pb_utils.Tensor("X", x + 100 * i)],
                ).async_exec()
                for i in range(8)
            ]
            responses = await asyncio.gather(*calls)
            for response in responses:
                if response.has_error():
                    raise pb_utils.TritonModelException(response.error().message())
            rows = [pb_utils.get_output_tensor_by_name(r, "Y").as_numpy() for r in responses]
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", np.stack(rows))]))
        return out
"""
ASYNC_BLS_CONFIG = """\
backend: "python"
input [{ name: "X", data_type: TYPE_INT32, dims: [-1] }]
output [{ name: "Y", data_type: TYPE_INT32, dims: [-1, -1] }]
"""

# A decoupled model: IN = n sends n responses OUT = [n] from a thread, then the final flag.
COUNTDOWN = """\
import json
import threading

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(config):
            raise pb_utils.TritonModelException("this model must be decoupled")

    def execute(self, requests):
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            sender = request.get_response_sender()
            threading.Thread(target=self.respond, args=(sender, n), daemon=True).start()
        return None

    def respond(self, sender, n):
        for _ in range(n):
            out = pb_utils.Tensor("OUT", np.array([n], np.int32))
            sender.send(pb_utils.InferenceResponse(output_tensors=[out]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""
DECOUPLED_CONFIG = """\
backend: "python"
model_transaction_policy { decoupled: true }
input [{ name: "IN", data_type: TYPE_INT32, dims: [1] }]
output [{ name: "OUT", data_type: TYPE_INT32, dims: [1] }]
"""

# A coroutine execute in a decoupled model: responses sent from the coroutine.
ASYNC_COUNTDOWN = """\
import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            sender = request.get_response_sender()
            for i in range(n):
                await asyncio.sleep(0.005)
                out = pb_utils.Tensor("OUT", np.array([i], np.int32))
                sender.send(pb_utils.InferenceResponse(output_tensors=[out]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

# BLS to the decoupled model: exec(decoupled=True) iterates its responses; the last is empty.
BLS_STREAM = """\
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        n = pb_utils.get_input_tensor_by_name(requests[0], "IN")
        request = pb_utils.InferenceRequest(
            model_name="py_countdown", inputs=[n], requested_output_names=["OUT"])
        total, count, last_empty = 0, 0, False
        for response in request.exec(decoupled=True):
            if response.has_error():
                raise pb_utils.TritonModelException(response.error().message())
            last_empty = len(response.output_tensors()) == 0
            if not last_empty:
                total += int(pb_utils.get_output_tensor_by_name(response, "OUT").as_numpy()[0])
                count += 1
        result = np.array([total, count, int(last_empty)], np.int32)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", result)])]
"""
# The same, from a coroutine: two async_exec(decoupled=True) at once, one iterated with
# `async for`, one with `for`.
BLS_STREAM_ASYNC = """\
import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        n = pb_utils.get_input_tensor_by_name(requests[0], "IN")
        calls = [
            pb_utils.InferenceRequest(
                model_name="py_countdown", inputs=[n], requested_output_names=["OUT"]
            ).async_exec(decoupled=True)
            for _ in range(2)
        ]
        first, second = await asyncio.gather(*calls)
        total, count = 0, 0
        async for response in first:
            if response.output_tensors():
                total += int(response.output_tensors()[0].as_numpy()[0])
                count += 1
        for response in second:
            if response.output_tensors():
                total += int(response.output_tensors()[0].as_numpy()[0])
                count += 1
        result = np.array([total, count, 0], np.int32)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", result)])]
"""
BLS_STREAM_CONFIG = """\
backend: "python"
input [{ name: "IN", data_type: TYPE_INT32, dims: [1] }]
output [{ name: "OUT", data_type: TYPE_INT32, dims: [3] }]
"""

# The called model's name from a BYTES input, as bytes (python_backend's bls example does this).
BLS_BY_NAME = """\
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            name = pb_utils.get_input_tensor_by_name(request, "MODEL_NAME").as_numpy()[0]
            call = pb_utils.InferenceRequest(
                model_name=name, requested_output_names=["Y"],
                inputs=[pb_utils.get_input_tensor_by_name(request, "X")],
                parameters={"origin": "bls", "attempt": 1, "strict": True})
            response = call.exec()
            if response.has_error():
                out.append(pb_utils.InferenceResponse(error=response.error()))
                continue
            out.append(pb_utils.InferenceResponse(response.output_tensors()))
        return out
"""
BLS_BY_NAME_CONFIG = """\
backend: "python"
input [{ name: "MODEL_NAME", data_type: TYPE_STRING, dims: [1] },
       { name: "X", data_type: TYPE_INT32, dims: [-1] }]
output [{ name: "Y", data_type: TYPE_INT32, dims: [-1] }]
"""

# Custom metrics from two instances: a counter and a histogram shared by both (same family and
# labels), a gauge; misuse is a TritonModelException whose text the model hands back.
METRICS = """\
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        labels = {"model": args["model_name"], "version": args["model_version"]}
        self.requests = pb_utils.MetricFamily(
            name="edge_test_requests", description="Requests seen by the model",
            kind=pb_utils.MetricFamily.COUNTER).Metric(labels=labels)
        self.last = pb_utils.MetricFamily(
            name="edge_test_last_value", description="The last X",
            kind=pb_utils.MetricFamily.GAUGE).Metric(labels=labels)
        self.values = pb_utils.MetricFamily(
            name="edge_test_values", description="X values",
            kind=pb_utils.MetricFamily.HISTOGRAM).Metric(labels=labels, buckets=[1, 10, 100])

    def execute(self, requests):
        out = []
        for request in requests:
            x = float(pb_utils.get_input_tensor_by_name(request, "X").as_numpy()[0])
            self.requests.increment(1)
            self.last.set(x)
            self.values.observe(x)
            errors = []
            for misuse in (lambda: self.requests.set(5), lambda: self.requests.increment(-1),
                           lambda: self.values.value()):
                try:
                    misuse()
                    errors.append("no error")
                except pb_utils.TritonModelException as exc:
                    errors.append(exc.message())
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("COUNT", np.array([self.requests.value()], np.float64)),
                pb_utils.Tensor("ERRORS", np.array(errors, dtype=np.object_)),
            ]))
        return out
"""
METRICS_CONFIG = """\
backend: "python"
input [{ name: "X", data_type: TYPE_FP64, dims: [1] }]
output [{ name: "COUNT", data_type: TYPE_FP64, dims: [1] },
        { name: "ERRORS", data_type: TYPE_STRING, dims: [3] }]
instance_group [{ count: 2, kind: KIND_CPU }]
"""

# The model loading API from a model: ACTION is ready | load | unload, NAME the model.
LOADER = """\
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            action = pb_utils.get_input_tensor_by_name(request, "ACTION").as_numpy()[0].decode()
            name = pb_utils.get_input_tensor_by_name(request, "NAME").as_numpy()[0].decode()
            detail = ""
            try:
                if action == "load":
                    pb_utils.load_model(model_name=name)
                elif action == "unload":
                    pb_utils.unload_model(model_name=name, unload_dependents=False)
            except pb_utils.TritonModelException as exc:
                detail = exc.message()
            ready = pb_utils.is_model_ready(model_name=name)
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("READY", np.array([ready])),
                pb_utils.Tensor("DETAIL", np.array([detail.encode()], dtype=np.object_)),
            ]))
        return out
"""
LOADER_CONFIG = """\
backend: "python"
input [{ name: "ACTION", data_type: TYPE_STRING, dims: [1] },
       { name: "NAME", data_type: TYPE_STRING, dims: [1] }]
output [{ name: "READY", data_type: TYPE_BOOL, dims: [1] },
        { name: "DETAIL", data_type: TYPE_STRING, dims: [1] }]
"""

# Not decoupled, yet answering through the response sender (Triton 24.06 and later); logs.
SENDER = """\
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        logger = pb_utils.Logger
        logger.log_info("sender model: info line")
        logger.log("sender model: warning line", logger.WARNING)
        logger.log_verbose("sender model: verbose line")
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            sender = request.get_response_sender()
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x * 2)]),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

INIT_FAILS = """\
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        raise pb_utils.TritonModelException("refusing to start: no licence")

    def execute(self, requests):
        return []
"""

# What execute() is told about each request, as JSON in INFO; how many requests came together.
REQUEST_INFO = """\
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            if json.loads(request.parameters()).get("refuse"):
                error = pb_utils.TritonError("refused: " + request.request_id(),
                                             pb_utils.TritonError.INVALID_ARG)
                out.append(pb_utils.InferenceResponse(error=error))
                continue
            info = {
                "id": request.request_id(),
                "correlation_id": request.correlation_id(),
                "flags": request.flags(),
                "parameters": json.loads(request.parameters()),
                "timeout": request.timeout(),
                "outputs": request.requested_output_names(),
                "requests": len(requests),
                "rows": int(x.shape[0]),
            }
            text = np.array([[json.dumps(info).encode()]] * x.shape[0], dtype=np.object_)
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("INFO", text), pb_utils.Tensor("OTHER", x)]))
        return out
"""
REQUEST_INFO_CONFIG = """\
backend: "python"
max_batch_size: 8
input [{ name: "X", data_type: TYPE_INT32, dims: [1] }]
output [{ name: "INFO", data_type: TYPE_STRING, dims: [1] },
        { name: "OTHER", data_type: TYPE_INT32, dims: [1] }]
"""
# The same, batching: a request of 1 row and one of 3 make the preferred batch of 4.
BATCH_INFO_CONFIG = (
    REQUEST_INFO_CONFIG
    + """\
dynamic_batching { preferred_batch_size: [ 4 ], max_queue_delay_microseconds: 500000 }
"""
)

# Decoupled, answering from a thread with a pause between responses (as Triton's repeat
# example): execute() returns at once, so the instance takes the next request meanwhile.
SLOW_REPEAT = """\
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            sender = request.get_response_sender()
            threading.Thread(target=self.respond, args=(sender, n), daemon=True).start()
        return None

    def respond(self, sender, n):
        for i in range(n):
            time.sleep(0.15)
            out = pb_utils.Tensor("OUT", np.array([i], np.int32))
            sender.send(pb_utils.InferenceResponse([out]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""

# Decoupled: one response, then waits (after execute() returned) for its client to go away.
UNTIL_CANCELLED = """\
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            threading.Thread(target=self.respond, args=(request,), daemon=True).start()
        return None

    def respond(self, request):
        sender = request.get_response_sender()
        sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([1], np.int32))]))
        deadline = time.monotonic() + 20
        while not request.is_cancelled() and time.monotonic() < deadline:
            time.sleep(0.01)
        if request.is_cancelled():
            pb_utils.Logger.log_info(f"stream request {request.request_id()} cancelled")
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""

# The same, but execute() returns a second after the first response went out: a client that
# goes away in between went while the execution still ran.
LATE_RETURN = UNTIL_CANCELLED.replace(
    "        return None\n", "        time.sleep(1)\n        return None\n", 1
)

MODELS: dict[str, tuple[str, str]] = {
    "py_until_cancelled": (UNTIL_CANCELLED, DECOUPLED_CONFIG),
    "py_late_return": (LATE_RETURN, DECOUPLED_CONFIG),
    "py_request_info": (REQUEST_INFO, REQUEST_INFO_CONFIG),
    "py_batch_info": (REQUEST_INFO, BATCH_INFO_CONFIG),
    "py_slow_repeat": (SLOW_REPEAT, DECOUPLED_CONFIG),
    "py_add_one": (ADD_ONE, ADD_ONE_CONFIG),
    "py_target": (ADD_ONE, ADD_ONE_CONFIG),
    "py_async_bls": (ASYNC_BLS, ASYNC_BLS_CONFIG),
    "py_countdown": (COUNTDOWN, DECOUPLED_CONFIG),
    "py_async_countdown": (ASYNC_COUNTDOWN, DECOUPLED_CONFIG),
    "py_bls_stream": (BLS_STREAM, BLS_STREAM_CONFIG),
    "py_bls_stream_async": (BLS_STREAM_ASYNC, BLS_STREAM_CONFIG),
    "py_bls_by_name": (BLS_BY_NAME, BLS_BY_NAME_CONFIG),
    "py_metrics": (METRICS, METRICS_CONFIG),
    "py_loader": (LOADER, LOADER_CONFIG),
    "py_sender": (SENDER, ADD_ONE_CONFIG),
    "py_init_fails": (INIT_FAILS, ADD_ONE_CONFIG),
    "py_init_fails_too": (INIT_FAILS, ADD_ONE_CONFIG),
}
NOT_LOADED_AT_START = ("py_target", "py_init_fails", "py_init_fails_too")


@pytest.fixture(scope="module")
def api_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("python_api")
    repository = root / "models"
    for name, (source, config) in MODELS.items():
        (repository / name / "1").mkdir(parents=True)
        (repository / name / "1" / "model.py").write_text(source)
        (repository / name / "config.pbtxt").write_text(f'name: "{name}"\n{config}')
    flags = ["--model-control-mode=explicit"]
    flags += [f"--load-model={n}" for n in MODELS if n not in NOT_LOADED_AT_START]
    proc = ServerProcess(repository, *flags, log_path=root / "server.log")
    with proc:
        yield proc


def _int32(module: Any, name: str, values: list[int]) -> Any:
    tensor = module.InferInput(name, [len(values)], "INT32")
    tensor.set_data_from_numpy(np.array(values, dtype=np.int32))
    return tensor


def _text(module: Any, name: str, value: str) -> Any:
    tensor = module.InferInput(name, [1], "BYTES")
    tensor.set_data_from_numpy(np.array([value.encode()], dtype=np.object_))
    return tensor


def _stream(server: ServerProcess, model: str, inputs: list[Any]) -> list[Any]:
    """Every response of one decoupled request over a gRPC stream, until the final flag."""
    results: queue.Queue[Any] = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: results.put(error or result))
    try:
        client.async_stream_infer(model, inputs, enable_empty_final_response=True)
        received = []
        while True:
            item = results.get(timeout=30)
            if isinstance(item, InferenceServerException):
                raise item
            response = item.get_response()
            if response.parameters["triton_final_response"].bool_param:
                return received
            received.append(item)
    finally:
        client.stop_stream()


@pytest.mark.parametrize("module", [httpclient, grpcclient])
def test_coroutine_execute_with_concurrent_async_exec(
    api_server: ServerProcess, module: Any
) -> None:
    result = api_server.client(module).infer("py_async_bls", [_int32(module, "X", [1, 2, 3])])
    expected = np.array([[1 + 100 * i + 1, 2 + 100 * i + 1, 3 + 100 * i + 1] for i in range(8)])
    np.testing.assert_array_equal(result.as_numpy("Y"), expected)


def test_decoupled_model_checks_its_transaction_policy_and_streams(
    api_server: ServerProcess,
) -> None:
    responses = _stream(api_server, "py_countdown", [_int32(grpcclient, "IN", [3])])
    assert [r.as_numpy("OUT").tolist() for r in responses] == [[3], [3], [3]]


def test_decoupled_coroutine_execute_streams(api_server: ServerProcess) -> None:
    responses = _stream(api_server, "py_async_countdown", [_int32(grpcclient, "IN", [4])])
    assert [r.as_numpy("OUT").tolist() for r in responses] == [[0], [1], [2], [3]]


@pytest.mark.parametrize("module", [httpclient, grpcclient])
@pytest.mark.parametrize("n", [0, 1, 4])
def test_bls_to_a_decoupled_model_iterates_its_responses(
    api_server: ServerProcess, module: Any, n: int
) -> None:
    client = api_server.client(module)
    result = client.infer("py_bls_stream", [_int32(module, "IN", [n])])
    # n responses of value n, then the empty final one
    assert result.as_numpy("OUT").tolist() == [n * n, n, 1]
    result = client.infer("py_bls_stream_async", [_int32(module, "IN", [n])])
    assert result.as_numpy("OUT").tolist() == [2 * n * n, 2 * n, 0]


@pytest.mark.parametrize("module", [httpclient, grpcclient])
def test_bls_model_name_given_as_bytes(api_server: ServerProcess, module: Any) -> None:
    client = api_server.client(module)
    inputs = [_text(module, "MODEL_NAME", "py_add_one"), _int32(module, "X", [5, 6])]
    result = client.infer("py_bls_by_name", inputs)
    np.testing.assert_array_equal(result.as_numpy("Y"), [6, 7])
    inputs = [_text(module, "MODEL_NAME", "no_such_model"), _int32(module, "X", [5])]
    with pytest.raises(InferenceServerException, match="'no_such_model' is not found"):
        client.infer("py_bls_by_name", inputs)


def _scrape(server: ServerProcess) -> str:
    url = f"http://127.0.0.1:{server.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


def test_custom_metrics_on_the_metrics_endpoint(api_server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(api_server.http_url, concurrency=4)
    values = [0.5, 5.0, 50.0, 500.0, 7.0, 3.0]
    pending = []
    for value in values:  # concurrent: both instances take some
        tensor = httpclient.InferInput("X", [1], "FP64")
        tensor.set_data_from_numpy(np.array([value]))
        pending.append(client.async_infer("py_metrics", [tensor]))
    results = [p.get_result() for p in pending]
    # Misuse raises in the model with Triton's texts.
    errors = [e.decode() for e in results[0].as_numpy("ERRORS")]
    assert "TRITONSERVER_METRIC_KIND_COUNTER does not support Set" in errors[0]
    assert "incremented monotonically by non-negative values" in errors[1]
    assert "TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Value" in errors[2]
    # Both instances share one counter: value() is the shared total.
    assert max(float(r.as_numpy("COUNT")[0]) for r in results) == len(values)

    text = _scrape(api_server)
    labels = '{model="py_metrics",version="1"}'
    # Named as Triton names them: no _total on a model's counter, each family listed once.
    assert "# HELP edge_test_requests Requests seen by the model\n" in text
    assert "# TYPE edge_test_requests counter\n" in text
    assert f"edge_test_requests{labels} {len(values)}\n" in text
    assert text.count("# TYPE edge_test_requests counter") == 1
    assert "# TYPE edge_test_last_value gauge\n" in text
    assert re.search(r"edge_test_last_value\{[^}]*\} [0-9.]+\n", text)
    assert "# TYPE edge_test_values histogram\n" in text
    buckets = dict(re.findall(r'edge_test_values_bucket\{le="([^"]+)"[^}]*\} ([0-9.]+)', text))
    assert buckets == {"1": "1.0", "10": "4.0", "100": "5.0", "+Inf": "6.0"}
    assert f"edge_test_values_count{labels} 6.0\n" in text
    assert f"edge_test_values_sum{labels} {sum(values)}\n" in text
    # The server's own families are still there.
    assert "nv_inference_request_success" in text


def test_model_loading_api_from_a_model(api_server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(api_server.http_url)

    def act(action: str, name: str = "py_target") -> tuple[bool, str]:
        inputs = [_text(httpclient, "ACTION", action), _text(httpclient, "NAME", name)]
        result = client.infer("py_loader", inputs)
        return bool(result.as_numpy("READY")[0]), result.as_numpy("DETAIL")[0].decode()

    assert act("ready") == (False, "")
    assert act("load") == (True, "")
    assert client.is_model_ready("py_target")
    assert act("unload")[0] is False
    assert not client.is_model_ready("py_target")
    ready, detail = act("load", "py_init_fails_too")
    assert not ready
    assert "refusing to start: no licence" in detail


def test_initialize_error_fails_the_load_with_its_message(api_server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(api_server.http_url)
    with pytest.raises(InferenceServerException, match="refusing to start: no licence"):
        client.load_model("py_init_fails")


@pytest.mark.parametrize("module", [httpclient, grpcclient])
def test_response_sender_in_a_model_that_is_not_decoupled(
    api_server: ServerProcess, module: Any
) -> None:
    result = api_server.client(module).infer("py_sender", [_int32(module, "X", [4, 5])])
    np.testing.assert_array_equal(result.as_numpy("Y"), [8, 10])
    # The model's lines come over its pipe, beside the response: wait for them.
    deadline = time.monotonic() + 10
    log_file = Path(api_server.log_path)
    while "sender model: warning line" not in log_file.read_text(errors="replace"):
        assert time.monotonic() < deadline, "the model's log lines never reached the log"
        time.sleep(0.02)
    log = log_file.read_text(errors="replace")
    assert "sender model: info line" in log
    assert "WARNING python_model: python model 'py_sender': sender model: warning line" in log
    assert "sender model: verbose line" not in log  # verbose lines need a verbose server


def _info(result: Any) -> list[dict[str, Any]]:
    return [json.loads(row[0]) for row in result.as_numpy("INFO")]


@pytest.mark.parametrize("module", [httpclient, grpcclient])
def test_execute_sees_the_requests_id_sequence_flags_parameters_and_timeout(
    api_server: ServerProcess, module: Any
) -> None:
    tensor = module.InferInput("X", [2, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[1], [2]], dtype=np.int32))
    result = api_server.client(module).infer(
        "py_request_info",
        [tensor],
        outputs=[module.InferRequestedOutput("INFO")],
        request_id="req-7",
        sequence_id=42,
        sequence_start=True,
        timeout=5_000_000,
        parameters={"colour": "blue", "count": 3, "strict": True},
    )
    info = _info(result)[0]
    assert info == {
        "id": "req-7",
        "correlation_id": 42,
        "flags": 1,  # TRITONSERVER_REQUEST_FLAG_SEQUENCE_START
        "parameters": {"colour": "blue", "count": 3, "strict": True},
        "timeout": 5_000_000,
        "outputs": ["INFO"],
        "requests": 1,
        "rows": 2,
    }
    end = api_server.client(module).infer(
        "py_request_info", [tensor], sequence_id="text-id", sequence_end=True
    )
    info = _info(end)[0]
    assert (info["id"], info["correlation_id"], info["flags"], info["parameters"]) == (
        "",
        "text-id",
        2,  # TRITONSERVER_REQUEST_FLAG_SEQUENCE_END
        {},
    )
    assert sorted(info["outputs"]) == ["INFO", "OTHER"]  # none named: all


@pytest.mark.parametrize("module", [httpclient, grpcclient])
def test_a_batch_reaches_execute_as_its_requests(api_server: ServerProcess, module: Any) -> None:
    """Two requests the dynamic batcher joins come as two requests, each with its own id and
    rows, and each gets its own response back."""

    def call(rid: str, rows: int) -> list[dict[str, Any]]:
        tensor = module.InferInput("X", [rows, 1], "INT32")
        tensor.set_data_from_numpy(np.full((rows, 1), rows, dtype=np.int32))
        result = api_server.client(module).infer("py_batch_info", [tensor], request_id=rid)
        np.testing.assert_array_equal(result.as_numpy("OTHER"), np.full((rows, 1), rows))
        return _info(result)

    with ThreadPoolExecutor(2) as pool:
        one, three = pool.map(call, ["one", "three"], [1, 3])
    assert [(i["id"], i["rows"], i["requests"]) for i in one] == [("one", 1, 2)]
    assert [(i["id"], i["rows"], i["requests"]) for i in three] == [("three", 3, 2)] * 3


def test_concurrent_decoupled_requests_interleave(api_server: ServerProcess) -> None:
    """Two streams to one decoupled instance whose execute() returns at once: the second
    request's responses come while the first one's are still coming, as in Triton."""
    arrivals: queue.Queue[tuple[str, Any]] = queue.Queue()
    clients = []
    for name in ("a", "b"):
        client = grpcclient.InferenceServerClient(api_server.grpc_url)
        client.start_stream(
            callback=lambda result, error, name=name: arrivals.put((name, error or result))
        )
        clients.append(client)
    try:
        for client in clients:
            client.async_stream_infer(
                "py_slow_repeat", [_int32(grpcclient, "IN", [4])], enable_empty_final_response=True
            )
        order: list[str] = []
        finals = 0
        while finals < 2:
            name, item = arrivals.get(timeout=30)
            assert not isinstance(item, InferenceServerException), item
            if item.get_response().parameters["triton_final_response"].bool_param:
                finals += 1
            else:
                order.append(name)
    finally:
        for client in clients:
            client.stop_stream()
    assert sorted(order) == ["a"] * 4 + ["b"] * 4
    # One after the other would be aaaabbbb (or bbbbaaaa); interleaved, each stream's first
    # response comes before the other's last.
    assert order.index("a") < len(order) - 1 - order[::-1].index("b")
    assert order.index("b") < len(order) - 1 - order[::-1].index("a")


@pytest.mark.parametrize(
    ("model", "request_id"), [("py_until_cancelled", "gone-1"), ("py_late_return", "gone-2")]
)
def test_a_decoupled_request_whose_client_goes_away_is_cancelled(
    api_server: ServerProcess, model: str, request_id: str
) -> None:
    """The model's request.is_cancelled() turns true once the stream is cancelled: after
    execute() returned, and also when the client went while execute() still ran (its first
    response already out: py_late_return), when it is told once execute() returns."""
    results: queue.Queue[Any] = queue.Queue()
    client = grpcclient.InferenceServerClient(api_server.grpc_url)
    client.start_stream(callback=lambda result, error: results.put(error or result))
    client.async_stream_infer(model, [_int32(grpcclient, "IN", [1])], request_id=request_id)
    first = results.get(timeout=30)
    assert not isinstance(first, InferenceServerException), first
    client.stop_stream(cancel_requests=True)
    deadline = time.monotonic() + 10
    while f"stream request {request_id} cancelled" not in api_server.log():
        assert time.monotonic() < deadline, "the model never saw its request cancelled"
        time.sleep(0.05)


@pytest.mark.parametrize("module", [httpclient, grpcclient])
def test_one_requests_error_in_a_batch_fails_that_request_alone(
    api_server: ServerProcess, module: Any
) -> None:
    def call(rid: str, rows: int) -> Any:
        tensor = module.InferInput("X", [rows, 1], "INT32")
        tensor.set_data_from_numpy(np.full((rows, 1), rows, dtype=np.int32))
        try:
            return api_server.client(module).infer(
                "py_batch_info", [tensor], request_id=rid, parameters={"refuse": rid == "bad"}
            )
        except InferenceServerException as exc:
            return exc

    with ThreadPoolExecutor(2) as pool:
        bad, good = pool.map(call, ["bad", "good"], [1, 3])
    assert isinstance(bad, InferenceServerException)
    assert "refused: bad" in bad.message()
    assert bad.status() == ("400" if module is httpclient else "StatusCode.INVALID_ARGUMENT")
    assert not isinstance(good, InferenceServerException), good
    assert [(i["id"], i["requests"]) for i in _info(good)] == [("good", 2)] * 3
