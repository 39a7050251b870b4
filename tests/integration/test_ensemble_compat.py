"""Ensembles as tritonserver runs them: steps that batch differently, the request's parameters
on every step (a sequence model inside an ensemble), pruned steps, the error prefix, labels
(the ensemble's own, else the composing model's); classification of integer outputs; a
decoupled step, after which the later steps run once per response and the ensemble streams."""

from __future__ import annotations

import json
import queue
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto
from tritonclient.utils import InferenceServerException

from configs.generate import identity_model, save
from tests.integration.models import RUNNING_SUM_CONFIG, running_sum_model
from tests.serverproc import ServerProcess

IDENTITY = """\
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: {mbs}
input [ {{ name: "INPUT0", data_type: {dtype}, dims: [ {n} ] }} ]
output [ {{ name: "OUTPUT0", data_type: {dtype}, dims: [ {n} ]{labels} }} ]
"""

TWO_STEPS = """\
name: "{name}"
platform: "ensemble"
max_batch_size: {mbs}
input [ {{ name: "IN", data_type: TYPE_FP32, dims: [ 4 ] }} ]
output [ {{ name: "OUT", data_type: TYPE_FP32, dims: [ 4 ] }} ]
ensemble_scheduling {{ step [
  {{ model_name: "{first}", model_version: -1,
    input_map {{ key: "INPUT0" value: "IN" }} output_map {{ key: "OUTPUT0" value: "MID" }} }},
  {{ model_name: "{second}", model_version: -1,
    input_map {{ key: "INPUT0" value: "MID" }} output_map {{ key: "OUTPUT0" value: "OUT" }} }}
] }}
"""

BRANCHES = """\
name: "ens_branches"
platform: "ensemble"
max_batch_size: 8
input [ { name: "IN", data_type: TYPE_FP32, dims: [ 4 ] } ]
output [
  { name: "OUT_A", data_type: TYPE_FP32, dims: [ 4 ] },
  { name: "OUT_B", data_type: TYPE_FP32, dims: [ 4 ] }
]
ensemble_scheduling { step [
  { model_name: "id_batch", model_version: -1,
    input_map { key: "INPUT0" value: "IN" } output_map { key: "OUTPUT0" value: "OUT_A" } },
  { model_name: "id_branch", model_version: -1,
    input_map { key: "INPUT0" value: "IN" } output_map { key: "OUTPUT0" value: "OUT_B" } }
] }
"""

LABELLED = """\
name: "ens_labels"
platform: "ensemble"
max_batch_size: 8
input [ { name: "IN", data_type: TYPE_FP32, dims: [ 5 ] } ]
output [ { name: "OUT", data_type: TYPE_FP32, dims: [ 5 ] } ]
ensemble_scheduling { step [
  { model_name: "scores", model_version: -1,
    input_map { key: "INPUT0" value: "IN" } output_map { key: "OUTPUT0" value: "OUT" } }
] }
"""

OWN_LABELS = LABELLED.replace('"ens_labels"', '"ens_own_labels"').replace(
    "dims: [ 5 ] } ]\nensemble", 'dims: [ 5 ], label_filename: "own.txt" } ]\nensemble'
)

# A decoupled Python model: INPUT0 [4] -> int(INPUT0[0]) responses, the i-th INPUT0 * (i + 1).
FANOUT = """\
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            sender = request.get_response_sender()
            for i in range(int(x[0])):
                out = pb_utils.Tensor("OUTPUT0", (x * (i + 1)).astype(np.float32))
                sender.send(pb_utils.InferenceResponse([out]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""
FANOUT_CONFIG = """\
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ 4 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 4 ] } ]
"""
ADD2 = """\
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            a = pb_utils.get_input_tensor_by_name(r, "A").as_numpy()
            b = pb_utils.get_input_tensor_by_name(r, "B").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("SUM", a + b)]))
        return out
