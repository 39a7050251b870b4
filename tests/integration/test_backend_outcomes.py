"""One outcome mapping for every scheduler: a backend error that means "bad input" is 400 /
INVALID_ARGUMENT whether the model is scheduled directly, with dynamic batching, by the sequence
batcher or as an ensemble step; a good request next to it still succeeds.

ONNX string tensors hold UTF-8, so the ONNX Runtime backend rejects non-UTF-8 BYTES items as
the request's fault (InputRejected), after the server has validated and scheduled them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto
from tritonclient.utils import InferenceServerException

from configs.generate import identity_model, save

STRING_IO = """
input [ { name: "INPUT0" data_type: TYPE_STRING dims: [ 2 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_STRING dims: [ 2 ] } ]
"""

CONFIGS = {
    "strings_direct": 'backend: "onnxruntime" max_batch_size: 8' + STRING_IO,
    "strings_dynamic": 'backend: "onnxruntime" max_batch_size: 8'
    + STRING_IO
    + "dynamic_batching { max_queue_delay_microseconds: 1000 }",
    "strings_sequence": 'backend: "onnxruntime" max_batch_size: 8'
    + STRING_IO
    + "sequence_batching { max_sequence_idle_microseconds: 5000000 }",
    "strings_ensemble": 'platform: "ensemble" max_batch_size: 8'
    + STRING_IO
    + """
ensemble_scheduling { step [ {
  model_name: "strings_direct" model_version: -1
  input_map { key: "INPUT0" value: "INPUT0" }
  output_map { key: "OUTPUT0" value: "OUTPUT0" }
} ] }
""",
}

BAD = np.array([[b"ok", b"\xff\xfe"]], dtype=np.object_)
GOOD = np.array([[b"ok", b"fine"]], dtype=np.object_)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from tests.serverproc import ServerProcess

    root = tmp_path_factory.mktemp("outcomes")
    for name, config in CONFIGS.items():
        (root / name).mkdir()
        (root / name / "config.pbtxt").write_text(f'name: "{name}"\n{config}')
        if "ensemble" not in name:
            save(identity_model(TensorProto.STRING, ["N", 2]), root / name / "1" / "model.onnx")
        else:
            (root / name / "1").mkdir()
    proc = ServerProcess(root, log_path=Path(root / "server.log"))
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()


def _sequence_args(model: str, sequence_id: int) -> dict[str, Any]:
    if "sequence" not in model:
        return {}
    return {"sequence_id": sequence_id, "sequence_start": True, "sequence_end": True}


@pytest.mark.parametrize("model", list(CONFIGS))
def test_bad_input_found_by_the_backend_is_400_over_http(server: Any, model: str) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    infer = _http_infer(client, model)
    with pytest.raises(InferenceServerException) as info:
        infer(BAD, 1)
    assert info.value.status() == "400", info.value.message()
    assert "input 'INPUT0' element 1 is not valid UTF-8" in info.value.message()
    out = infer(GOOD, 2)  # the model still serves
    assert out.as_numpy("OUTPUT0").tolist() == GOOD.tolist()


@pytest.mark.parametrize("model", list(CONFIGS))
def test_bad_input_found_by_the_backend_is_invalid_argument_over_grpc(
    server: Any, model: str
) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)

    def infer(data: np.ndarray, sequence_id: int) -> Any:
        inp = grpcclient.InferInput("INPUT0", list(data.shape), "BYTES")
        inp.set_data_from_numpy(data)
        return client.infer(model, [inp], **_sequence_args(model, sequence_id))

    with pytest.raises(InferenceServerException) as info:
        infer(BAD, 3)
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT", info.value.message()
    assert "input 'INPUT0' element 1 is not valid UTF-8" in info.value.message()
    assert infer(GOOD, 4).as_numpy("OUTPUT0").tolist() == GOOD.tolist()


def _http_infer(
    client: httpclient.InferenceServerClient, model: str
) -> Callable[[np.ndarray, int], Any]:
    def infer(data: np.ndarray, sequence_id: int) -> Any:
        inp = httpclient.InferInput("INPUT0", list(data.shape), "BYTES")
        inp.set_data_from_numpy(data, binary_data=True)
        return client.infer(model, [inp], **_sequence_args(model, sequence_id))

    return infer


PYTHON_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            code = int(pb_utils.get_input_tensor_by_name(request, "CODE").as_numpy()[0])
            if code < 0:
                out = pb_utils.Tensor("OUT", np.array([code], dtype=np.int32))
                responses.append(pb_utils.InferenceResponse([out]))
            else:
                error = pb_utils.TritonError(f"the model says no ({code})", code)
                responses.append(pb_utils.InferenceResponse([], error=error))
        return responses
"""

PYTHON_CONFIG = """
name: "says_no" backend: "python" max_batch_size: 0
input [ { name: "CODE" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""

# pb_utils.TritonError code -> (HTTP status, gRPC status) the client gets, as tritonserver maps.
CODES = {
    1: ("500", "StatusCode.INTERNAL"),  # INTERNAL
    3: ("400", "StatusCode.INVALID_ARGUMENT"),  # INVALID_ARG
    4: ("503", "StatusCode.UNAVAILABLE"),  # UNAVAILABLE
    5: ("501", "StatusCode.UNIMPLEMENTED"),  # UNSUPPORTED
}


@pytest.fixture(scope="module")
def python_server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from tests.serverproc import ServerProcess

    root = tmp_path_factory.mktemp("says_no")
    (root / "says_no" / "1").mkdir(parents=True)
    (root / "says_no" / "config.pbtxt").write_text(PYTHON_CONFIG)
    (root / "says_no" / "1" / "model.py").write_text(PYTHON_MODEL)
    proc = ServerProcess(root, log_path=Path(root / "server.log"))
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()


@pytest.mark.parametrize("code", sorted(CODES))
def test_a_python_models_error_code_chooses_the_clients_status(
    python_server: Any, code: int
) -> None:
    http_status, grpc_status = CODES[code]
    data = np.array([code], dtype=np.int32)
    http = httpclient.InferenceServerClient(python_server.http_url)
    inp = httpclient.InferInput("CODE", [1], "INT32")
    inp.set_data_from_numpy(data)
    with pytest.raises(InferenceServerException) as info:
        http.infer("says_no", [inp])
    assert info.value.status() == http_status
    assert f"the model says no ({code})" in info.value.message()
    grpc = grpcclient.InferenceServerClient(python_server.grpc_url)
    ginp = grpcclient.InferInput("CODE", [1], "INT32")
    ginp.set_data_from_numpy(data)
    with pytest.raises(InferenceServerException) as ginfo:
        grpc.infer("says_no", [ginp])
    assert ginfo.value.status() == grpc_status
    ok = np.array([-1], dtype=np.int32)  # the model still answers
    inp.set_data_from_numpy(ok)
    assert http.infer("says_no", [inp]).as_numpy("OUT").tolist() == [-1]
