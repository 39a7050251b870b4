"""OpenVINO backend: IR and ONNX files served through tritonclient, checked against ONNX Runtime.

The IR is converted in the test from the SqueezeNet that ships in the onnx wheel, with its batch
dimension made dynamic, so the dynamic batcher can put several requests in one execution.

That "light" SqueezeNet has constant weights, so its 1000 logits are all equal, at about 1e10.
A softmax over them is 1/1000 each only where every class's sum is rounded the same way: ONNX
Runtime's are, OpenVINO's kernels round the last block of 8 classes differently (3 f32 ulps,
2e-7 relative), and the softmax then gives those 8 classes 0.125 and the rest 0, on some CPUs
and images. So the served models end in an Identity where the softmax was (same output name):
the logits, on which both runtimes agree to 3e-7 (relative) in f32, and bf16 (2% off) does not.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.http.aio as httpaio

from tests.serverproc import ServerProcess

ov = pytest.importorskip("openvino", reason="openvino is not installed (extra 'openvino')")

SQUEEZENET = Path(onnx.__file__).parent / "backend/test/data/light/light_squeezenet.onnx"
IN, OUT = "data_0", "softmaxout_1"


@functools.cache
def _logits_onnx() -> bytes:
    """SqueezeNet with its final Softmax replaced by an Identity of the same output name."""
    model = onnx.load(str(SQUEEZENET))
    for node in model.graph.node:
        if node.op_type == "Softmax":
            node.op_type = "Identity"
            del node.attribute[:]
    return model.SerializeToString()


def _ir(path: Path, dynamic_batch: bool) -> None:
    model = ov.Core().read_model(_logits_onnx(), b"")
    if dynamic_batch:
        model.reshape({IN: ov.PartialShape([-1, 3, 224, 224])})
    path.parent.mkdir(parents=True, exist_ok=True)
    # Full precision weights, so the outputs can be compared with ONNX Runtime's.
    ov.save_model(model, str(path), compress_to_fp16=False)


def _config(name: str, body: str = "") -> str:
    return f'name: "{name}"\nbackend: "openvino"\n{body}'


def _param(key: str, value: str) -> str:
    return f'parameters {{ key: "{key}" value {{ string_value: "{value}" }} }}\n'


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ov_models")
    batching = "max_batch_size: 8\ndynamic_batching { max_queue_delay_microseconds: 300000 }\n"
    # IR with a dynamic batch; inputs and outputs come from auto-complete.
    _ir(root / "ov_ir" / "1" / "model.xml", dynamic_batch=True)
    (root / "ov_ir" / "config.pbtxt").write_text(_config("ov_ir", batching))
    # The ONNX file itself, read by OpenVINO (its batch is fixed at 1: no batching).
    (root / "ov_onnx" / "1").mkdir(parents=True)
    (root / "ov_onnx" / "1" / "model.onnx").write_bytes(_logits_onnx())
    (root / "ov_onnx" / "config.pbtxt").write_text(
        _config("ov_onnx", 'default_model_filename: "model.onnx"\n')
    )
    # Compiled for a fixed batch of 8; smaller batches are padded.
    _ir(root / "ov_padded" / "1" / "model.xml", dynamic_batch=True)
    (root / "ov_padded" / "config.pbtxt").write_text(
        _config("ov_padded", "max_batch_size: 8\n")
        + _param("SKIP_OV_DYNAMIC_BATCHSIZE", "YES")
        + _param("ENABLE_BATCH_PADDING", "YES")
        + _param("PERFORMANCE_HINT", "THROUGHPUT")
        + _param("NUM_STREAMS", "2")
        + _param("INFERENCE_NUM_THREADS", "1")
    )
    # KIND_GPU: OpenVINO serves on CPU, and says so.
    _ir(root / "ov_gpu" / "1" / "model.xml", dynamic_batch=True)
    (root / "ov_gpu" / "config.pbtxt").write_text(
        _config("ov_gpu", "max_batch_size: 8\ninstance_group [ { count: 2, kind: KIND_GPU } ]\n")
    )
    # Values openvino_backend does not know fail the load with the key and what it accepts.
    for name, key, value in (
        ("ov_bad_hint", "PERFORMANCE_HINT", "FAST"),
        ("ov_bad_streams", "NUM_STREAMS", "many"),
        ("ov_bad_threads", "INFERENCE_NUM_THREADS", "-2"),
    ):
        _ir(root / name / "1" / "model.xml", dynamic_batch=True)
        (root / name / "config.pbtxt").write_text(
            _config(name, "max_batch_size: 8\n") + _param(key, value)
        )
    # IR without its weights file.
    _ir(root / "ov_no_bin" / "1" / "model.xml", dynamic_batch=True)
    (root / "ov_no_bin" / "1" / "model.bin").unlink()
    return root


@pytest.fixture(scope="module")
def server(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = ServerProcess(repo, log_path=tmp_path_factory.mktemp("ov_logs") / "server.log")
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()


def _reference(batch: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(_logits_onnx(), providers=["CPUExecutionProvider"])
    return np.concatenate([session.run([OUT], {IN: row[None]})[0] for row in batch])


def _images(count: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random((count, 3, 224, 224), dtype=np.float32)


def _index(server: ServerProcess) -> dict[str, dict[str, str]]:
    client = httpclient.InferenceServerClient(server.http_url)
    return {e["name"]: e for e in client.get_model_repository_index()}


def test_ir_is_auto_completed_from_the_model(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    meta = client.get_model_metadata("ov_ir")
    assert meta["inputs"] == [{"name": IN, "datatype": "FP32", "shape": [-1, 3, 224, 224]}]
    assert meta["outputs"] == [{"name": OUT, "datatype": "FP32", "shape": [-1, 1000, 1, 1]}]
    assert client.get_model_config("ov_ir")["backend"] == "openvino"


def test_ir_matches_onnxruntime_over_http_and_grpc(server: ServerProcess) -> None:
    images = _images(2)
    expected = _reference(images)
    http = httpclient.InferenceServerClient(server.http_url)
    inp = httpclient.InferInput(IN, list(images.shape), "FP32")
    inp.set_data_from_numpy(images)
    got_http = http.infer("ov_ir", [inp]).as_numpy(OUT)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    ginp = grpcclient.InferInput(IN, list(images.shape), "FP32")
    ginp.set_data_from_numpy(images)
    got_grpc = grpc.infer("ov_ir", [ginp]).as_numpy(OUT)
    np.testing.assert_allclose(got_http, expected, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got_grpc, expected, rtol=1e-4, atol=1e-5)


async def _concurrent(url: str, model: str, images: np.ndarray) -> list[np.ndarray]:
    client = httpaio.InferenceServerClient(url)
    try:

        async def one(i: int) -> np.ndarray:
            inp = httpaio.InferInput(IN, [1, 3, 224, 224], "FP32")
            inp.set_data_from_numpy(images[i : i + 1])
            return (await client.infer(model, [inp])).as_numpy(OUT)

        return await asyncio.gather(*(one(i) for i in range(len(images))))
    finally:
        await client.close()


def test_dynamic_batcher_batches_requests_on_the_dynamic_dimension(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    before = client.get_inference_statistics("ov_ir")["model_stats"][0]
    images = _images(6, seed=1)
    outputs = asyncio.run(_concurrent(server.http_url, "ov_ir", images))
    after = client.get_inference_statistics("ov_ir")["model_stats"][0]
    expected = _reference(images)
    for i, out in enumerate(outputs):  # each request got its own row back
        np.testing.assert_allclose(out, expected[i : i + 1], rtol=1e-4, atol=1e-5)
    inferences = after["inference_count"] - before["inference_count"]
    executions = after["execution_count"] - before["execution_count"]
    assert inferences == 6
    assert executions < inferences  # several requests ran as one batch


def test_onnx_file_served_by_openvino(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    config = client.get_model_config("ov_onnx")
    assert (config["backend"], config["max_batch_size"]) == ("openvino", 0)
    image = _images(1, seed=2)
    inp = httpclient.InferInput(IN, [1, 3, 224, 224], "FP32")
    inp.set_data_from_numpy(image)
    out = client.infer("ov_onnx", [inp]).as_numpy(OUT)
    np.testing.assert_allclose(out, _reference(image), rtol=1e-4, atol=1e-5)


def test_fixed_batch_pads_smaller_batches(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    images = _images(3, seed=3)
    inp = httpclient.InferInput(IN, list(images.shape), "FP32")
    inp.set_data_from_numpy(images)
    out = client.infer("ov_padded", [inp]).as_numpy(OUT)
    assert out.shape == (3, 1000, 1, 1)
    np.testing.assert_allclose(out, _reference(images), rtol=1e-4, atol=1e-5)


def test_gpu_group_runs_on_cpu_and_says_so(server: ServerProcess) -> None:
    entry = _index(server)["ov_gpu"]
    assert entry["state"] == "READY"
    assert "2 KIND_GPU instance(s) of group 'ov_gpu_0' run on CPU" in entry["reason"]
    assert "the openvino backend runs on CPU only" in entry["reason"]
    client = httpclient.InferenceServerClient(server.http_url)
    image = _images(1, seed=4)
    inp = httpclient.InferInput(IN, [1, 3, 224, 224], "FP32")
    inp.set_data_from_numpy(image)
    out = client.infer("ov_gpu", [inp]).as_numpy(OUT)
    np.testing.assert_allclose(out, _reference(image), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    ("model", "message"),
    [
        (
            "ov_bad_hint",
            "openvino parameter 'PERFORMANCE_HINT' must be one of LATENCY, THROUGHPUT, "
            "got 'FAST'",
        ),
        (
            "ov_bad_streams",
            "openvino parameter 'NUM_STREAMS' must be AUTO, NUMA or an integer >= 1, got 'many'",
        ),
        (
            "ov_bad_threads",
            "openvino parameter 'INFERENCE_NUM_THREADS' must be an integer >= 0, got '-2'",
        ),
        ("ov_no_bin", "needs its weights beside it in"),
    ],
)
def test_bad_models_fail_to_load_with_the_reason(
    server: ServerProcess, model: str, message: str
) -> None:
    entry = _index(server)[model]
    assert entry["state"] == "UNAVAILABLE"
    assert message in entry["reason"]
    if model != "ov_no_bin":
        assert f"model '{model}'" in entry["reason"]
