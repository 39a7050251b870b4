"""ModelStreamInfer on its handler thread (issue 20, frontends/grpc/stream.py): a stream's
requests that the thread lane takes are answered on the stream's own thread with no hop to the
loop; the others (here: a model that batches with a delay) run on the loop beside them, on the
same stream. Every request gets its answer, in-band errors leave the stream open, statistics
count each request once, and a client that goes cancels what its stream still runs."""

from __future__ import annotations

import itertools
import json
import queue
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from onnx import TensorProto

from appliance.common.protocol import service_pb2 as pb
from appliance.common.protocol import service_pb2_grpc
from configs.generate import identity_model, save
from tests.integration.models import slow_model
from tests.integration.streams import Counted
from tests.serverproc import ServerProcess

CONFIG = """\
name: "{name}"
backend: "onnxruntime"
max_batch_size: 8
input [ {{ name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] }} ]
instance_group [ {{ count: 1, kind: KIND_CPU }} ]
{batching}
"""
# identity: the lane takes it (no batching). batched: the policy waits up to 20 ms for a batch
# to fill, so the lane leaves it to the loop. held: a lone request waits 30 s in the loop's queue.
MODELS = {
    "identity": "",
    "batched": "dynamic_batching { max_queue_delay_microseconds: 20000 }",
    "held": "dynamic_batching { max_queue_delay_microseconds: 30000000 }",
}


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root: Path = tmp_path_factory.mktemp("stream_lane")
    for name, batching in MODELS.items():
        save(identity_model(TensorProto.FLOAT, ["batch", "n"]), root / name / "1" / "model.onnx")
        (root / name / "config.pbtxt").write_text(CONFIG.format(name=name, batching=batching))
    return root


@pytest.fixture(scope="module")
def server(repository: Path) -> Iterator[ServerProcess]:
    proc = ServerProcess(repository, log_path=repository / "server.log")
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()


def _message(model: str, value: float, request_id: str, datatype: str = "FP32") -> Any:
    message = pb.ModelInferRequest(model_name=model, id=request_id)
    tensor = message.inputs.add(name="INPUT0", datatype=datatype)
    tensor.shape.extend([1, 4])
    message.raw_input_contents.append(np.full(4, value, np.float32).tobytes())
    return message


def _value(response: Any) -> float:
    answer = np.frombuffer(response.infer_response.raw_output_contents[0], np.float32)
    assert answer.shape == (4,)
    assert len(set(answer.tolist())) == 1
    return float(answer[0])


def _stats(proc: ServerProcess, model: str) -> Any:
    client = grpcclient.InferenceServerClient(proc.grpc_url)
    return client.get_inference_statistics(model).model_stats[0]


def test_a_stream_s_requests_are_answered_on_its_handler_thread(server: ServerProcess) -> None:
    """One request at a time on one stream: each is answered, in order, with its own values,
    and counted once; none waited in the loop's queue (the lane runs it at once: a request
    queued on the loop first waits some microseconds there)."""
    count = 200
    before = _stats(server, "identity")
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        sending: queue.Queue[Any] = queue.Queue()
        responses = stub.ModelStreamInfer(iter(sending.get, None), timeout=120)
        for i in range(count):
            sending.put(_message("identity", float(i), str(i)))
            response = next(responses)
            assert response.error_message == ""
            assert response.infer_response.id == str(i)
            assert _value(response) == float(i)
        sending.put(None)
        assert list(responses) == []
    after = _stats(server, "identity")
    stats, was = after.inference_stats, before.inference_stats
    assert after.inference_count - before.inference_count == count
    assert stats.success.count - was.success.count == count
    assert stats.queue.count - was.queue.count == count
    assert stats.queue.ns == was.queue.ns  # no wait at all: run on the stream's thread
    assert stats.fail.count == was.fail.count


