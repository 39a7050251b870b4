"""A Python model's BLS call runs on the calling thread when the called model's thread lane
takes it (an idle instance, nothing queued: `InferenceService.infer_arrays_here`), as a gRPC
or embedded request does: no hop to the event loop and back. Shown with the loop held busy:
the answer comes while nothing runs on the loop."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from appliance import tritonserver
from appliance.scheduling.batcher import WARMUP_EXECUTIONS
from configs.generate import SIMPLE_CONFIG, save, simple_model
from tests.integration.loop_hold import loop_held

BLS = """\
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            call = pb_utils.InferenceRequest(
                model_name="simple",
                requested_output_names=["OUTPUT0"],
                inputs=[
                    pb_utils.get_input_tensor_by_name(request, "INPUT0"),
                    pb_utils.get_input_tensor_by_name(request, "INPUT1"),
                ],
            )
            result = call.exec()
            if result.has_error():
                raise pb_utils.TritonModelException(result.error().message())
            total = pb_utils.get_output_tensor_by_name(result, "OUTPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", total)]))
        return responses
"""
BLS_CONFIG = """\
name: "bls"
backend: "python"
max_batch_size: 8
input [
  { name: "INPUT0", data_type: TYPE_INT32, dims: [ 16 ] },
  { name: "INPUT1", data_type: TYPE_INT32, dims: [ 16 ] }
]
output [ { name: "OUTPUT0", data_type: TYPE_INT32, dims: [ 16 ] } ]
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tritonserver.Server]:
    root = tmp_path_factory.mktemp("bls-lane-models")
    save(simple_model(), root / "simple" / "1" / "model.onnx")
    (root / "simple" / "config.pbtxt").write_text(SIMPLE_CONFIG)
    (root / "bls" / "1").mkdir(parents=True)
    (root / "bls" / "1" / "model.py").write_text(BLS)
    (root / "bls" / "config.pbtxt").write_text(BLS_CONFIG)
    options = tritonserver.Options(
        model_repository=str(root),
        server_args=["--model-store-dir", str(tmp_path_factory.mktemp("bls-lane-store"))],
    )
    started = tritonserver.Server(options).start(wait_until_ready=True)
    yield started
    started.stop()


def _infer(server: tritonserver.Server, i: int) -> np.ndarray[Any, Any]:
    inputs = {
        "INPUT0": np.full((1, 16), i, np.int32),
        "INPUT1": np.arange(16, dtype=np.int32).reshape(1, 16),
    }
    (response,) = server.model("bls").infer(inputs=inputs)
    return np.from_dlpack(response.outputs["OUTPUT0"])


def _successes(server: tritonserver.Server, name: str) -> int:
    running = server._require()
    return running.appliance.runtime.get(name, "").stats.success.count


def test_a_bls_call_is_answered_while_the_loop_is_busy(server: tritonserver.Server) -> None:
    expected = 7 + np.arange(16, dtype=np.int32).reshape(1, 16)
    # A model in another process runs in the lane once its executions are known to be short
    # (scheduling/batcher.py `_brief`).
    for _ in range(WARMUP_EXECUTIONS + 2):
        np.testing.assert_array_equal(_infer(server, 7), expected)
    before = _successes(server, "simple")
    with loop_held(server) as released:
        answer = _infer(server, 3)
        answered_while_held = not released.is_set()
    assert answered_while_held, "the BLS call waited for the event loop"
    np.testing.assert_array_equal(answer, 3 + np.arange(16, dtype=np.int32).reshape(1, 16))
    # The call went through the called model's scheduler: counted in its statistics.
    assert _successes(server, "simple") == before + 1
