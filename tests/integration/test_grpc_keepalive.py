"""tritonserver's gRPC connection flags act: keepalive pings find a client that vanished
without closing its connection, whose ModelStreamInfer stream would otherwise hold its handler
thread and its stream slot (frontends/grpc/admission.py StreamSlots) for good;
--grpc-max-connection-age ends long-lived connections while clients reconnect; and
--grpc-infer-response-compression-level compresses infer responses, only those. The flags'
parsing and Triton's defaults: tests/unit/test_grpc_connection_flags.py."""

from __future__ import annotations

import queue
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from onnx import TensorProto

from appliance.common.protocol import service_pb2 as pb
from appliance.common.protocol import service_pb2_grpc
from appliance.frontends.grpc.server import stream_limit
from configs.generate import SIMPLE_CONFIG, identity_model, save, simple_model
from tests.serverproc import ServerProcess
from tests.tcpproxy import TcpProxy

# 9 calls: stream_limit leaves 8 to unary calls, so exactly one stream may be open.
ONE_STREAM = "--grpc-max-concurrent-rpcs=9"
KEEPALIVE = ("--grpc-keepalive-time=1000", "--grpc-keepalive-timeout=1000")
# How long the tests give keepalive to close a dead connection: its ping after 1 s of silence,
# unanswered for 1 s (measured: freed 2.0 s after the freeze; the second stream is refused
# within ms of it), plus a loaded machine's slack. The server without the flags (Triton's 2 h)
# gets as long and keeps the slot.
DETECTION_S = 5.0


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    root = tmp_path / "models"
    save(simple_model(), root / "simple" / "1" / "model.onnx")
    (root / "simple" / "config.pbtxt").write_text(SIMPLE_CONFIG)
    return root


def _request() -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name="simple")
    for name in ("INPUT0", "INPUT1"):
        tensor = message.inputs.add(name=name, datatype="INT32")
        tensor.shape.extend([1, 16])
        message.raw_input_contents.append(np.arange(16, dtype=np.int32).tobytes())
    return message


class OpenStream:
    """A ModelStreamInfer stream kept open, its requests sent one by one."""

    def __init__(self, channel: grpc.Channel) -> None:
        self._requests: queue.Queue[pb.ModelInferRequest | None] = queue.Queue()
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        self.call = stub.ModelStreamInfer(iter(self._requests.get, None), timeout=120)
        self._responses: Iterator[pb.ModelStreamInferResponse] = self.call

    def infer(self) -> pb.ModelStreamInferResponse:
        self._requests.put(_request())
        return next(self._responses)

    def close(self) -> None:
        self._requests.put(None)
        self.call.cancel()


def _stream_once(stub: service_pb2_grpc.GRPCInferenceServiceStub) -> grpc.StatusCode:
    """A short stream of one request: OK when answered, else the code it was refused with."""
    try:
        answers = list(stub.ModelStreamInfer(iter([_request()]), timeout=30))
    except grpc.RpcError as exc:
        return exc.code()  # type: ignore[no-any-return]
    assert [a.error_message for a in answers] == [""]
    return grpc.StatusCode.OK


class Vanishing:
    """Clients that vanish: each holds the one stream slot through a proxy that then freezes
    (no byte, FIN or RST either way from then on, every socket left open)."""

    def __init__(self) -> None:
        self._held: list[tuple[TcpProxy, grpc.Channel, OpenStream]] = []

    def hold_the_slot_then_vanish(self, proc: ServerProcess) -> float:
        """Open the one stream through a proxy and freeze it; a second stream, from a client
        already connected, is refused at once. Returns the monotonic time of the freeze."""
        assert stream_limit(9) == 1
        proxy = TcpProxy(proc.grpc_url)
        channel = grpc.insecure_channel(proxy.address)
        stream = OpenStream(channel)
        self._held.append((proxy, channel, stream))
        assert stream.infer().error_message == ""  # the stream is open: it holds the slot
        with grpc.insecure_channel(proc.grpc_url) as direct:
            grpc.channel_ready_future(direct).result(timeout=30)
            stub = service_pb2_grpc.GRPCInferenceServiceStub(direct)
            proxy.freeze()
            frozen_at = time.monotonic()
            assert _stream_once(stub) == grpc.StatusCode.RESOURCE_EXHAUSTED
        return frozen_at

    def close(self) -> None:
        for proxy, channel, stream in self._held:
            proxy.stop()
            stream.close()
            channel.close()


@pytest.fixture
def vanishing(start_server) -> Iterator[Vanishing]:  # type: ignore[no-untyped-def]
    """Closed before the server stops (a frozen connection would hold its shutdown up)."""
    clients = Vanishing()
    yield clients
    clients.close()


def test_keepalive_frees_the_stream_slot_of_a_client_that_vanished(
    repository: Path,
    start_server,  # type: ignore[no-untyped-def]
    vanishing: Vanishing,
) -> None:
    proc = start_server(repository, ONE_STREAM, *KEEPALIVE)
    frozen_at = vanishing.hold_the_slot_then_vanish(proc)
    with grpc.insecure_channel(proc.grpc_url) as direct:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(direct)
        while (code := _stream_once(stub)) != grpc.StatusCode.OK:
            assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert time.monotonic() - frozen_at < DETECTION_S, "keepalive never freed the slot"
            time.sleep(0.1)
        # The slot is free for good: the dead connection's stream has ended, not paused.
        assert _stream_once(stub) == grpc.StatusCode.OK


