"""Clients that go away: their queued requests never run and are counted; graceful shutdown."""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.serverproc import ServerProcess

# A model whose every execution takes a fixed 50 ms whatever the CPU (ONNX models of a fixed
# size run several times faster on one CPU than another): queues build up the same everywhere.
SLEEPER = """
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        time.sleep(0.05)
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", data)]))
        return responses
"""

SLEEPER_CONFIG = """
name: "slow" backend: "python" max_batch_size: 1
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ 1024 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 1024 ] } ]
dynamic_batching { }
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("cancellation")
    (root / "slow" / "1").mkdir(parents=True)
    (root / "slow" / "config.pbtxt").write_text(SLEEPER_CONFIG)
    (root / "slow" / "1" / "model.py").write_text(SLEEPER)
    proc = ServerProcess(root, log_path=root / "server.log")
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()


def _metric(server: ServerProcess, wanted: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics") as resp:
        text = resp.read().decode()
    for line in text.splitlines():
        if line.startswith(wanted):
            return float(line.split()[-1])
    raise AssertionError(f"{wanted} not in metrics")


def _canceled(server: ServerProcess, model: str) -> float:
    return _metric(
        server,
        f'nv_inference_request_failure{{model="{model}",reason="CANCELED",version="1"}}',
    )


def _pending(server: ServerProcess, model: str) -> float:
    return _metric(server, f'nv_inference_pending_request_count{{model="{model}",version="1"}}')


def _slow_body() -> bytes:
    return json.dumps(
        {
            "inputs": [
                {"name": "INPUT0", "datatype": "FP32", "shape": [1, 1024], "data": [1.0] * 1024}
            ]
        }
    ).encode()


def _occupy(server: ServerProcess, model: str) -> threading.Thread:
    """Keep the model's one instance busy (10 x 50 ms, within the 1 s queue-wait bound) from
    another thread."""

    def run() -> None:
        client = httpclient.InferenceServerClient(server.http_url, concurrency=10)
        inp = httpclient.InferInput("INPUT0", [1, 1024], "FP32")
        inp.set_data_from_numpy(np.ones((1, 1024), np.float32))
        handles = [client.async_infer(model, [inp]) for _ in range(10)]
        for handle in handles:
            with contextlib.suppress(InferenceServerException):  # queue timeouts are fine here
                handle.get_result()

    thread = threading.Thread(target=run)
    thread.start()
    _wait_for(lambda: _pending(server, model) >= 3)
    return thread


def _wait_for(predicate, timeout_s: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError("condition not met in time")


def test_http_client_that_disconnects_is_dropped_and_counted(server: ServerProcess) -> None:
    before = _canceled(server, "slow")
    busy = _occupy(server, "slow")
    body = _slow_body()
    host, port = server.http_url.split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(
            b"POST /v2/models/slow/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: "
            + str(len(body)).encode()
            + b"\r\n\r\n"
            + body
        )
        time.sleep(0.02)
    # the socket is closed while the request waits behind the busy instance
    _wait_for(lambda: _canceled(server, "slow") > before)
    busy.join()
    assert httpclient.InferenceServerClient(server.http_url).is_model_ready("slow")


def test_grpc_client_that_gives_up_is_dropped_and_counted(server: ServerProcess) -> None:
    before = _canceled(server, "slow")
    busy = _occupy(server, "slow")
    client = grpcclient.InferenceServerClient(server.grpc_url)
    inp = grpcclient.InferInput("INPUT0", [1, 1024], "FP32")
    inp.set_data_from_numpy(np.ones((1, 1024), np.float32))
    with pytest.raises(InferenceServerException, match="Deadline"):
        client.infer("slow", [inp], client_timeout=0.06)
    _wait_for(lambda: _canceled(server, "slow") > before)
    busy.join()


def test_graceful_shutdown_finishes_in_flight_requests(
    start_server,
    model_repository: Path,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    repo = tmp_path / "repo"
    # A copy: symlinks out of a repository are not followed (tests/integration/test_path_safety).
    shutil.copytree(model_repository / "slow_queue", repo / "slow_queue")
    proc = start_server(repo)
    client = httpclient.InferenceServerClient(proc.http_url, concurrency=3)
    inp = httpclient.InferInput("INPUT0", [1, 1024], "FP32")
    inp.set_data_from_numpy(np.ones((1, 1024), np.float32))
    handles = [client.async_infer("slow_queue", [inp]) for _ in range(3)]
    time.sleep(0.05)
    proc.proc.terminate()
    outputs = [h.get_result().as_numpy("OUTPUT0") for h in handles]
    assert all(o.shape == (1, 1024) for o in outputs)
    assert proc.proc.wait(30) == 0
    assert "shutting down" in proc.log()
