"""Slow and greedy HTTP clients: a request dribbled byte by byte (slowloris), a body that never
comes, a response never read, idle keep-alive connections and connection floods are cut off,
while other clients are served meanwhile."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from configs.generate import identity_model, save
from tests.integration.models import ONNX_TYPES
from tests.serverproc import ServerProcess

TIMEOUT_FLAGS = (
    "--http-header-timeout-secs=1",
    "--http-body-timeout-secs=1",
    "--http-keepalive-timeout-secs=2",
)
# Generous: the server must cut the client off at all, well before this; speed is not tested.
GIVE_UP_S = 20


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("slow_clients")
    save(identity_model(ONNX_TYPES["FP32"], ["batch", "n"]), root / "identity" / "1" / "model.onnx")
    (root / "identity" / "config.pbtxt").write_text(
        'name: "identity"\nbackend: "onnxruntime"\nmax_batch_size: 8\n'
        'input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]\n'
        'output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]\n'
    )
    return root


@pytest.fixture(scope="module")
def guarded(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = ServerProcess(
        repository, *TIMEOUT_FLAGS, log_path=tmp_path_factory.mktemp("logs") / "server.log"
    )
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()


def _connect(proc: ServerProcess) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", proc.http_port), timeout=GIVE_UP_S)
    return sock


def _read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (or resets it)."""
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    return data


def _infer(proc: ServerProcess) -> np.ndarray:
    client = httpclient.InferenceServerClient(proc.http_url)
    inp = httpclient.InferInput("INPUT0", [1, 4], "FP32")
    inp.set_data_from_numpy(np.arange(4, dtype=np.float32).reshape(1, 4))
    return client.infer("identity", [inp]).as_numpy("OUTPUT0")  # type: ignore[no-any-return]


def test_dribbled_headers_are_cut_off_while_others_are_served(guarded: ServerProcess) -> None:
    sock = _connect(guarded)
    stop = threading.Event()
    closed = threading.Event()

    def dribble() -> None:
        try:
            sock.sendall(b"POST /v2/models/identity/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            line = b"X-Slow: 1\r\n"
            for i in range(GIVE_UP_S * 10):  # one byte each 0.1 s: never a whole request
                if stop.is_set():
                    return
                sock.sendall(line[i % len(line) : i % len(line) + 1])
                time.sleep(0.1)
        except OSError:  # the server closed the connection: what we wait for
            closed.set()

    dribbler = threading.Thread(target=dribble)
    dribbler.start()
    served = [_infer(guarded) for _ in range(5)]  # other clients are served meanwhile
    answer = _read_until_closed(sock)
    stop.set()
    dribbler.join()
    sock.close()
    assert answer.startswith(b"HTTP/1.1 408 Request Timeout"), answer
    assert all(out.tolist() == [[0, 1, 2, 3]] for out in served)
    assert "waited 1s for request headers" in guarded.log()


def test_a_body_that_never_comes_is_cut_off(guarded: ServerProcess) -> None:
    sock = _connect(guarded)
    header = json.dumps(
        {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}
    ).encode()
    sock.sendall(
        b"POST /v2/models/identity/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        + f"Content-Length: {len(header) + 1000}\r\n\r\n".encode()
        + header[:10]
    )
    answer = _read_until_closed(sock)
    sock.close()
    assert answer.startswith(b"HTTP/1.1 408 Request Timeout"), answer
    assert "waited 1s for the request body" in guarded.log()
    _infer(guarded)


def test_a_client_that_never_sends_a_request_is_cut_off(guarded: ServerProcess) -> None:
    sock = _connect(guarded)
    assert _read_until_closed(sock).startswith(b"HTTP/1.1 408")
    sock.close()


def test_idle_keepalive_connection_is_closed(guarded: ServerProcess) -> None:
    sock = _connect(guarded)
    sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    answer = _read_until_closed(sock)  # the answer, then EOF once the connection idled
    sock.close()
    assert answer.startswith(b"HTTP/1.1 200 OK"), answer
    assert answer.count(b"HTTP/1.1") == 1


def test_a_client_that_does_not_read_its_response_is_cut_off(guarded: ServerProcess) -> None:
    """A 32 MB answer to a client that never reads it: the server gives up on the connection
    instead of holding the response (and its handler) forever."""
    elements = 8 * 1024 * 1024
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "datatype": "FP32",
                    "shape": [1, elements],
                    "parameters": {"binary_data_size": elements * 4},
                }
            ],
            "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
        }
    ).encode()
    body = header + np.zeros(elements, np.float32).tobytes()
    sock = _connect(guarded)
    sock.sendall(
        b"POST /v2/models/identity/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        + f"Inference-Header-Content-Length: {len(header)}\r\n".encode()
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    deadline = time.monotonic() + GIVE_UP_S
    while "for the client to read its response" not in guarded.log():
        assert time.monotonic() < deadline, "the server still waits for the client to read"
        time.sleep(0.2)
    received = _read_until_closed(sock)
    sock.close()
    assert len(received) < len(body)  # cut off: the whole answer never came
    _infer(guarded)


def test_connections_past_the_limit_get_503(start_server, repository: Path) -> None:
    proc = start_server(repository, "--http-max-connections=3")
    idle = [_connect(proc) for _ in range(3)]
    try:
        # Every connection holds its slot until it closes, so the fourth is refused...
        extra = _connect(proc)
        answer = _read_until_closed(extra)
        extra.close()
        assert answer.startswith(b"HTTP/1.1 503 Service Unavailable"), answer
        assert answer.endswith(b'{"error":"too many open HTTP connections"}')
    finally:
        for sock in idle:
            sock.close()
    # ...and served once the others went away.
    deadline = time.monotonic() + GIVE_UP_S
    while True:
        try:
            _infer(proc)
            break
        except Exception:
            assert time.monotonic() < deadline
            time.sleep(0.1)
