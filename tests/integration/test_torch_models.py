"""PyTorch backend: TorchScript modules scripted in the test, served, checked against themselves."""

from __future__ import annotations

import asyncio
import queue
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.http.aio as httpaio

from configs.generate import REPEAT_CONFIG, REPEAT_MODEL
from tests.serverproc import ServerProcess

torch = pytest.importorskip("torch", reason="torch is not installed (extra 'torch')")
# TorchScript is what Triton's pytorch_backend serves, deprecated in torch or not.
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated")


class LinearTwoOutputs(torch.nn.Module):  # type: ignore[misc]  # torch is untyped to mypy here
    """Two inputs, two outputs, real weights."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = torch.nn.Linear(4, 3)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.linear(x) + y.sum(dim=1, keepdim=True), x * 2.0


MODULE = LinearTwoOutputs().eval()


class AddSub(torch.nn.Module):  # type: ignore[misc]
    """Triton's qa libtorch_*_int32_int32_int32: (INPUT0 + INPUT1, INPUT0 - INPUT1)."""

    def forward(
        self, INPUT0: torch.Tensor, INPUT1: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return INPUT0 + INPUT1, INPUT0 - INPUT1


PT_ADD_SUB = """\
name: "pt_add_sub"
platform: "pytorch_libtorch"
max_batch_size: 0
input [
  { name: "INPUT0", data_type: TYPE_INT32, dims: [ 1 ] },
  { name: "INPUT1", data_type: TYPE_INT32, dims: [ 1 ] }
]
output [
  { name: "OUTPUT__0", data_type: TYPE_INT32, dims: [ 1 ] },
  { name: "OUTPUT__1", data_type: TYPE_INT32, dims: [ 1 ] }
]
"""

# L0_decoupled's fan_repeat: a decoupled Python step, an identity step and a TorchScript step
# (whose config dims Triton takes as they are: TorchScript has no shapes to check them by).
FAN_REPEAT = """\
name: "fan_repeat"
platform: "ensemble"
max_batch_size: 0
input [
  { name: "IN", data_type: TYPE_INT32, dims: [ -1 ] },
  { name: "DELAY", data_type: TYPE_UINT32, dims: [ -1 ] },
  { name: "WAIT", data_type: TYPE_UINT32, dims: [ 1 ] }
]
output [ { name: "OUT", data_type: TYPE_INT32, dims: [ 1 ] } ]
ensemble_scheduling { step [
  { model_name: "repeat_int32", model_version: -1,
    input_map { key: "IN" value: "IN" } input_map { key: "DELAY" value: "DELAY" }
    input_map { key: "WAIT" value: "WAIT" } output_map { key: "OUT" value: "repeat_out" } },
  { model_name: "identity_int32", model_version: -1,
    input_map { key: "INPUT0" value: "repeat_out" }
    output_map { key: "OUTPUT0" value: "identity_out" } },
  { model_name: "pt_add_sub", model_version: -1,
    input_map { key: "INPUT0" value: "repeat_out" }
    input_map { key: "INPUT1" value: "identity_out" }
    output_map { key: "OUTPUT__0" value: "OUT" } }
] }
"""
BATCHING = "max_batch_size: 8\ndynamic_batching { max_queue_delay_microseconds: 300000 }\n"


def _tensors(kind: str, names: list[str], width: int) -> str:
    entries = ", ".join(
        f'{{ name: "{n}", data_type: TYPE_FP32, dims: [ {width} ] }}' for n in names
    )
    return f"{kind} [ {entries} ]\n"


def _model(root: Path, name: str, config: str | None) -> None:
    (root / name / "1").mkdir(parents=True)
    torch.jit.script(MODULE).save(str(root / name / "1" / "model.pt"))
    if config is not None:
        (root / name / "config.pbtxt").write_text(f'name: "{name}"\n' + config)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("torch_models")
    # Triton's NAME__<index> convention, the platform name, the dynamic batcher.
    _model(
        root,
        "pt_indexed",
        'platform: "pytorch_libtorch"\n'
        + BATCHING
        + _tensors("input", ["INPUT__0", "INPUT__1"], 4)
        + 'output [ { name: "OUTPUT__0", data_type: TYPE_FP32, dims: [ 3 ] },\n'
        + '         { name: "OUTPUT__1", data_type: TYPE_FP32, dims: [ 4 ] } ]\n',
    )
    # forward()'s argument names, listed in the other order; outputs in config order.
    _model(
        root,
        "pt_named",
        'backend: "pytorch"\nmax_batch_size: 8\n'
        + _tensors("input", ["y", "x"], 4)
        + 'output [ { name: "affine", data_type: TYPE_FP32, dims: [ 3 ] },\n'
        + '         { name: "doubled", data_type: TYPE_FP32, dims: [ 4 ] } ]\n',
    )
    # KIND_GPU without CUDA: served on CPU, with the reason in the index.
    _model(
        root,
        "pt_gpu",
        'backend: "pytorch"\nmax_batch_size: 8\n'
        + _tensors("input", ["INPUT__0", "INPUT__1"], 4)
        + _tensors("output", ["OUTPUT__0"], 3)
        + "instance_group [ { count: 1, kind: KIND_GPU, gpus: [ 0 ] } ]\n",
    )
    # No config: TorchScript has no signature to auto-complete from.
    _model(root, "pt_no_config", None)
    _model(
        root,
        "pt_bad_param",
        'backend: "pytorch"\nmax_batch_size: 8\n'
        + _tensors("input", ["INPUT__0", "INPUT__1"], 4)
        + _tensors("output", ["OUTPUT__0"], 3)
        + 'parameters { key: "INFERENCE_MODE" value { string_value: "sometimes" } }\n',
    )
    # A wrong output datatype is caught on the first request.
    _model(
        root,
        "pt_wrong_dtype",
        'backend: "pytorch"\nmax_batch_size: 8\n'
        + _tensors("input", ["INPUT__0", "INPUT__1"], 4)
        + 'output [ { name: "OUTPUT__0", data_type: TYPE_FP64, dims: [ 3 ] } ]\n',
    )
    (root / "pt_add_sub" / "1").mkdir(parents=True)
    torch.jit.script(AddSub()).save(str(root / "pt_add_sub" / "1" / "model.pt"))
    (root / "pt_add_sub" / "config.pbtxt").write_text(PT_ADD_SUB)
    (root / "repeat_int32" / "1").mkdir(parents=True)
    (root / "repeat_int32" / "config.pbtxt").write_text(REPEAT_CONFIG)
    (root / "repeat_int32" / "1" / "model.py").write_text(REPEAT_MODEL)
    (root / "identity_int32" / "1").mkdir(parents=True)
    (root / "identity_int32" / "config.pbtxt").write_text(
        'name: "identity_int32"\nbackend: "identity"\nmax_batch_size: 0\n'
        'input [ { name: "INPUT0", data_type: TYPE_INT32, dims: [ -1 ] } ]\n'
        'output [ { name: "OUTPUT0", data_type: TYPE_INT32, dims: [ -1 ] } ]\n'
    )
    (root / "fan_repeat" / "1").mkdir(parents=True)
    (root / "fan_repeat" / "config.pbtxt").write_text(FAN_REPEAT)
    return root


@pytest.fixture(scope="module")
def server(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = ServerProcess(repo, log_path=tmp_path_factory.mktemp("pt_logs") / "server.log")
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()


def _data(rows: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.random((rows, 4), dtype=np.float32), rng.random((rows, 4), dtype=np.float32)


def _expected(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    with torch.no_grad():
        a, b = MODULE(torch.from_numpy(x), torch.from_numpy(y))
    return a.numpy(), b.numpy()


def _index(server: ServerProcess) -> dict[str, dict[str, str]]:
    client = httpclient.InferenceServerClient(server.http_url)
    return {e["name"]: e for e in client.get_model_repository_index()}


def test_indexed_names_over_http_and_grpc(server: ServerProcess) -> None:
    x, y = _data(3, seed=0)
    want0, want1 = _expected(x, y)
    http = httpclient.InferenceServerClient(server.http_url)
    inputs = [httpclient.InferInput(n, [3, 4], "FP32") for n in ("INPUT__0", "INPUT__1")]
    inputs[0].set_data_from_numpy(x)
    inputs[1].set_data_from_numpy(y)
    result = http.infer("pt_indexed", inputs)
    np.testing.assert_allclose(result.as_numpy("OUTPUT__0"), want0, rtol=1e-6)
    np.testing.assert_allclose(result.as_numpy("OUTPUT__1"), want1, rtol=1e-6)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    ginputs = [grpcclient.InferInput(n, [3, 4], "FP32") for n in ("INPUT__0", "INPUT__1")]
    ginputs[0].set_data_from_numpy(x)
    ginputs[1].set_data_from_numpy(y)
    gresult = grpc.infer("pt_indexed", ginputs)
    np.testing.assert_allclose(gresult.as_numpy("OUTPUT__0"), want0, rtol=1e-6)
    np.testing.assert_allclose(gresult.as_numpy("OUTPUT__1"), want1, rtol=1e-6)
    assert http.get_model_metadata("pt_indexed")["platform"] == "pytorch_libtorch"


def test_forward_argument_names_map_by_name(server: ServerProcess) -> None:
    x, y = _data(2, seed=1)
    want0, want1 = _expected(x, y)
    client = httpclient.InferenceServerClient(server.http_url)
    inputs = [httpclient.InferInput(n, [2, 4], "FP32") for n in ("x", "y")]
    inputs[0].set_data_from_numpy(x)
    inputs[1].set_data_from_numpy(y)
    result = client.infer("pt_named", inputs)
    np.testing.assert_allclose(result.as_numpy("affine"), want0, rtol=1e-6)
    np.testing.assert_allclose(result.as_numpy("doubled"), want1, rtol=1e-6)


async def _concurrent(url: str, x: np.ndarray, y: np.ndarray) -> list[np.ndarray]:
    client = httpaio.InferenceServerClient(url)
    try:

        async def one(i: int) -> np.ndarray:
            inputs = [httpaio.InferInput(n, [1, 4], "FP32") for n in ("INPUT__0", "INPUT__1")]
            inputs[0].set_data_from_numpy(x[i : i + 1])
            inputs[1].set_data_from_numpy(y[i : i + 1])
            return (await client.infer("pt_indexed", inputs)).as_numpy("OUTPUT__0")

        return await asyncio.gather(*(one(i) for i in range(len(x))))
    finally:
        await client.close()


def test_dynamic_batcher_batches_requests(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    before = client.get_inference_statistics("pt_indexed")["model_stats"][0]
    x, y = _data(6, seed=2)
    outputs = asyncio.run(_concurrent(server.http_url, x, y))
    after = client.get_inference_statistics("pt_indexed")["model_stats"][0]
    want, _ = _expected(x, y)
    for i, out in enumerate(outputs):
        np.testing.assert_allclose(out, want[i : i + 1], rtol=1e-6)
    inferences = after["inference_count"] - before["inference_count"]
    assert inferences == 6
    assert after["execution_count"] - before["execution_count"] < inferences


@pytest.mark.gpu
def test_gpu_group_runs_on_cuda(server: ServerProcess) -> None:
    """On a machine whose torch has CUDA (tests/gpu/run_device_checks.sh runs this)."""
    if not torch.cuda.is_available():
        pytest.skip(f"this torch {torch.__version__} has no CUDA device")
    entry = _index(server)["pt_gpu"]
    assert (entry["state"], entry["reason"]) == ("READY", "")
    client = httpclient.InferenceServerClient(server.http_url)
    assert [g["kind"] for g in client.get_model_config("pt_gpu")["instance_group"]] == [
        "KIND_GPU"
    ]
    x, y = _data(5, seed=4)
    inputs = [httpclient.InferInput(n, [5, 4], "FP32") for n in ("INPUT__0", "INPUT__1")]
    inputs[0].set_data_from_numpy(x)
    inputs[1].set_data_from_numpy(y)
    out = client.infer("pt_gpu", inputs).as_numpy("OUTPUT__0")
    np.testing.assert_allclose(out, _expected(x, y)[0], rtol=1e-4, atol=1e-5)


def test_gpu_group_without_cuda_runs_on_cpu_and_says_so(server: ServerProcess) -> None:
    if torch.cuda.is_available():
        pytest.skip("CUDA is available: KIND_GPU runs on the GPU here")
    entry = _index(server)["pt_gpu"]
    assert entry["state"] == "READY"
    assert "1 KIND_GPU instance(s) of group 'pt_gpu_0' run on CPU" in entry["reason"]
    assert f"no usable GPU (this torch {torch.__version__}" in entry["reason"]
    x, y = _data(1, seed=3)
    client = httpclient.InferenceServerClient(server.http_url)
    inputs = [httpclient.InferInput(n, [1, 4], "FP32") for n in ("INPUT__0", "INPUT__1")]
    inputs[0].set_data_from_numpy(x)
    inputs[1].set_data_from_numpy(y)
    out = client.infer("pt_gpu", inputs).as_numpy("OUTPUT__0")
    np.testing.assert_allclose(out, _expected(x, y)[0], rtol=1e-6)


def test_models_that_cannot_load_say_why(server: ServerProcess) -> None:
    index = _index(server)
    assert index["pt_no_config"]["state"] == "UNAVAILABLE"
    assert "no inputs; list them under 'input'" in index["pt_no_config"]["reason"]
    assert index["pt_bad_param"]["state"] == "UNAVAILABLE"
    assert (
        "model 'pt_bad_param': pytorch parameter 'INFERENCE_MODE' must be YES / NO "
        "(or true / false), got 'sometimes'" in index["pt_bad_param"]["reason"]
    )


def test_wrong_output_datatype_fails_the_request_with_the_reason(server: ServerProcess) -> None:
    x, y = _data(1, seed=4)
    client = httpclient.InferenceServerClient(server.http_url)
    inputs = [httpclient.InferInput(n, [1, 4], "FP32") for n in ("INPUT__0", "INPUT__1")]
    inputs[0].set_data_from_numpy(x)
    inputs[1].set_data_from_numpy(y)
    with pytest.raises(Exception, match="output 'OUTPUT__0': the model returned float32, the"):
        client.infer("pt_wrong_dtype", inputs)


def test_a_decoupled_ensemble_with_a_torchscript_step_streams(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    assert client.is_model_ready("fan_repeat")
    answers: queue.Queue[tuple[object, object]] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    values = [4, 2, 0, 1]
    inputs = []
    for name, datatype, data in (
        ("IN", "INT32", np.array(values, dtype=np.int32)),
        ("DELAY", "UINT32", np.zeros(4, dtype=np.uint32)),
        ("WAIT", "UINT32", np.zeros(1, dtype=np.uint32)),
    ):
        tensor = grpcclient.InferInput(name, list(data.shape), datatype)
        tensor.set_data_from_numpy(data)
        inputs.append(tensor)
    client.async_stream_infer("fan_repeat", inputs)
    got = []
    for _ in values:  # one response per element: OUT = IN + identity(IN)
        result, error = answers.get(timeout=30)
        assert error is None
        got.append(int(result.as_numpy("OUT")[0]))  # type: ignore[attr-defined]
    client.stop_stream()
    assert sorted(got) == sorted(2 * v for v in values)
