"""The inference service with no transport: a real runtime over a real ONNX model, called
directly the way both front ends call it (MLServer's data-plane tests are the model)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto

from appliance.common.errors import InvalidInput, ModelNotFound, ServerUnavailable
from appliance.common.settings import ServerSettings
from appliance.common.types import InferRequest, RequestedOutput, Tensor
from appliance.runtime.models import ModelRuntime
from appliance.runtime.settings import RuntimeSettings
from appliance.services.inference import InferenceService
from appliance.services.validation import validate
from configs.generate import SIMPLE_CONFIG, identity_model, save, simple_model

ENSEMBLE = """
name: "double" platform: "ensemble" max_batch_size: 8
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 16 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 16 ] } ]
ensemble_scheduling { step [ {
  model_name: "simple" model_version: -1
  input_map [ { key: "INPUT0" value: "IN" }, { key: "INPUT1" value: "IN" } ]
  output_map { key: "OUTPUT0" value: "OUT" }
} ] }
"""


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[InferenceService]:
    save(simple_model(), tmp_path / "simple" / "1" / "model.onnx")
    (tmp_path / "simple" / "config.pbtxt").write_text(SIMPLE_CONFIG)
    (tmp_path / "double" / "1").mkdir(parents=True)
    (tmp_path / "double" / "config.pbtxt").write_text(ENSEMBLE)
    save(identity_model(TensorProto.FLOAT, ["N", 4]), tmp_path / "plain" / "1" / "model.onnx")
    runtime = ModelRuntime(
        RuntimeSettings.from_server(ServerSettings(model_repositories=(tmp_path,)))
    )
    service = InferenceService(runtime)
    await runtime.load_all()
    try:
        yield service
    finally:
        await runtime.stop(5)


def _ints(name: str, values: np.ndarray) -> Tensor:
    return Tensor(name, "INT32", tuple(values.shape), values)


async def test_infer_returns_the_model_outputs(service: InferenceService) -> None:
    a = np.arange(32, dtype=np.int32).reshape(2, 16)
    b = np.ones((2, 16), dtype=np.int32)
    response = await service.infer(
        InferRequest("simple", inputs=[_ints("INPUT0", a), _ints("INPUT1", b)], id="r1")
    )
    assert (response.model_name, response.model_version, response.id) == ("simple", "1", "r1")
    outputs = {t.name: t for t in response.outputs}
    np.testing.assert_array_equal(outputs["OUTPUT0"].data, a + b)
    np.testing.assert_array_equal(outputs["OUTPUT1"].data, a - b)
    assert outputs["OUTPUT0"].datatype == "INT32"
    assert outputs["OUTPUT0"].shape == (2, 16)


async def test_only_the_requested_outputs_come_back(service: InferenceService) -> None:
    a = np.zeros((1, 16), dtype=np.int32)
    request = InferRequest(
        "simple",
        inputs=[_ints("INPUT0", a), _ints("INPUT1", a)],
        outputs=[RequestedOutput("OUTPUT1")],
    )
    response = await service.infer(request)
    assert [t.name for t in response.outputs] == ["OUTPUT1"]


async def test_an_ensemble_runs_through_its_scheduler(service: InferenceService) -> None:
    x = np.arange(16, dtype=np.int32).reshape(1, 16)
    response = await service.infer(InferRequest("double", inputs=[_ints("IN", x)]))
    np.testing.assert_array_equal(response.outputs[0].data, 2 * x)
    statistics = service.runtime.get("simple").stats
    assert statistics.success.count == 1  # the step is an ordinary request to its model


async def test_concurrent_requests_are_answered_each_with_its_own_rows(
    service: InferenceService,
) -> None:
    async def one(i: int) -> np.ndarray:
        x = np.full((1, 4), i, dtype=np.float32)
        response = await service.infer(
            InferRequest("plain", inputs=[Tensor("INPUT0", "FP32", (1, 4), x)])
        )
        return response.outputs[0].data

    results = await asyncio.gather(*(one(i) for i in range(20)))
    for i, data in enumerate(results):
        np.testing.assert_array_equal(data, np.full((1, 4), i, dtype=np.float32))


async def test_errors_are_typed_and_name_model_and_input(service: InferenceService) -> None:
    with pytest.raises(ModelNotFound, match="'nope' is not found"):
        await service.infer(InferRequest("nope"))
    wrong = np.zeros((1, 15), dtype=np.int32)
    with pytest.raises(InvalidInput, match="unexpected shape for input 'INPUT0' for model"):
        await service.infer(
            InferRequest("simple", inputs=[_ints("INPUT0", wrong), _ints("INPUT1", wrong)])
        )


async def test_after_stop_requests_are_refused_as_unavailable(tmp_path: Path) -> None:
    save(simple_model(), tmp_path / "simple" / "1" / "model.onnx")
    (tmp_path / "simple" / "config.pbtxt").write_text(SIMPLE_CONFIG)
    runtime = ModelRuntime(
        RuntimeSettings.from_server(ServerSettings(model_repositories=(tmp_path,)))
    )
    service = InferenceService(runtime)
    await runtime.load("simple")
    served = runtime.get("simple")
    a = np.zeros((1, 16), dtype=np.int32)
    request = InferRequest("simple", inputs=[_ints("INPUT0", a), _ints("INPUT1", a)])
    job = validate(served, request, service.limits)
    assert await runtime.stop(1) == []  # nothing was in flight: nothing to report
    with pytest.raises(ModelNotFound, match="'simple' has no available versions"):
        await service.infer(request)
    with pytest.raises(ServerUnavailable, match="model 'simple' version 1 is unloading"):
        await served.scheduler.submit(job)  # a request that looked the version up before
