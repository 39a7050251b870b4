"""The gRPC calls in flight are bounded server-wide (issue 17, item 4):
--grpc-max-concurrent-rpcs answers UNAVAILABLE at once, before the request is read, naming the
flag; health calls are never refused; a cancelled call gives its slot back. The requests in
flight on one stream: test_grpc_stream.py; the memory after a burst: test_grpc_memory.py."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import numpy as np
import pytest

from appliance.common.protocol import service_pb2 as pb
from appliance.common.protocol import service_pb2_grpc
from tests.serverproc import ServerProcess

# A Python model whose executions leave a file `started-*` in its folder, then wait until the
# file `open` appears there.
GATE = """\
import os
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.folder = args["model_repository"]
        self.gate = os.path.join(self.folder, "open")

    def execute(self, requests):
        name = f"started-{os.getpid()}-{time.monotonic_ns()}"
        open(os.path.join(self.folder, name), "w").close()
        deadline = time.monotonic() + 120
        while not os.path.exists(self.gate) and time.monotonic() < deadline:
            time.sleep(0.01)
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
            for r in requests]
"""
GATE_CONFIG = """\
name: "gate"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ 4 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 4 ] } ]
instance_group [ { count: 2, kind: KIND_CPU } ]
"""


@pytest.fixture
def gated(tmp_path: Path, start_server) -> tuple[ServerProcess, Path]:  # type: ignore[no-untyped-def]
    root = tmp_path / "models"
    (root / "gate" / "1").mkdir(parents=True)
    (root / "gate" / "1" / "model.py").write_text(GATE)
    (root / "gate" / "config.pbtxt").write_text(GATE_CONFIG)
    proc = start_server(root, "--grpc-max-concurrent-rpcs=2", "--max-queue-wait-ms=0")
    return proc, root / "gate" / "open"


def _wait_started(gate: Path, executions: int) -> None:
    """Until the gate model has `executions` executions waiting (so as many calls in flight)."""
    deadline = time.monotonic() + 60  # two Python model processes on a loaded 2-core machine
    while len(list(gate.parent.glob("started-*"))) < executions:
        assert time.monotonic() < deadline, f"{executions} executions never started"
        time.sleep(0.05)


def _gate_request() -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name="gate")
    tensor = message.inputs.add(name="INPUT0", datatype="FP32")
    tensor.shape.extend([4])
    message.raw_input_contents.append(np.ones(4, np.float32).tobytes())
    return message


def test_calls_past_the_bound_are_refused_at_once_and_health_is_not(gated) -> None:  # type: ignore[no-untyped-def]
    proc, gate = gated
    with grpc.insecure_channel(proc.grpc_url) as channel:
        grpc.channel_ready_future(channel).result(timeout=60)
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        held = [stub.ModelInfer.future(_gate_request(), timeout=120) for _ in range(2)]
        # Both in the model, so both admitted: a third call of any kind but health is refused.
        # (Probing with a counted call before would race the second one for the last slot.)
        _wait_started(gate, 2)
        with pytest.raises(grpc.RpcError) as info:
            stub.ServerMetadata(pb.ServerMetadataRequest(), timeout=10)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert info.value.details() == (
            "server busy: 2 gRPC calls in flight, the most --grpc-max-concurrent-rpcs allows "
            "(2); retry later"
        )

        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as info:
            stub.ModelInfer(_gate_request(), timeout=60)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert time.monotonic() - started < 5.0  # at once, not after the held calls
        with pytest.raises(grpc.RpcError) as info:
            list(stub.ModelStreamInfer(iter([_gate_request()]), timeout=60))
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE

        assert stub.ServerLive(pb.ServerLiveRequest(), timeout=10).live
        assert stub.ServerReady(pb.ServerReadyRequest(), timeout=10).ready
        assert stub.ModelReady(pb.ModelReadyRequest(name="gate"), timeout=10).ready
        assert all(not call.done() for call in held)

        gate.touch()
        for call in held:
            assert len(call.result().raw_output_contents[0]) == 16
        # Slots are given back: the bound admits calls again (streams too).
        stub.ServerMetadata(pb.ServerMetadataRequest(), timeout=10)
        answers = list(stub.ModelStreamInfer(iter([_gate_request()] * 3), timeout=60))
        assert [a.error_message for a in answers] == ["", "", ""]


def test_a_call_cancelled_in_the_model_gives_its_slot_back_at_once(gated) -> None:  # type: ignore[no-untyped-def]
    """The slot goes with the call, not with the model's execution: the two executions still
    wait at the gate after their callers gave up, and calls are admitted again."""
    proc, gate = gated
    with grpc.insecure_channel(proc.grpc_url) as channel:
        grpc.channel_ready_future(channel).result(timeout=60)
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        held = [stub.ModelInfer.future(_gate_request(), timeout=120) for _ in range(2)]
        _wait_started(gate, 2)
        for call in held:
            call.cancel()
        deadline = time.monotonic() + 30
        while True:
            try:
                stub.ServerMetadata(pb.ServerMetadataRequest(), timeout=10)
                break
            except grpc.RpcError as exc:  # the server may not have seen the cancel yet
                code = exc.code()
            assert code == grpc.StatusCode.UNAVAILABLE
            assert time.monotonic() < deadline, "the cancelled calls kept their slots"
            time.sleep(0.1)
        assert not gate.exists()  # the executions are still in the model
        later = [stub.ModelInfer.future(_gate_request(), timeout=120) for _ in range(2)]
        gate.touch()
        assert all(len(call.result().raw_output_contents[0]) == 16 for call in later)