def test_lane_and_loop_requests_mixed_on_one_stream_all_get_their_answers(
    server: ServerProcess,
) -> None:
    """Requests sent without waiting, alternating a model the lane takes and one it leaves to
    the loop, with bad requests among them: each gets exactly one answer with its own values
    (a bad one its error, in-band, and the stream goes on), and each model counts its own."""
    count = 240
    before = {name: _stats(server, name) for name in ("identity", "batched")}
    messages, expected, bad = [], {}, set()
    for i in range(count):
        model = "identity" if i % 2 else "batched"
        if i % 37 == 5:  # a datatype the model does not take
            messages.append(_message(model, float(i), f"bad{i}", datatype="INT32"))
            bad.add(f"bad{i}")
        else:
            messages.append(_message(model, float(i), str(i)))
            expected[str(i)] = float(i)
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        answers = list(stub.ModelStreamInfer(iter(messages), timeout=120))
    assert len(answers) == count
    got, errors = {}, set()
    for answer in answers:
        request_id = answer.infer_response.id
        if answer.error_message:
            # a failed request's answer is its error alone, as tritonserver's; the request id
            # is in the error's own prefix
            assert "INT32" in answer.error_message, answer.error_message
            tagged = re.match(r"\[request id: (\w+)\] ", answer.error_message)
            assert tagged, answer.error_message
            errors.add(tagged.group(1))
        else:
            assert request_id not in got
            got[request_id] = _value(answer)
    assert errors == bad
    assert got == expected
    for name, sent in (("identity", count // 2), ("batched", count // 2)):
        after = _stats(server, name)
        failed = len([i for i in bad if (name == "identity") == (int(i[3:]) % 2 == 1)])
        successes = after.inference_stats.success.count - before[name].inference_stats.success.count
        assert successes == sent - failed, name
        assert after.inference_count - before[name].inference_count == sent - failed, name
        # refused by their checks: no failures, as tritonserver counts them
        assert after.inference_stats.fail.count == before[name].inference_stats.fail.count, name


def test_a_client_that_goes_cancels_its_stream_s_requests_on_the_loop(  # type: ignore[no-untyped-def]
    start_server, repository: Path
) -> None:
    """A stream with a request waiting in the loop's queue (30 s) and answered lane requests
    beside it: cancelling the stream cancels the queued request at once (counted as a failure,
    never run) and gives the stream's slot back (one stream allowed here: 9 - 8)."""
    proc = start_server(repository, "--grpc-max-concurrent-rpcs=9")
    before = _stats(proc, "held")
    with grpc.insecure_channel(proc.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        sending: queue.Queue[Any] = queue.Queue()
        responses = stub.ModelStreamInfer(iter(sending.get, None), timeout=120)
        sending.put(_message("held", 1.0, "held"))
        for i in range(5):  # lane answers while the held request waits on the loop
            sending.put(_message("identity", float(i), str(i)))
            response = next(responses)
            assert (response.infer_response.id, _value(response)) == (str(i), float(i))
        responses.cancel()
        deadline = time.monotonic() + 20
        while True:
            after = _stats(proc, "held")
            if after.inference_stats.fail.count > before.inference_stats.fail.count:
                break
            assert time.monotonic() < deadline, "the held request was not cancelled"
            time.sleep(0.05)
        assert after.inference_stats.fail.count - before.inference_stats.fail.count == 1
        assert after.execution_count == before.execution_count  # never ran
        assert after.inference_stats.success.count == before.inference_stats.success.count
        # The slot came back: a new stream is admitted and answered.
        answers = _stream_when_admitted(stub, _message("identity", 7.0, "again"))
    assert [(a.infer_response.id, _value(a)) for a in answers] == [("again", 7.0)]


def _stream_when_admitted(stub: Any, message: Any) -> list[Any]:
    """A one-request stream's answers, retried while it is refused RESOURCE_EXHAUSTED."""
    deadline = time.monotonic() + 20
    while True:
        try:
            return list(stub.ModelStreamInfer(iter([message]), timeout=30))
        except grpc.RpcError as exc:
            code = exc.code()
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert time.monotonic() < deadline, "the cancelled stream kept its slot"
        time.sleep(0.05)


def test_a_stream_whose_client_does_not_read_stops_reading_loop_requests(
    server: ServerProcess,
) -> None:
    """As tests/integration/test_grpc_stream.py, for requests answered on the loop (the lane
    leaves `batched` to it): 2,000 requests of 64 KiB, none of the responses read. The server
    stops taking requests at its bounds (requests in flight, responses waiting) instead of
    reading all 2,000; once the client reads, every request is answered."""
    count, elements = 2000, 16 * 1024

    def message(i: int) -> Any:
        request = pb.ModelInferRequest(model_name="batched", id=str(i))
        tensor = request.inputs.add(name="INPUT0", datatype="FP32")
        tensor.shape.extend([1, elements])
        request.raw_input_contents.append(np.full(elements, i, np.float32).tobytes())
        return request

    requests = Counted(message(i) for i in range(count))
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        responses = stub.ModelStreamInfer(iter(requests), timeout=300)
        pulled = requests.wait_until_stalled(count)
        assert pulled < count // 2, f"the server read {pulled} of {count} requests"
        got = {}
        for response in responses:
            assert response.error_message == ""
            answer = np.frombuffer(response.infer_response.raw_output_contents[0], np.float32)
            assert answer.shape == (elements,)
            got[response.infer_response.id] = float(answer[0])
    assert got == {str(i): float(i) for i in range(count)}


SLOW_CONFIG = """\
name: "slow"
platform: "onnxruntime_onnx"
max_batch_size: 1
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ 1024 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 1024 ] } ]
instance_group [ { count: 2, kind: KIND_CPU } ]
"""


def test_requests_sent_together_on_one_stream_still_run_side_by_side(  # type: ignore[no-untyped-def]
    start_server, tmp_path: Path
) -> None:
    """A model of two instances whose runs take well over STREAM_LANE_LONG_NS, and six
    requests sent at once on one stream: after the first LANE_LONG_RUNS (run on the handler
    thread), the stream's requests go to the loop, which runs them on both instances at once:
    their traced executions overlap in time. Run one after the other on the handler thread,
    none would."""
    save(slow_model(400), tmp_path / "repo" / "slow" / "1" / "model.onnx")
    (tmp_path / "repo" / "slow" / "config.pbtxt").write_text(SLOW_CONFIG)
    trace_file = tmp_path / "trace.jsonl"
    proc = start_server(
        tmp_path / "repo",
        f"--trace-file={trace_file}",
        "--trace-level=TIMESTAMPS",
        "--trace-rate=1",
    )
    count = 6
    messages = []
    for i in range(count):
        message = pb.ModelInferRequest(model_name="slow", id=str(i))
        tensor = message.inputs.add(name="INPUT0", datatype="FP32")
        tensor.shape.extend([1, 1024])
        message.raw_input_contents.append(np.full(1024, 0.001, np.float32).tobytes())
        messages.append(message)
    with grpc.insecure_channel(proc.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        answers = list(stub.ModelStreamInfer(iter(messages), timeout=300))
    assert sorted(a.infer_response.id for a in answers) == [str(i) for i in range(count)]
    assert all(a.error_message == "" for a in answers)
    deadline = time.monotonic() + 10
    while True:
        lines = trace_file.read_text().splitlines() if trace_file.exists() else []
        if len(lines) >= count:
            break
        assert time.monotonic() < deadline, f"{len(lines)} of {count} traces written"
        time.sleep(0.05)
    runs = []
    for line in lines:
        stamps = {t["name"]: t["ns"] for t in json.loads(line)["timestamps"]}
        runs.append((stamps["COMPUTE_START"], stamps["COMPUTE_END"]))
    runs.sort()
    overlapping = [b for a, b in itertools.pairwise(runs) if b[0] < a[1]]
    assert overlapping, f"no two executions overlapped: {runs}"
