"""Input checks Triton's qa suites make (found by running L0_input_validation's InputShapeTest
against this server): a BYTES input whose elements do not fill its shape, or overfill it, and
a shared-memory input whose byte size does not fit its shape, each refused in tritonserver's
words (its request validation's), over HTTP and gRPC."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from tests.serverproc import ServerProcess

TWO_STRINGS = """\
name: "two_strings"
backend: "identity"
max_batch_size: 0
input [
  { name: "INPUT0", data_type: TYPE_STRING, dims: [ 1, -1 ] },
  { name: "INPUT1", data_type: TYPE_STRING, dims: [ 1, -1 ] }
]
output [
  { name: "OUTPUT0", data_type: TYPE_STRING, dims: [ 1, -1 ] },
  { name: "OUTPUT1", data_type: TYPE_STRING, dims: [ 1, -1 ] }
]
"""

INT32_PAIR = """\
name: "int32_pair"
backend: "identity"
max_batch_size: 0
input [ { name: "INPUT0", data_type: TYPE_INT32, dims: [ 2 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_INT32, dims: [ 2 ] } ]
"""

CLIENTS = (httpclient, grpcclient)


@pytest.fixture(scope="module")
def qa_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("qa_inputs")
    models = root / "models"
    for name, config in (("two_strings", TWO_STRINGS), ("int32_pair", INT32_PAIR)):
        (models / name / "1").mkdir(parents=True)
        (models / name / "config.pbtxt").write_text(config)
    with ServerProcess(models, "--allow-client-shm=true", log_path=root / "server.log") as proc:
        yield proc


def _strings(module: Any, count: int, claimed: int) -> list[Any]:
    """Both inputs holding `count` elements while their shape claims `claimed`."""
    array = np.array([str(i).encode() for i in range(count)], dtype=np.object_).reshape(1, count)
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        tensor = module.InferInput(name, [1, count], "BYTES")
        if module is httpclient:
            tensor.set_data_from_numpy(array, binary_data=True)
        else:
            tensor.set_data_from_numpy(array)
        tensor.set_shape([1, claimed])  # the client's own check is passed by
        inputs.append(tensor)
    return inputs


def _refusal(server: ServerProcess, module: Any, model: str, inputs: list[Any]) -> str:
    client = server.client(module)
    try:
        with pytest.raises(InferenceServerException) as info:
            client.infer(model, inputs)
    finally:
        client.close()
    status = str(info.value.status())
    assert status in ("400", "StatusCode.INVALID_ARGUMENT"), status
    return str(info.value)


@pytest.mark.parametrize("module", CLIENTS, ids=("http", "grpc"))
def test_bytes_elements_short_of_the_shape_in_tritons_words(
    qa_server: ServerProcess, module: Any
) -> None:
    message = _refusal(qa_server, module, "two_strings", _strings(module, 14, 16))
    assert (
        "[request id: <id_unknown>] expected 16 string elements for inference input 'INPUT0' "
        "for model 'two_strings', got 14"
    ) in message


@pytest.mark.parametrize("module", CLIENTS, ids=("http", "grpc"))
def test_bytes_elements_past_the_shape_in_tritons_words(
    qa_server: ServerProcess, module: Any
) -> None:
    message = _refusal(qa_server, module, "two_strings", _strings(module, 18, 16))
    assert (
        "[request id: <id_unknown>] unexpected number of string elements 17 for inference "
        "input 'INPUT0' for model 'two_strings', expecting 16"
    ) in message


@pytest.mark.parametrize("module", CLIENTS, ids=("http", "grpc"))
def test_bytes_elements_that_fill_the_shape_are_served(
    qa_server: ServerProcess, module: Any
) -> None:
    client = qa_server.client(module)
    try:
        result = client.infer("two_strings", _strings(module, 16, 16))
    finally:
        client.close()
    assert result.as_numpy("OUTPUT1").tolist() == [[str(i).encode() for i in range(16)]]


@pytest.mark.parametrize("module", CLIENTS, ids=("http", "grpc"))
def test_a_shared_memory_input_of_the_wrong_size_in_tritons_words(
    qa_server: ServerProcess, module: Any
) -> None:
    region, key = f"qa_in_{module.__name__[-4:]}", f"/edge_qa_inputs_{os.getpid()}"
    handle = shm.create_shared_memory_region(region, key, 4)
    client = qa_server.client(module)
    try:
        shm.set_shared_memory_region(handle, [np.array([7], dtype=np.int32)])
        client.register_system_shared_memory(region, key, 4)
        tensor = module.InferInput("INPUT0", [2], "INT32")
        tensor.set_shared_memory(region, 4)
        with pytest.raises(InferenceServerException) as info:
            client.infer("int32_pair", [tensor])
        assert (
            "[request id: <id_unknown>] input byte size mismatch for input 'INPUT0' for model "
            "'int32_pair'. Expected 8, got 4"
        ) in str(info.value)
    finally:
        client.unregister_system_shared_memory(region)
        client.close()
        shm.destroy_shared_memory_region(handle)
