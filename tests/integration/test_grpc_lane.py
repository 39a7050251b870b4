"""gRPC ModelInfer on its handler thread (issue 20): the synchronous gRPC server runs a request
on the model's idle instance from its own thread (the scheduler's thread lane), and hands it to
the event loop's queue when the instance is busy. Statistics, failures, cancellation and the
shutdown drain behave as on the loop (the lane's decisions: tests/unit/test_grpc_lane.py)."""

from __future__ import annotations

import queue
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto
from tritonclient.utils import InferenceServerException

from appliance.common.protocol import service_pb2 as pb
from appliance.common.protocol import service_pb2_grpc
from configs.generate import identity_model, save
from tests.integration.models import slow_model
from tests.serverproc import ServerProcess

IDENTITY_CONFIG = """\
name: "identity"
backend: "onnxruntime"
max_batch_size: 8
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
"""
# One instance of a chain of 1024x1024 MatMuls: a few hundred ms per request on one core.
LONG_CONFIG = """\
name: "long"
platform: "onnxruntime_onnx"
max_batch_size: 1
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ 1024 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 1024 ] } ]
instance_group [ { count: 1, kind: KIND_CPU } ]
"""


def _repository(root: Path) -> Path:
    save(identity_model(TensorProto.FLOAT, ["batch", "n"]), root / "identity/1/model.onnx")
    (root / "identity" / "config.pbtxt").write_text(IDENTITY_CONFIG)
    save(slow_model(3000), root / "long" / "1" / "model.onnx")
    (root / "long" / "config.pbtxt").write_text(LONG_CONFIG)
    return root


@pytest.fixture(scope="module")
def lane_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _repository(tmp_path_factory.mktemp("lane"))


@pytest.fixture(scope="module")
def lane_server(lane_repository: Path) -> Iterator[ServerProcess]:
    proc = ServerProcess(lane_repository, log_path=lane_repository / "server.log")
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()


def _stats(proc: ServerProcess, model: str) -> Any:
    client = grpcclient.InferenceServerClient(proc.grpc_url)
    return client.get_inference_statistics(model).model_stats[0]


def _grpc_input(model: str) -> grpcclient.InferInput:
    shape = [1, 16] if model == "identity" else [1, 1024]
    tensor = grpcclient.InferInput("INPUT0", shape, "FP32")
    tensor.set_data_from_numpy(np.full(shape, 0.5, np.float32))
    return tensor


def test_sequential_grpc_requests_run_on_their_handler_thread(lane_server: ServerProcess) -> None:
    """One client at a time: the instance is always idle and nothing is queued, so every request
    runs on its handler thread: counted as executed with no time in the queue (a request the
    loop queues first waits some microseconds there)."""
    before = _stats(lane_server, "identity")
    client = grpcclient.InferenceServerClient(lane_server.grpc_url)
    for _ in range(50):
        result = client.infer("identity", [_grpc_input("identity")])
        assert result.as_numpy("OUTPUT0").tolist() == [[0.5] * 16]
    after = _stats(lane_server, "identity")
    queue = after.inference_stats.queue
    assert queue.count - before.inference_stats.queue.count == 50
    assert queue.ns == before.inference_stats.queue.ns  # no wait at all
    assert after.execution_count - before.execution_count == 50


