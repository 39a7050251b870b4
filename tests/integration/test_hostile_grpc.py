"""Hostile gRPC clients on the real server: a message that does not parse is INVALID_ARGUMENT
with the reason, logged by no traceback, on every RPC; a decoupled model's responses to a client
that reads slowly wait in the model (its sender blocks) instead of growing the server."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from appliance.services.inference import DECOUPLED_READER_WAIT_S
from configs.generate import SIMPLE_CONFIG, save, simple_model
from tests.integration.models import write_py_flood
from tests.serverproc import ServerProcess

SERVICE = service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
UNARY = [m for m in SERVICE.methods if not m.client_streaming]

MIB = 1 << 20


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("repo")
    save(simple_model(), root / "simple" / "1" / "model.onnx")
    (root / "simple" / "config.pbtxt").write_text(SIMPLE_CONFIG)
    write_py_flood(root, "flood")
    proc = ServerProcess(root, log_path=tmp_path_factory.mktemp("logs") / "server.log")
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def channel(server: ServerProcess) -> Iterator[grpc.Channel]:
    options = [("grpc.max_receive_message_length", 64 * MIB)]
    with grpc.insecure_channel(server.grpc_url, options=options) as chan:
        yield chan


def _call_raw(channel: grpc.Channel, method: str, body: bytes) -> grpc.RpcError:
    call = channel.unary_unary(f"/{SERVICE.full_name}/{method}")  # bytes in, bytes out
    with pytest.raises(grpc.RpcError) as info:
        call(body, timeout=30)
    return info.value


# ---- messages that do not parse ------------------------------------------------------------

# Not the protobuf wire format; a string field (model_name) that is not UTF-8; a message cut
# inside its first field.
BAD_BODIES = {
    "garbage": b"\xff\xff\xff\xff\xff\xff",
    "not-utf8": b"\x0a\x02\xff\xfe",
    "truncated": b"\x0a\x40simple",
}


@pytest.mark.parametrize("body", BAD_BODIES.values(), ids=list(BAD_BODIES))
@pytest.mark.parametrize("method", UNARY, ids=[m.name for m in UNARY])
def test_a_unary_message_that_does_not_parse_is_invalid_argument(
    server: ServerProcess, channel: grpc.Channel, method: object, body: bytes
) -> None:
    name, request = method.name, method.input_type.full_name  # type: ignore[attr-defined]
    if body == BAD_BODIES["not-utf8"] and not any(
        f.number == 1 and f.type == f.TYPE_STRING
        for f in method.input_type.fields  # type: ignore[attr-defined]
    ):
        pytest.skip(f"{request} has no string field 1")
    before = len(server.log())
    error = _call_raw(channel, name, body)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error
    assert error.details() == (
        f"{name}: failed to parse the request message: Error parsing message with type '{request}'"
    )
    live = service_pb2_grpc.GRPCInferenceServiceStub(channel).ServerLive(
        service_pb2.ServerLiveRequest()
    )
    assert live.live
    new = server.log()[before:]
    assert "Traceback" not in new, new
    assert "DecodeError" not in new, new


def test_a_stream_message_that_does_not_parse_logs_nothing(
    server: ServerProcess, channel: grpc.Channel
) -> None:
    before = len(server.log())
    stream = channel.stream_stream(f"/{SERVICE.full_name}/ModelStreamInfer")
    with pytest.raises(grpc.RpcError) as info:
        list(stream(iter([BAD_BODIES["garbage"]]), timeout=30))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "ModelStreamInfer: a request message does not parse" in str(info.value.details())
    new = server.log()[before:]
    assert "Traceback" not in new, new
    assert "DecodeError" not in new, new


# ---- a decoupled model's responses to a slow reader ----------------------------------------


def _family_rss_mib(pid: int) -> float:
    """VmRSS of the server and every process under it (the Python models' workers)."""
    pids, todo = set(), [pid]
    while todo:
        current = todo.pop()
        pids.add(current)
        for task in Path(f"/proc/{current}/task").glob("*"):
            try:
                todo += [int(child) for child in (task / "children").read_text().split()]
            except OSError:
                continue
    total_kib = 0
    for each in pids:
        try:
            status = Path(f"/proc/{each}/status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                total_kib += int(line.split()[1])
    return total_kib / 1024


def _flood_request(count: int, size: int) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name="flood")
    tensor = request.inputs.add(name="IN", datatype="INT64", shape=[2])
    del tensor
    request.raw_input_contents.append(np.array([count, size], np.int64).tobytes())
    request.parameters["triton_enable_empty_final_response"].bool_param = True
    return request


class _Stream:
    """One ModelStreamInfer call sending `request`, open until `close`; read with `next`."""

    def __init__(self, channel: grpc.Channel, request: service_pb2.ModelInferRequest) -> None:
        self._done = threading.Event()

        def requests() -> Iterator[service_pb2.ModelInferRequest]:
            yield request
            self._done.wait(60)

        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        self.responses = stub.ModelStreamInfer(requests(), timeout=120)

    def close(self) -> None:
        self._done.set()
        self.responses.cancel()


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads RSS from /proc")
@pytest.mark.parametrize(("count", "mib"), [(400, 1), (60, 8)], ids=["400x1MiB", "60x8MiB"])
def test_a_slow_reader_holds_a_decoupled_model_back(
    server: ServerProcess, channel: grpc.Channel, count: int, mib: int
) -> None:
    """Large responses to a client that stops reading after the first: the server's memory
    (its own and its Python model's process) grows by a bounded part of what the model would
    send; once the client reads on, every response arrives, and the final one.

    Measured growth (shared 2-core machine): 400 x 1 MiB: 410 MiB with no bound, 98 with the
    model held back (services/inference.py), 65 with the stream's byte bound too
    (frontends/grpc/server.py); 60 x 8 MiB: 176-185 with both, where 64 waiting responses
    alone would be 512."""
    idle = _family_rss_mib(server.proc.pid)
    stream = _Stream(channel, _flood_request(count, mib * MIB))
    try:
        first = next(stream.responses)
        assert not first.error_message, first.error_message
        peak = idle
        for _ in range(12):  # the model would have sent everything well within this
            time.sleep(0.25)
            peak = max(peak, _family_rss_mib(server.proc.pid))
        limit = 120 + 16 * mib
        assert peak - idle < limit, f"RSS {idle:.0f} -> {peak:.0f} MiB while the client stalled"
        got = 1
        for message in stream.responses:
            assert not message.error_message, message.error_message
            if message.infer_response.parameters["triton_final_response"].bool_param:
                break
            assert len(message.infer_response.raw_output_contents[0]) == mib * MIB
            got += 1
        assert got == count
    finally:
        stream.close()


def test_a_held_back_model_goes_on_once_its_client_goes_away(
    server: ServerProcess, channel: grpc.Channel
) -> None:
    """The model waits in send() for a client that reads nothing; the client cancels: the
    model's instance finishes that request and serves the next one."""
    stalled = _Stream(channel, _flood_request(400, MIB))
    try:
        assert not next(stalled.responses).error_message
        time.sleep(0.5)  # the model fills the bounds and waits
    finally:
        stalled.close()
    stream = _Stream(channel, _flood_request(3, 16))
    try:
        messages = [next(stream.responses) for _ in range(4)]  # 3 responses and the final one
    finally:
        stream.close()
    assert [m.error_message for m in messages] == [""] * 4
    assert messages[-1].infer_response.parameters["triton_final_response"].bool_param


def test_a_client_that_reads_nothing_for_long_fails_its_request(
    server: ServerProcess, channel: grpc.Channel
) -> None:
    """A model held back longer than DECOUPLED_READER_WAIT_S (10 s) by a client that reads
    nothing: the request is cancelled (its instance is not held, nor counted stuck by the
    watchdog); reading on, the client gets what had been made, then the reason."""
    stream = _Stream(channel, _flood_request(400, MIB))
    try:
        assert not next(stream.responses).error_message
        time.sleep(DECOUPLED_READER_WAIT_S + 2)
        messages = []
        for message in stream.responses:
            messages.append(message)
            if message.error_message:
                break
    finally:
        stream.close()
    error = messages[-1].error_message
    assert error.startswith(
        "model 'flood' version 1: the stream's client read none of this request's responses "
        f"for {DECOUPLED_READER_WAIT_S:g} s while the model waited to send more ("
    ), error
    assert error.endswith(" waiting); the request is cancelled"), error
    assert 1 < len(messages) < 400
    assert all(not m.error_message for m in messages[:-1])
    stream = _Stream(channel, _flood_request(2, 16))  # the instance serves the next one
    try:
        assert [next(stream.responses).error_message for _ in range(3)] == [""] * 3
    finally:
        stream.close()