"""
ADD2_CONFIG = """\
backend: "python"
max_batch_size: 0
input [
  { name: "A", data_type: TYPE_FP32, dims: [ 4 ] },
  { name: "B", data_type: TYPE_FP32, dims: [ 4 ] }
]
output [ { name: "SUM", data_type: TYPE_FP32, dims: [ 4 ] } ]
"""
# The decoupled step's responses each run the identity step (in the batching ensemble, a
# batch dimension of 1 is added on the way out), and each answers the client.
DECOUPLED_STEP = """\
name: "{name}"
platform: "ensemble"
max_batch_size: {mbs}
input [ {{ name: "IN", data_type: TYPE_FP32, dims: [ 4 ] }} ]
output [ {{ name: "OUT", data_type: TYPE_FP32, dims: [ 4 ] }} ]
ensemble_scheduling {{ step [
  {{ model_name: "py_fanout", model_version: -1,
    input_map {{ key: "INPUT0" value: "IN" }} output_map {{ key: "OUTPUT0" value: "MID" }} }},
  {{ model_name: "id_nobatch", model_version: -1,
    input_map {{ key: "INPUT0" value: "MID" }} output_map {{ key: "OUTPUT0" value: "OUT" }} }}
] }}
"""
# A step that reads an ensemble input and a decoupled step's output: Triton refuses the load.
MIXED_ORIGINS = """\
name: "ens_mixed_origins"
platform: "ensemble"
input [ { name: "IN", data_type: TYPE_FP32, dims: [ 4 ] } ]
output [ { name: "OUT", data_type: TYPE_FP32, dims: [ 4 ] } ]
ensemble_scheduling { step [
  { model_name: "py_fanout", model_version: -1,
    input_map { key: "INPUT0" value: "IN" } output_map { key: "OUTPUT0" value: "MID" } },
  { model_name: "py_add2", model_version: -1,
    input_map [ { key: "A" value: "IN" }, { key: "B" value: "MID" } ]
    output_map { key: "SUM" value: "OUT" } }
] }
"""

SEQUENCE = """\
name: "ens_sequence"
platform: "ensemble"
max_batch_size: 4
input [ { name: "IN", data_type: TYPE_INT32, dims: [ 1 ] } ]
output [ { name: "OUT", data_type: TYPE_INT32, dims: [ 1 ] } ]
ensemble_scheduling { step [
  { model_name: "running_sum", model_version: -1,
    input_map { key: "INPUT" value: "IN" } output_map { key: "OUTPUT" value: "OUT" } }
] }
"""


def _identity(root: Path, name: str, mbs: int, n: int, dtype: str, labels: str = "") -> None:
    onnx_type = TensorProto.FLOAT if dtype == "TYPE_FP32" else TensorProto.INT32
    shape: list[int | str] = ["batch", n] if mbs else [n]
    save(identity_model(onnx_type, shape), root / name / "1" / "model.onnx")
    label = ', label_filename: "labels.txt"' if labels else ""
    (root / name / "config.pbtxt").write_text(
        IDENTITY.format(name=name, mbs=mbs, n=n, dtype=dtype, labels=label)
    )
    if labels:
        (root / name / "labels.txt").write_text(labels)


def _ensemble(root: Path, name: str, text: str) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(text)


@pytest.fixture(scope="module")
def ens_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    base = tmp_path_factory.mktemp("ensemble_compat")
    root = base / "models"
    _identity(root, "id_batch", 8, 4, "TYPE_FP32")
    _identity(root, "id_branch", 8, 4, "TYPE_FP32")
    _identity(root, "id_nobatch", 0, 4, "TYPE_FP32")
    _identity(root, "scores", 8, 5, "TYPE_FP32", "cat\ndog\nbird\nfish\nfrog\n")
    _identity(root, "int_scores", 8, 5, "TYPE_INT32", "a\nb\nc\nd\ne\n")
    for name, mbs, first, second in (
        ("ens_nobatch_first", 0, "id_nobatch", "id_batch"),
        ("ens_batch_first", 8, "id_batch", "id_nobatch"),
    ):
        text = TWO_STEPS.format(name=name, mbs=mbs, first=first, second=second)
        _ensemble(root, name, text)
    _ensemble(root, "ens_branches", BRANCHES)
    _ensemble(root, "ens_labels", LABELLED)
    save(running_sum_model(with_corrid=False), root / "running_sum" / "1" / "model.onnx")
    (root / "running_sum" / "config.pbtxt").write_text(
        RUNNING_SUM_CONFIG.format(name="running_sum", idle_us=5_000_000, corrid="").replace(
            ',\n  { name: "CORR", data_type: TYPE_INT64, dims: [ 1 ] }', ""
        )
    )
    _ensemble(root, "ens_sequence", SEQUENCE)
    _ensemble(root, "ens_own_labels", OWN_LABELS)
    (root / "ens_own_labels" / "own.txt").write_text("c0\nc1\nc2\nc3\nc4\n")
    for name, source, config in (
        ("py_fanout", FANOUT, FANOUT_CONFIG),
        ("py_add2", ADD2, ADD2_CONFIG),
    ):
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.py").write_text(source)
        (root / name / "config.pbtxt").write_text(config)
    for name, mbs in (("ens_decoupled", 0), ("ens_decoupled_batching", 8)):
        _ensemble(root, name, DECOUPLED_STEP.format(name=name, mbs=mbs))
    _ensemble(root, "ens_mixed_origins", MIXED_ORIGINS)
    proc = ServerProcess(root, log_path=base / "server.log")
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()


def _fp32(module: Any, name: str, array: np.ndarray) -> Any:
    tensor = module.InferInput(name, list(array.shape), "FP32")
    tensor.set_data_from_numpy(array)
    return tensor


MODULES = [httpclient, grpcclient]


@pytest.mark.parametrize("module", MODULES)
def test_a_non_batching_ensemble_feeds_a_batching_step(
    ens_server: ServerProcess, module: Any
) -> None:
    """The ensemble and its first step have max_batch_size 0, the second step batches: Triton
    adds a batch dimension of 1 on the way in and strips it from the ensemble's output."""
    x = np.arange(4, dtype=np.float32)
    result = ens_server.client(module).infer("ens_nobatch_first", [_fp32(module, "IN", x)])
    np.testing.assert_array_equal(result.as_numpy("OUT"), x)


