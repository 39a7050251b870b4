"""The example repository's models for Triton's client examples behave as those examples
expect (the examples themselves are run from outside the project: docs/compatibility.md)."""

from __future__ import annotations

import io
import os
import queue
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from configs.generate import write_repository
from tests.serverproc import ROOT, ServerProcess

MODULES = [httpclient, grpcclient]


@pytest.fixture(scope="module")
def examples(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = write_repository(tmp_path_factory.mktemp("client_examples"))
    proc = ServerProcess(repo, log_path=tmp_path_factory.mktemp("logs") / "examples.log")
    with proc:
        yield proc


def _sequence(client: Any, module: Any, model: str, sid: int | str, values: list[int]) -> list[int]:
    out = []
    for i, value in enumerate(values):
        tensor = module.InferInput("INPUT", [1, 1], "INT32")
        tensor.set_data_from_numpy(np.array([[value]], dtype=np.int32))
        result = client.infer(
            model,
            [tensor],
            sequence_id=sid,
            sequence_start=i == 0,
            sequence_end=i == len(values) - 1,
        )
        out.append(int(result.as_numpy("OUTPUT")[0, 0]))
    return out


@pytest.mark.parametrize("module", MODULES)
def test_simple_sequence_and_simple_dyna_sequence(examples: ServerProcess, module: Any) -> None:
    """simple_sequence: INPUT + START; simple_dyna_sequence adds CORRID at the END (what the
    sequence examples check, default and --dyna)."""
    client = examples.client(module)
    values = [0, 11, 7, 5]
    assert _sequence(client, module, "simple_sequence", 1000, values) == [1, 11, 7, 5]
    assert _sequence(client, module, "simple_sequence", "a-string-id", values) == [1, 11, 7, 5]
    assert _sequence(client, module, "simple_dyna_sequence", 1001, values) == [1, 11, 7, 1006]


def test_repeat_int32_streams_one_response_per_element(examples: ServerProcess) -> None:
    responses: queue.Queue[Any] = queue.Queue()
    client = grpcclient.InferenceServerClient(examples.grpc_url)
    values = np.arange(100, 104, dtype=np.int32)
    inputs = [
        grpcclient.InferInput("IN", [4], "INT32"),
        grpcclient.InferInput("DELAY", [4], "UINT32"),
        grpcclient.InferInput("WAIT", [1], "UINT32"),
    ]
    inputs[0].set_data_from_numpy(values)
    inputs[1].set_data_from_numpy(np.full(4, 10, dtype=np.uint32))
    inputs[2].set_data_from_numpy(np.array([10], dtype=np.uint32))
    client.start_stream(callback=lambda result, error: responses.put(error or result))
    try:
        client.async_stream_infer("repeat_int32", inputs)
        got = [responses.get(timeout=30) for _ in range(4)]
    finally:
        client.stop_stream()
    assert [int(r.as_numpy("OUT")[0]) for r in got] == values.tolist()
    assert [int(r.as_numpy("IDX")[0]) for r in got] == [0, 1, 2, 3]


@pytest.mark.parametrize("module", MODULES)
def test_custom_identity_int32(examples: ServerProcess, module: Any) -> None:
    data = np.arange(16, dtype=np.int32).reshape(1, 16)
    tensor = module.InferInput("INPUT0", [1, 16], "INT32")
    tensor.set_data_from_numpy(data)
    result = examples.client(module).infer("custom_identity_int32", [tensor])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)


def _server_has_pillow() -> bool:
    """Whether the server's interpreter (PYTHONPATH: this repository) imports Pillow."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    check = subprocess.run([sys.executable, "-c", "import PIL"], env=env, check=False)
    return check.returncode == 0


@pytest.mark.skipif(
    not _server_has_pillow(),
    reason="image_preprocess decodes images with Pillow, which is not installed beside the "
    "server (Triton's ensemble_image_client.py runs with it: docs/compatibility.md)",
)
@pytest.mark.parametrize("module", MODULES)
def test_the_image_ensemble_classifies_with_labels(examples: ServerProcess, module: Any) -> None:
    from PIL import Image

    encoded = io.BytesIO()
    Image.new("RGB", (64, 48), (200, 30, 30)).save(encoded, format="PNG")
    images = np.array([[encoded.getvalue()]], dtype=np.object_)
    tensor = module.InferInput("INPUT", [1, 1], "BYTES")
    tensor.set_data_from_numpy(images)
    outputs = [module.InferRequestedOutput("OUTPUT", class_count=3)]
    result = examples.client(module).infer(
        "preprocess_inception_ensemble", [tensor], outputs=outputs
    )
    classes = result.as_numpy("OUTPUT")
    assert classes.shape == (1, 3)
    _, index, label = classes[0, 0].decode().split(":")
    assert label == f"class_{int(index):03d}"
