"""ModelStreamInfer bounds (issue 17, item 3): a stream whose client does not read its responses
stops reading requests (HTTP/2 flow control then holds the client back) instead of growing the
server; a request message that does not parse ends the stream with INVALID_ARGUMENT after the
requests before it are answered."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from onnx import TensorProto

from appliance.common.protocol import service_pb2 as pb
from appliance.common.protocol import service_pb2_grpc
from appliance.frontends.grpc.server import STREAM_MAX_IN_FLIGHT
from configs.generate import identity_model, save
from tests.integration.streams import Counted
from tests.serverproc import ServerProcess

IDENTITY_CONFIG = """\
name: "identity_fp32"
backend: "onnxruntime"
max_batch_size: 8
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
"""


@pytest.fixture(scope="module")
def identity_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root: Path = tmp_path_factory.mktemp("models")
    save(identity_model(TensorProto.FLOAT, ["batch", "n"]), root / "identity_fp32/1/model.onnx")
    (root / "identity_fp32" / "config.pbtxt").write_text(IDENTITY_CONFIG)
    proc = ServerProcess(root, log_path=tmp_path_factory.mktemp("logs") / "server.log")
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()


def _request(elements: int, request_id: str = "") -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name="identity_fp32", id=request_id)
    tensor = message.inputs.add(name="INPUT0", datatype="FP32")
    tensor.shape.extend([1, elements])
    message.raw_input_contents.append(np.ones(elements, np.float32).tobytes())
    return message


def test_a_stream_whose_client_does_not_read_stops_reading_requests(
    identity_server: ServerProcess,
) -> None:
    """The client sends 2,000 requests of 64 KiB and reads nothing: the server must stop
    taking requests (HTTP/2 flow control then holds the client back), not read all 2,000 and
    queue their responses. Once the client reads, every request is answered."""
    count, elements = 2000, 16 * 1024
    requests = Counted(_request(elements, str(i)) for i in range(count))

    with grpc.insecure_channel(identity_server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        responses = stub.ModelStreamInfer(iter(requests), timeout=300)
        stalled_at = requests.wait_until_stalled(count)
        # Before the bound the server read all 2,000 within a second. With it: the requests in
        # flight and the answered ones waiting (2 x STREAM_MAX_IN_FLIGHT), plus what the two
        # HTTP/2 flow-control windows hold (measured: 256 in all).
        assert stalled_at < count // 2, f"the server read {stalled_at} of {count} requests"
        assert stalled_at >= STREAM_MAX_IN_FLIGHT

        ids = []
        for response in responses:
            assert response.error_message == ""
            assert len(response.infer_response.raw_output_contents[0]) == elements * 4
            ids.append(response.infer_response.id)
    assert sorted(ids, key=int) == [str(i) for i in range(count)]


def test_a_malformed_stream_message_ends_the_stream_with_invalid_argument(
    identity_server: ServerProcess,
) -> None:
    """Before: the stream ended with OK and no answer, not even to the requests before it."""
    with grpc.insecure_channel(identity_server.grpc_url) as channel:
        stream = channel.stream_stream(
            "/inference.GRPCInferenceService/ModelStreamInfer",
            response_deserializer=pb.ModelStreamInferResponse.FromString,
        )
        messages = [_request(4, "good").SerializeToString(), b"\xff\xff\xff"]
        answers = []
        responses = stream(iter(messages), timeout=60)
        with pytest.raises(grpc.RpcError) as info:
            answers.extend(responses)
    assert [a.infer_response.id for a in answers] == ["good"]
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "ModelStreamInfer: a request message does not parse" in str(info.value.details())
