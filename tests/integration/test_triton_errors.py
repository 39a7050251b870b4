"""Error codes and texts as tritonserver's for the same requests, over HTTP and gRPC."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.serverproc import ServerProcess

MODULES = [httpclient, grpcclient]
INVALID = {httpclient: "400", grpcclient: "StatusCode.INVALID_ARGUMENT"}
NOT_FOUND = {httpclient: "404", grpcclient: "StatusCode.NOT_FOUND"}


def _simple_inputs(module: Any) -> list[Any]:
    inputs = [module.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(np.zeros((1, 16), np.int32))
    return inputs


@pytest.mark.parametrize("module", MODULES)
@pytest.mark.parametrize("call", ["infer", "metadata", "config"])
def test_an_unknown_model_is_not_found(server: ServerProcess, module: Any, call: str) -> None:
    """tritonserver (measured, 2.51, and its current core): NOT_FOUND (404) for a model name
    it does not know; INVALID_ARG only with --model-namespacing."""
    client = server.client(module)
    actions = {
        "infer": lambda: client.infer("nope", _simple_inputs(module)),
        "metadata": lambda: client.get_model_metadata("nope"),
        "config": lambda: client.get_model_config("nope"),
    }
    with pytest.raises(InferenceServerException) as err:
        actions[call]()
    assert err.value.message() == "Request for unknown model: 'nope' is not found"
    assert err.value.status() == NOT_FOUND[module]


@pytest.mark.parametrize("module", MODULES)
def test_statistics_of_an_unknown_model_or_version(server: ServerProcess, module: Any) -> None:
    """tritonserver's statistics: INVALID_ARG, its own words for a model and for a version."""
    client = server.client(module)
    with pytest.raises(InferenceServerException) as err:
        client.get_inference_statistics("nope")
    assert err.value.message() == "requested model 'nope' is not available"
    assert err.value.status() == INVALID[module]
    with pytest.raises(InferenceServerException) as err:
        client.get_inference_statistics("simple", "7")
    assert err.value.message() == "requested model version is not available for model 'simple'"
    assert err.value.status() == INVALID[module]


@pytest.mark.parametrize("module", MODULES)
def test_an_unknown_version_of_a_known_model_is_not_found(
    server: ServerProcess, module: Any
) -> None:
    with pytest.raises(InferenceServerException) as err:
        server.client(module).infer("simple", _simple_inputs(module), model_version="7")
    assert err.value.message() == "Request for unknown model: 'simple' version 7 is not found"
    assert err.value.status() == NOT_FOUND[module]


@pytest.mark.parametrize("module", MODULES)
def test_a_string_sequence_id_for_an_integer_corrid(server: ServerProcess, module: Any) -> None:
    """running_sum's CORRID control is TYPE_INT64: a string id is INVALID_ARG (was a 500)."""
    tensor = module.InferInput("INPUT", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[1]], dtype=np.int32))
    with pytest.raises(InferenceServerException) as err:
        server.client(module).infer(
            "running_sum", [tensor], sequence_id="cam-1", sequence_start=True
        )
    assert err.value.message() == (
        "sequence batching control 'CORRID' data-type is 'BYTES', but model 'running_sum' "
        "expects 'INT64'"
    )
    assert err.value.status() == INVALID[module]


@pytest.mark.parametrize("module", MODULES)
def test_a_sequence_request_with_a_batch_of_two(server: ServerProcess, module: Any) -> None:
    tensor = module.InferInput("INPUT", [2, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[1], [2]], dtype=np.int32))
    with pytest.raises(InferenceServerException) as err:
        server.client(module).infer("running_sum", [tensor], sequence_id=5, sequence_start=True)
    assert err.value.message() == (
        "inference request to model 'running_sum' must specify batch-size 1 due to "
        "requirements of sequence batcher"
    )
    assert err.value.status() == INVALID[module]


@pytest.mark.parametrize("module", MODULES)
def test_server_metadata_lists_the_extensions_served(server: ServerProcess, module: Any) -> None:
    meta = server.client(module).get_server_metadata()
    names = meta["extensions"] if module is httpclient else list(meta.extensions)
    assert {
        "classification",
        "sequence",
        "model_repository",
        "model_repository(unload_dependents)",
        "schedule_policy",
        "model_configuration",
        "system_shared_memory",
        "binary_tensor_data",
        "parameters",
        "statistics",
        "trace",
        "logging",
    } <= set(names)
