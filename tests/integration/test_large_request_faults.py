"""Large requests reuse the server's freed heap (appliance/ops/memory.py, hold_freed_heap): a
588 KiB gRPC input to a Python model, request after request, faults next to no fresh pages into
the server. With glibc's sliding thresholds each such request, one at a time, faulted about 270
pages in (the message, its decoded bytes, the copy for the model: 147 pages each), at two at a
time 76-93 (issue 34's SqueezeNet point); with them held, 2-5. The heap trimmer still gives the
memory back when the load stops (tests/integration/test_grpc_memory.py)."""

from __future__ import annotations

import ctypes.util
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.serverproc import ServerProcess

pytestmark = pytest.mark.skipif(
    "libc.so" not in (ctypes.util.find_library("c") or ""), reason="glibc's malloc only"
)

MODEL = """\
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "IMAGE").as_numpy()
            total = np.array([data.sum(dtype=np.float64)], dtype=np.float64)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("SUM", total)]))
        return responses
"""
CONFIG = """\
name: "image_sum"
backend: "python"
max_batch_size: 0
input [ { name: "IMAGE", data_type: TYPE_FP32, dims: [ 1, 3, 224, 224 ] } ]
output [ { name: "SUM", data_type: TYPE_FP64, dims: [ 1 ] } ]
"""
WARM_UP = 20
COUNTED = 60
MAX_FAULTS_PER_REQUEST = 20


def minor_faults(pid: int) -> int:
    """minflt of the process (all its threads), from /proc."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return int(fields[7])


def test_large_grpc_inputs_fault_no_fresh_pages_into_the_server(tmp_path: Path) -> None:
    (tmp_path / "models" / "image_sum" / "1").mkdir(parents=True)
    (tmp_path / "models" / "image_sum" / "1" / "model.py").write_text(MODEL)
    (tmp_path / "models" / "image_sum" / "config.pbtxt").write_text(CONFIG)
    rng = np.random.default_rng(0)
    images = [rng.random((1, 3, 224, 224), dtype=np.float32) for _ in range(4)]
    with ServerProcess(tmp_path / "models", log_path=tmp_path / "server.log") as server:
        client = server.client(grpcclient)
        tensor = grpcclient.InferInput("IMAGE", [1, 3, 224, 224], "FP32")

        def infer(index: int) -> None:
            image = images[index % len(images)]
            tensor.set_data_from_numpy(image)
            answer = client.infer("image_sum", [tensor]).as_numpy("SUM")
            assert answer[0] == pytest.approx(image.sum(dtype=np.float64), rel=1e-9)

        for index in range(WARM_UP):
            infer(index)
        before = minor_faults(server.proc.pid)
        for index in range(COUNTED):
            infer(index)
        faults = minor_faults(server.proc.pid) - before
    assert faults / COUNTED < MAX_FAULTS_PER_REQUEST, f"{faults} page faults in {COUNTED} requests"