@pytest.mark.parametrize("module", MODULES)
def test_a_batching_ensemble_feeds_a_non_batching_step(
    ens_server: ServerProcess, module: Any
) -> None:
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    result = ens_server.client(module).infer("ens_batch_first", [_fp32(module, "IN", x)])
    np.testing.assert_array_equal(result.as_numpy("OUT"), x)


@pytest.mark.parametrize("module", MODULES)
def test_a_steps_error_says_in_ensemble(ens_server: ServerProcess, module: Any) -> None:
    """A batch of 2 cannot lose its batch dimension for the non-batching step: the step's
    error, with tritonserver's prefix and code."""
    x = np.zeros((2, 4), dtype=np.float32)
    with pytest.raises(InferenceServerException) as err:
        ens_server.client(module).infer("ens_batch_first", [_fp32(module, "IN", x)])
    assert err.value.message().startswith(
        "in ensemble 'ens_batch_first', [request id: <id_unknown>] unexpected shape for input "
        "'INPUT0' for model 'id_nobatch'. Expected [4], got [2,4]"
    )
    assert err.value.status() == ("400" if module is httpclient else "StatusCode.INVALID_ARGUMENT")


def _count(server: ServerProcess, model: str) -> int:
    stats = httpclient.InferenceServerClient(server.http_url).get_inference_statistics(model)
    return int(stats["model_stats"][0]["inference_count"])