def test_statistics_stay_exact_under_grpc_and_http_load_at_once(
    lane_server: ServerProcess,
) -> None:
    """gRPC handler threads (lane or loop) and HTTP requests (loop) on one model at once: every
    request counted once, as a success, an execution and a queue entry."""
    before = _stats(lane_server, "identity")
    per_client, errors = 60, []

    def grpc_load() -> None:
        client = grpcclient.InferenceServerClient(lane_server.grpc_url)
        try:
            for _ in range(per_client):
                client.infer("identity", [_grpc_input("identity")])
        except Exception as exc:  # reported below, in the test's thread
            errors.append(exc)

    def http_load() -> None:
        client = httpclient.InferenceServerClient(lane_server.http_url)
        tensor = httpclient.InferInput("INPUT0", [1, 16], "FP32")
        tensor.set_data_from_numpy(np.full((1, 16), 0.5, np.float32))
        try:
            for _ in range(per_client):
                client.infer("identity", [tensor])
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=grpc_load) for _ in range(6)]
    threads += [threading.Thread(target=http_load) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors
    total = per_client * len(threads)
    after = _stats(lane_server, "identity")
    assert after.inference_count - before.inference_count == total
    assert after.execution_count - before.execution_count == total  # no dynamic batching
    stats, was = after.inference_stats, before.inference_stats
    assert stats.success.count - was.success.count == total
    assert stats.queue.count - was.queue.count == total
    assert stats.compute_infer.count - was.compute_infer.count == total
    assert stats.fail.count == was.fail.count


def test_a_busy_instance_sends_requests_to_the_queue_and_all_are_answered(
    lane_server: ServerProcess,
) -> None:
    before = _stats(lane_server, "long")
    client = grpcclient.InferenceServerClient(lane_server.grpc_url)
    answers: list[Any] = []
    for _ in range(3):
        client.async_infer(
            "long", [_grpc_input("long")], lambda result, error: answers.append((result, error))
        )
    deadline = time.monotonic() + 60
    while len(answers) < 3:
        assert time.monotonic() < deadline, "not every request was answered"
        time.sleep(0.05)
    for result, error in answers:
        assert error is None
        assert result.as_numpy("OUTPUT0").shape == (1, 1024)
    after = _stats(lane_server, "long")
    assert after.execution_count - before.execution_count == 3
    queue, was = after.inference_stats.queue, before.inference_stats.queue
    assert queue.count - was.count == 3
    assert queue.ns > was.ns  # the ones behind the first waited in the loop's queue


def test_a_request_whose_deadline_passes_in_the_model_is_counted_cancelled(
    lane_server: ServerProcess,
) -> None:
    """The model runs on the handler thread until it ends; the client that gave up gets its
    deadline and the request is counted CANCELED, not a success."""
    before = _stats(lane_server, "long")
    client = grpcclient.InferenceServerClient(lane_server.grpc_url)
    with pytest.raises(InferenceServerException, match="Deadline"):
        client.infer("long", [_grpc_input("long")], client_timeout=0.1)
    deadline = time.monotonic() + 60
    while True:
        after = _stats(lane_server, "long")
        if after.execution_count > before.execution_count:
            break
        assert time.monotonic() < deadline, "the request never ran"
        time.sleep(0.05)
    time.sleep(0.2)
    after = _stats(lane_server, "long")
    assert after.inference_stats.fail.count - before.inference_stats.fail.count == 1
    assert after.inference_stats.success.count == before.inference_stats.success.count
    # The server goes on answering.
    result = client.infer("long", [_grpc_input("long")])
    assert result.as_numpy("OUTPUT0").shape == (1, 1024)


def test_shutdown_lets_a_request_running_on_its_handler_thread_finish(  # type: ignore[no-untyped-def]
    start_server, lane_repository: Path, tmp_path: Path
) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(lane_repository / "long", repo / "long")
    proc = start_server(repo)
    client = grpcclient.InferenceServerClient(proc.grpc_url)
    answers: list[Any] = []
    client.async_infer(
        "long", [_grpc_input("long")], lambda result, error: answers.append((result, error))
    )
    time.sleep(0.05)
    proc.proc.terminate()
    deadline = time.monotonic() + 60
    while not answers:
        assert time.monotonic() < deadline, "the request in flight was never answered"
        time.sleep(0.05)
    result, error = answers[0]
    assert error is None
    assert result.as_numpy("OUTPUT0").shape == (1, 1024)
    assert proc.proc.wait(30) == 0


def test_streams_past_their_bound_are_refused_and_unary_calls_go_on(  # type: ignore[no-untyped-def]
    start_server, lane_repository: Path, tmp_path: Path
) -> None:
    """A stream holds a handler thread for its life: past the call bound less the threads kept
    for unary calls (UNARY_RESERVE; 9 - 8 = 1 stream here) a stream is refused at once with
    RESOURCE_EXHAUSTED instead of taking the threads unary calls need."""
    repo = tmp_path / "repo"
    shutil.copytree(lane_repository / "identity", repo / "identity")
    proc = start_server(repo, "--grpc-max-concurrent-rpcs=9")
    with grpc.insecure_channel(proc.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        held: queue.Queue[pb.ModelInferRequest | None] = queue.Queue()
        first = stub.ModelStreamInfer(iter(held.get, None), timeout=60)
        held.put(_identity_message())
        assert next(first).error_message == ""  # the first stream is open and answering
        with pytest.raises(grpc.RpcError) as info:
            list(stub.ModelStreamInfer(iter([_identity_message()]), timeout=30))
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "too many ModelStreamInfer streams open: 1" in str(info.value.details())
        for _ in range(3):  # unary calls are served beside the open stream
            answer = stub.ModelInfer(_identity_message(), timeout=30)
            assert len(answer.raw_output_contents[0]) == 64
        held.put(None)  # the first stream ends: its thread and slot come back
        assert list(first) == []
        answers = list(stub.ModelStreamInfer(iter([_identity_message()] * 2), timeout=30))
        assert [a.error_message for a in answers] == ["", ""]


def _identity_message() -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name="identity")
    tensor = message.inputs.add(name="INPUT0", datatype="FP32")
    tensor.shape.extend([1, 16])
    message.raw_input_contents.append(np.ones(16, np.float32).tobytes())
    return message
