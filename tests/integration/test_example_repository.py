"""The bundled example repository (configs/generate.py), used the way Triton's examples use it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from configs.generate import write_repository
from tests.serverproc import ServerProcess


@pytest.fixture(scope="module")
def example_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = write_repository(tmp_path_factory.mktemp("example"))
    proc = ServerProcess(repo, log_path=tmp_path_factory.mktemp("logs") / "example.log")
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()


def test_every_example_model_is_ready(example_server: ServerProcess) -> None:
    index = httpclient.InferenceServerClient(example_server.http_url).get_model_repository_index()
    assert {e["name"]: e["state"] for e in index} == dict.fromkeys(
        (
            "densenet_onnx",
            "densenet_preprocess",
            "identity_fp32",
            "simple",
            "simple_identity",
            "simple_int8",
            "simple_string",
            "squeezenet_onnx",
            # Triton's client examples' models
            "simple_sequence",
            "simple_dyna_sequence",
            "custom_identity_int32",
            "repeat_int32",
            "image_preprocess",
            "preprocess_inception_ensemble",
        ),
        "READY",
    )


@pytest.mark.parametrize("module", [httpclient, grpcclient])
def test_simple_string(example_server: ServerProcess, module) -> None:  # type: ignore[no-untyped-def]
    url = example_server.http_url if module is httpclient else example_server.grpc_url
    client = module.InferenceServerClient(url)
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 3, dtype=np.int32)
    inputs = [module.InferInput(n, [1, 16], "BYTES") for n in ("INPUT0", "INPUT1")]
    inputs[0].set_data_from_numpy(
        np.array([str(x).encode() for x in a.ravel()], dtype=object).reshape(1, 16)
    )
    inputs[1].set_data_from_numpy(
        np.array([str(x).encode() for x in b.ravel()], dtype=object).reshape(1, 16)
    )
    result = client.infer("simple_string", inputs)
    assert [int(x) for x in result.as_numpy("OUTPUT0").ravel()] == (a + b).ravel().tolist()
    assert [int(x) for x in result.as_numpy("OUTPUT1").ravel()] == (a - b).ravel().tolist()


def test_simple_int8_with_explicit_contents(example_server: ServerProcess) -> None:
    """What grpc_explicit_int8_content_client does: typed int_contents, raw outputs back."""
    stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(example_server.grpc_url))
    request = service_pb2.ModelInferRequest(model_name="simple_int8")
    for name, values in (("INPUT0", list(range(16))), ("INPUT1", [1] * 16)):
        tensor = request.inputs.add(name=name, datatype="INT8", shape=[1, 16])
        tensor.contents.int_contents.extend(values)
    response = stub.ModelInfer(request)
    sums = np.frombuffer(response.raw_output_contents[0], dtype=np.int8)
    assert sums.tolist() == [i + 1 for i in range(16)]


def test_image_models_classify_with_labels(example_server: ServerProcess) -> None:
    model = "squeezenet_onnx"
    client = grpcclient.InferenceServerClient(example_server.grpc_url)
    meta = client.get_model_metadata(model, as_json=True)
    assert meta["inputs"][0]["shape"] == ["-1", "3", "224", "224"]
    config = client.get_model_config(model).config
    assert config.input[0].format == config.input[0].FORMAT_NCHW
    image = np.random.default_rng(0).random((2, 3, 224, 224), dtype=np.float32)
    inp = grpcclient.InferInput("data_0", [2, 3, 224, 224], "FP32")
    inp.set_data_from_numpy(image)
    out_name = config.output[0].name
    result = client.infer(
        model, [inp], outputs=[grpcclient.InferRequestedOutput(out_name, class_count=3)]
    )
    classes = result.as_numpy(out_name)
    assert classes.shape == (2, 3)
    value, index, label = classes[0, 0].decode().split(":")
    assert label == f"class_{int(index):03d}"
    scores = client.infer(model, [inp]).as_numpy(out_name)
    assert scores.shape == (2, 1000, 1, 1)
    assert float(value) == pytest.approx(float(scores[0].ravel().max()), rel=1e-5)


@pytest.mark.parametrize("module", [httpclient, grpcclient])
def test_densenet_takes_one_unbatched_image_as_triton_s_example(
    example_server: ServerProcess, module: Any
) -> None:
    """Triton's example config (max_batch_size 0, reshape [1, 3, 224, 224]): what its
    grpc_client.py and image_client.py send."""
    url = example_server.http_url if module is httpclient else example_server.grpc_url
    client = module.InferenceServerClient(url)
    meta = client.get_model_metadata("densenet_onnx")
    shapes = meta["inputs"][0]["shape"] if isinstance(meta, dict) else meta.inputs[0].shape
    assert [int(d) for d in shapes] == [3, 224, 224]
    inp = module.InferInput("data_0", [3, 224, 224], "FP32")
    inp.set_data_from_numpy(np.random.default_rng(0).random((3, 224, 224), dtype=np.float32))
    scores = client.infer("densenet_onnx", [inp]).as_numpy("fc6_1")
    assert scores.shape == (1000,)
    out = module.InferRequestedOutput("fc6_1", class_count=3)
    classes = client.infer("densenet_onnx", [inp], outputs=[out]).as_numpy("fc6_1")
    assert classes.shape == (3,)
    value, index, label = classes[0].decode().split(":")
    assert label == f"class_{int(index):03d}"
    assert float(value) == pytest.approx(float(scores.max()), rel=1e-5)
    batched = module.InferInput("data_0", [1, 3, 224, 224], "FP32")
    batched.set_data_from_numpy(np.zeros((1, 3, 224, 224), np.float32))
    with pytest.raises(InferenceServerException, match="data_0"):
        client.infer("densenet_onnx", [batched])


def test_python_preprocessing_in_front_of_densenet_via_bls(example_server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(example_server.grpc_url)
    image = np.random.default_rng(1).integers(0, 256, (224, 224, 3), dtype=np.uint8)
    inp = grpcclient.InferInput("IMAGE", [224, 224, 3], "UINT8")
    inp.set_data_from_numpy(image)
    scores = client.infer("densenet_preprocess", [inp]).as_numpy("SCORES")
    # the same preprocessing done here, then densenet_onnx called directly, agrees
    chw = (image.astype(np.float32) / 255.0).transpose(2, 0, 1)
    mean = np.array([0.485, 0.456, 0.406], dtype=np.float32).reshape(3, 1, 1)
    std = np.array([0.229, 0.224, 0.225], dtype=np.float32).reshape(3, 1, 1)
    direct_in = grpcclient.InferInput("data_0", [3, 224, 224], "FP32")
    direct_in.set_data_from_numpy(((chw - mean) / std).astype(np.float32))
    direct = client.infer("densenet_onnx", [direct_in]).as_numpy("fc6_1")
    np.testing.assert_allclose(scores, direct, rtol=1e-5)