@pytest.mark.parametrize("module", MODULES)
def test_steps_for_outputs_not_requested_do_not_run(ens_server: ServerProcess, module: Any) -> None:
    before = _count(ens_server, "id_branch"), _count(ens_server, "id_batch")
    x = np.ones((1, 4), dtype=np.float32)
    outputs = [module.InferRequestedOutput("OUT_A")]
    result = ens_server.client(module).infer(
        "ens_branches", [_fp32(module, "IN", x)], outputs=outputs
    )
    np.testing.assert_array_equal(result.as_numpy("OUT_A"), x)
    assert result.as_numpy("OUT_B") is None
    assert (_count(ens_server, "id_branch"), _count(ens_server, "id_batch")) == (
        before[0],
        before[1] + 1,
    )


@pytest.mark.parametrize("module", MODULES)
def test_a_sequence_model_inside_an_ensemble(ens_server: ServerProcess, module: Any) -> None:
    """The ensemble request's sequence id and start / end flags reach its sequence step."""
    client = ens_server.client(module)
    base = 100 if module is httpclient else 200
    sums: dict[int, list[int]] = {base + 1: [], base + 2: []}
    for step in range(3):
        for sid in sums:
            tensor = module.InferInput("IN", [1, 1], "INT32")
            tensor.set_data_from_numpy(np.array([[sid * 10 + step]], dtype=np.int32))
            result = client.infer(
                "ens_sequence",
                [tensor],
                sequence_id=sid,
                sequence_start=step == 0,
                sequence_end=step == 2,
            )
            sums[sid].append(int(result.as_numpy("OUT")[0, 0]))
    for sid, got in sums.items():
        assert got == list(np.cumsum([sid * 10 + step for step in range(3)]))
    tensor = module.InferInput("IN", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[1]], dtype=np.int32))
    with pytest.raises(InferenceServerException) as err:
        client.infer("ens_sequence", [tensor], sequence_id=base + 9)
    assert err.value.message() == (
        f"in ensemble 'ens_sequence', inference request for sequence {base + 9} to model "
        "'running_sum' must specify the START flag on the first request of the sequence"
    )


@pytest.mark.parametrize("module", MODULES)
def test_ensemble_classification_uses_the_composing_models_labels(
    ens_server: ServerProcess, module: Any
) -> None:
    x = np.array([[0.1, 0.7, 0.05, 0.1, 0.05]], dtype=np.float32)
    outputs = [module.InferRequestedOutput("OUT", class_count=2)]
    result = ens_server.client(module).infer(
        "ens_labels", [_fp32(module, "IN", x)], outputs=outputs
    )
    got = [v.decode() if isinstance(v, bytes) else v for v in result.as_numpy("OUT")[0]]
    assert got == ["0.700000:1:dog", "0.100000:0:cat"]


@pytest.mark.parametrize("module", MODULES)
def test_classification_of_an_integer_output(ens_server: ServerProcess, module: Any) -> None:
    """tritonserver writes an integer score as an integer: 16:3, not 16.000000:3."""
    tensor = module.InferInput("INPUT0", [1, 5], "INT32")
    tensor.set_data_from_numpy(np.array([[4, 9, 1, 16, 0]], dtype=np.int32))
    outputs = [module.InferRequestedOutput("OUTPUT0", class_count=2)]
    result = ens_server.client(module).infer("int_scores", [tensor], outputs=outputs)
    got = [v.decode() if isinstance(v, bytes) else v for v in result.as_numpy("OUTPUT0")[0]]
    assert got == ["16:3:d", "9:1:b"]


@pytest.mark.parametrize("module", MODULES)
def test_an_ensembles_own_labels_come_first(ens_server: ServerProcess, module: Any) -> None:
    """The ensemble's output has a label_filename of its own: its labels, not the step's."""
    x = np.array([[0.1, 0.7, 0.05, 0.1, 0.05]], dtype=np.float32)
    outputs = [module.InferRequestedOutput("OUT", class_count=2)]
    result = ens_server.client(module).infer(
        "ens_own_labels", [_fp32(module, "IN", x)], outputs=outputs
    )
    got = [v.decode() if isinstance(v, bytes) else v for v in result.as_numpy("OUT")[0]]
    assert got == ["0.700000:1:c1", "0.100000:0:c0"]


