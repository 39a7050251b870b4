"""Unix socket listeners: local clients without a TCP port (curl --unix-socket, grpc unix:)."""

from __future__ import annotations

import http.client
import json
import os
import socket
import stat
import time
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

from tests.serverproc import ServerProcess


class UnixHTTPConnection(http.client.HTTPConnection):
    """http.client over a Unix socket (what `curl --unix-socket` does)."""

    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=10)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(10)
        self.sock.connect(self._path)


def _http(path: str, method: str, url: str, body: dict | None = None) -> tuple[int, dict]:
    conn = UnixHTTPConnection(path)
    try:
        payload = json.dumps(body).encode() if body is not None else None
        conn.request(method, url, body=payload, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        return resp.status, json.loads(data) if data else {}
    finally:
        conn.close()


def _wait_for_socket(path: str, proc: ServerProcess) -> None:
    deadline = time.monotonic() + 60
    while True:
        assert proc.proc.poll() is None, proc.log()
        if os.path.exists(path):
            try:
                if _http(path, "GET", "/v2/health/ready")[0] == 200:
                    return
            except OSError:
                pass
        assert time.monotonic() < deadline, proc.log()
        time.sleep(0.05)


def _simple_body() -> dict:
    return {
        "inputs": [
            {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": list(range(16))},
            {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": [1] * 16},
        ]
    }


def test_unix_sockets_alone_serve_http_and_grpc(
    start_server, model_repository: Path, tmp_path: Path
) -> None:
    http_sock, grpc_sock = str(tmp_path / "http.sock"), str(tmp_path / "grpc.sock")
    Path(http_sock).write_bytes(b"")  # not a socket: must be refused, not replaced
    refused = start_server(model_repository, f"--http-unix-socket={http_sock}", wait=False)
    assert refused.proc.wait(60) != 0
    assert "exists and is no socket" in refused.log()
    os.unlink(http_sock)

    proc = start_server(
        model_repository,
        "--http-port=-1",
        "--grpc-port=-1",
        f"--http-unix-socket={http_sock}",
        f"--grpc-unix-socket={grpc_sock}",
        "--unix-socket-mode=600",
        wait=False,
    )
    _wait_for_socket(http_sock, proc)
    assert stat.S_IMODE(os.stat(http_sock).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(grpc_sock).st_mode) == 0o600
    status, result = _http(http_sock, "POST", "/v2/models/simple/infer", _simple_body())
    assert status == 200, result
    assert result["outputs"][0]["data"] == [i + 1 for i in range(16)]

    client = grpcclient.InferenceServerClient(f"unix://{grpc_sock}")
    inputs = [
        grpcclient.InferInput("INPUT0", [1, 16], "INT32"),
        grpcclient.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    inputs[0].set_data_from_numpy(np.arange(16, dtype=np.int32).reshape(1, 16))
    inputs[1].set_data_from_numpy(np.ones((1, 16), dtype=np.int32))
    out = client.infer("simple", inputs).as_numpy("OUTPUT1")
    np.testing.assert_array_equal(out, np.arange(16).reshape(1, 16) - 1)

    # No TCP listener at all: the ports the harness picked stay closed.
    for port in (proc.http_port, proc.grpc_port):
        with socket.socket() as sock:
            assert sock.connect_ex(("127.0.0.1", port)) != 0
    assert proc.stop() == 0
    assert not os.path.exists(http_sock)
    assert not os.path.exists(grpc_sock)