def test_without_the_flags_the_vanished_client_keeps_the_slot(
    repository: Path,
    start_server,  # type: ignore[no-untyped-def]
    vanishing: Vanishing,
) -> None:
    """Triton's defaults (a ping after 2 h): the same wait frees nothing."""
    proc = start_server(repository, ONE_STREAM)
    frozen_at = vanishing.hold_the_slot_then_vanish(proc)
    time.sleep(max(0.0, frozen_at + DETECTION_S - time.monotonic()))
    with grpc.insecure_channel(proc.grpc_url) as direct:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(direct)
        assert _stream_once(stub) == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_max_connection_age_ends_a_long_stream_and_unary_calls_go_on(
    repository: Path,
    start_server,  # type: ignore[no-untyped-def]
) -> None:
    """GOAWAY after about 0.5 s (gRPC adds up to 10% jitter), the connection closed 0.5 s
    later: the stream open across it ends UNAVAILABLE, while unary calls on the same channel,
    before, during and after (on a new connection), all succeed."""
    proc = start_server(
        repository, "--grpc-max-connection-age=500", "--grpc-max-connection-age-grace=500"
    )
    with grpc.insecure_channel(proc.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        stream = OpenStream(channel)
        opened = time.monotonic()
        assert stream.infer().error_message == ""
        answered_after_end = 0
        ended: grpc.StatusCode | None = None
        while time.monotonic() - opened < 3.5:
            response = stub.ModelInfer(_request(), timeout=10)
            assert len(response.raw_output_contents) == 2
            if ended is None:
                try:
                    stream.infer()
                except grpc.RpcError as exc:
                    ended, ended_after = exc.code(), time.monotonic() - opened
            else:
                answered_after_end += 1
            time.sleep(0.05)
        stream.close()
    assert ended == grpc.StatusCode.UNAVAILABLE
    # Nominally 0.95-1.05 s from the connection's start (which may precede `opened` a little);
    # the bounds leave room for a loaded machine.
    assert 0.7 <= ended_after < 3.0, ended_after
    assert answered_after_end >= 3


def test_a_bad_value_stops_the_real_start_naming_the_flag(
    repository: Path,
    start_server,  # type: ignore[no-untyped-def]
) -> None:
    proc = start_server(repository, "--grpc-keepalive-timeout=0", wait=False)
    assert proc.proc.wait(timeout=60) == 2
    assert (
        "error: argument --grpc-keepalive-timeout: expected a whole number from 1 to "
        "2147483647, got 0" in proc.log()
    )


def _zeros_request(elements: int) -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name="zeros")
    tensor = message.inputs.add(name="INPUT0", datatype="FP32")
    tensor.shape.extend([1, elements])
    message.raw_input_contents.append(bytes(4 * elements))
    return message


@pytest.mark.parametrize("level", ["none", "low", "high"])
def test_infer_responses_are_compressed_at_the_level_given(
    repository: Path,
    start_server,  # type: ignore[no-untyped-def]
    level: str,
) -> None:
    """A 1 MiB answer of zeros, from ModelInfer (Triton's own client) and ModelStreamInfer,
    counted on the wire by a proxy: compressed to a few KiB with a level, whole without; the
    client decodes it either way. Other RPCs are not compressed, as tritonserver's."""
    save(identity_model(TensorProto.FLOAT, ["batch", "n"]), repository / "zeros/1/model.onnx")
    for i in range(40):  # models that do not load: each a long line in the index
        (repository / f"unloadable_{'x' * 80}_{i}" / "1").mkdir(parents=True)
    proc = start_server(repository, f"--grpc-infer-response-compression-level={level}")
    proxy = TcpProxy(proc.grpc_url)
    try:
        elements = 256 * 1024
        client = grpcclient.InferenceServerClient(proxy.address)
        inputs = [grpcclient.InferInput("INPUT0", [1, elements], "FP32")]
        inputs[0].set_data_from_numpy(np.zeros((1, elements), np.float32))
        before = proxy.bytes_to_clients
        assert not client.infer("zeros", inputs).as_numpy("OUTPUT0").any()
        unary_bytes = proxy.bytes_to_clients - before
        with grpc.insecure_channel(proxy.address) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            before = proxy.bytes_to_clients
            answers = list(stub.ModelStreamInfer(iter([_zeros_request(elements)]), timeout=60))
            stream_bytes = proxy.bytes_to_clients - before
            assert answers[0].infer_response.raw_output_contents[0] == bytes(4 * elements)
            # The index of 40 models that do not load: a compressible answer of another RPC,
            # sent whole.
            before = proxy.bytes_to_clients
            stub.RepositoryIndex(pb.RepositoryIndexRequest(), timeout=30)
            index_bytes = proxy.bytes_to_clients - before
        client.close()
    finally:
        proxy.stop()
    if level == "none":
        assert min(unary_bytes, stream_bytes) > 4 * elements
    else:
        assert max(unary_bytes, stream_bytes) < 16 * 1024  # measured 1.4 KiB
    assert index_bytes > 16 * 1024  # measured 17.7 KiB at every level; gzip makes it ~1 KiB