def _stream_all(server: ServerProcess, model: str, x: np.ndarray) -> list[Any]:
    """One request over a gRPC stream: its outputs 'OUT', then None for the final flag."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    got: list[Any] = []
    try:
        client.async_stream_infer(
            model, [_fp32(grpcclient, "IN", x)], request_id="r1", enable_empty_final_response=True
        )
        while True:
            result, error = results.get(timeout=30)
            assert error is None, error
            response = result.get_response()
            assert response.id == "r1"
            if response.parameters["triton_final_response"].bool_param:
                assert result.as_numpy("OUT") is None
                got.append(None)
                return got
            got.append(result.as_numpy("OUT"))
    finally:
        client.stop_stream()


@pytest.mark.parametrize(
    ("model", "shape"), [("ens_decoupled", (4,)), ("ens_decoupled_batching", (1, 4))]
)
def test_a_decoupled_step_runs_the_later_steps_once_per_response(
    ens_server: ServerProcess, model: str, shape: tuple[int, ...]
) -> None:
    before = _count(ens_server, "id_nobatch")
    x = np.array([3, 1, 2, 5], dtype=np.float32).reshape(shape)
    got = _stream_all(ens_server, model, x)
    assert got[-1] is None
    assert [out.tolist() for out in got[:-1]] == [(x * (i + 1)).tolist() for i in range(3)]
    assert _count(ens_server, "id_nobatch") == before + 3
    zero = np.array([0, 1, 2, 5], dtype=np.float32).reshape(shape)
    assert _stream_all(ens_server, model, zero) == [None]  # no response: only the final flag


def test_an_ensemble_with_a_decoupled_step_is_decoupled(ens_server: ServerProcess) -> None:
    """Its config says so, as tritonserver fills it in; HTTP's infer refuses it, as
    tritonserver's HTTP endpoint refuses decoupled models."""
    http = httpclient.InferenceServerClient(ens_server.http_url)
    config = http.get_model_config("ens_decoupled")
    assert config["model_transaction_policy"]["decoupled"] is True
    grpc_config = grpcclient.InferenceServerClient(ens_server.grpc_url).get_model_config(
        "ens_decoupled"
    )
    assert grpc_config.config.model_transaction_policy.decoupled
    assert (
        not http.get_model_config("ens_labels")
        .get("model_transaction_policy", {})
        .get("decoupled", False)
    )
    with pytest.raises(InferenceServerException, match="is decoupled"):
        http.infer("ens_decoupled", [_fp32(httpclient, "IN", np.ones(4, np.float32))])


def test_a_step_fed_by_two_decoupled_origins_is_refused(ens_server: ServerProcess) -> None:
    index = httpclient.InferenceServerClient(ens_server.http_url).get_model_repository_index()
    entry = next(m for m in index if m["name"] == "ens_mixed_origins")
    assert entry["state"] == "UNAVAILABLE"
    assert (
        "in ensemble ens_mixed_origins, step of model 'py_add2' receives inputs originated "
        "from different decoupled models"
    ) in entry["reason"]


def test_a_decoupled_ensemble_streams_over_http_generate_stream(ens_server: ServerProcess) -> None:
    """HTTP's way to a decoupled model (Triton's generate_stream): one event per response."""
    request = urllib.request.Request(
        f"http://{ens_server.http_url}/v2/models/ens_decoupled/generate_stream",
        data=json.dumps({"IN": [3, 1, 2, 5]}).encode(),
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        body = response.read()
    events = [json.loads(line[6:]) for line in body.split(b"\n") if line.startswith(b"data: ")]
    assert [event["OUT"] for event in events] == [[3 * i, i, 2 * i, 5 * i] for i in (1, 2, 3)]
