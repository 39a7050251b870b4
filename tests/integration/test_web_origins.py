"""What a web page in a browser on the device may not do to the API (issue 31, item 8).

A page of another site can POST to 127.0.0.1 without a preflight (a "simple" Content-Type),
and a page that rebinds its DNS name to the device reads the answers too (its name in Host).
The server refuses a foreign Origin on every request that can change something, a Host that
is not one of its names, and form Content-Types on control POSTs; Triton's clients, which
send none of these, work as before.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
import tritonclient.http.aio as aiohttpclient
import tritonclient.utils.shared_memory as shm

from tests.serverproc import ServerProcess

ALLOWED = "device.example"


@pytest.fixture(scope="module")
def proc(
    model_repository: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    server = ServerProcess(
        model_repository,
        "--model-control-mode=explicit",
        "--load-model=simple",
        "--allow-client-shm=true",
        f"--http-allowed-hosts={ALLOWED}",
        log_path=tmp_path_factory.mktemp("origins") / "server.log",
    )
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


def send(
    proc: ServerProcess, method: str, path: str, body: bytes = b"", **headers: str
) -> tuple[int, bytes]:
    """One request with exactly these headers (Host among them when given)."""
    connection = http.client.HTTPConnection("127.0.0.1", proc.http_port, timeout=30)
    try:
        connection.putrequest(method, path, skip_host="Host" in headers)
        for name, value in headers.items():
            connection.putheader(name.replace("_", "-"), value)
        connection.putheader("Content-Length", str(len(body)))
        connection.endheaders(body)
        answer = connection.getresponse()
        return answer.status, answer.read()
    finally:
        connection.close()


def ready(proc: ServerProcess) -> bool:
    return httpclient.InferenceServerClient(proc.http_url).is_model_ready("simple")


INFER = json.dumps(
    {
        "inputs": [
            {"name": n, "shape": [1, 16], "datatype": "INT32", "data": [1] * 16}
            for n in ("INPUT0", "INPUT1")
        ]
    }
).encode()


def test_a_foreign_page_cannot_unload_a_model(proc: ServerProcess) -> None:
    # What a page's fetch(..., {method: "POST", mode: "no-cors", body: "{}"}) sends.
    status, body = send(
        proc,
        "POST",
        "/v2/repository/models/simple/unload",
        b"{}",
        Origin="http://evil.example",
        Content_Type="text/plain;charset=UTF-8",
    )
    assert status == 403
    assert "cross-origin request refused: Origin 'http://evil.example'" in json.loads(body)["error"]
    assert ready(proc)


def test_a_form_body_is_refused_on_control_posts(proc: ServerProcess) -> None:
    """An HTML form from a browser that sends no Origin: text/plain and multipart refused."""
    for content_type in ("text/plain", "multipart/form-data; boundary=x"):
        status, body = send(
            proc, "POST", "/v2/repository/models/simple/unload", b"{}", Content_Type=content_type
        )
        assert status == 415, body
        assert "send the body as application/json" in json.loads(body)["error"]
    assert ready(proc)


def test_a_foreign_page_cannot_infer(proc: ServerProcess) -> None:
    path = "/v2/models/simple/infer"
    status, body = send(proc, "POST", path, INFER, Origin="https://evil.example")
    assert status == 403
    assert "cross-origin request refused" in json.loads(body)["error"]
    # The fast path and aiohttp's route (a gzip body is relayed to it) refuse alike.
    status, body = send(
        proc, "POST", path, b"x", Origin="https://evil.example", Content_Encoding="gzip"
    )
    assert status == 403
    # The server's own origin (its status page) may.
    here = f"127.0.0.1:{proc.http_port}"
    status, body = send(proc, "POST", path, INFER, Origin=f"http://{here}")
    assert status == 200, body


def test_a_rebound_dns_name_is_refused(proc: ServerProcess) -> None:
    """The page's own name in Host, even on GETs: their answers are what it wants to read."""
    for path in ("/v2", "/status.json", "/v2/models/simple/config", "/v2/health/ready"):
        status, body = send(proc, "GET", path, Host=f"evil.example:{proc.http_port}")
        assert status == 403, path
        assert "Host 'evil.example:" in json.loads(body)["error"]
        assert "--http-allowed-hosts" in json.loads(body)["error"]
    status, _ = send(proc, "POST", "/v2/models/simple/infer", INFER, Host="evil.example")
    assert status == 403


@pytest.mark.parametrize(
    "host",
    [
        "127.0.0.1:{port}",
        "localhost:{port}",
        "LOCALHOST",
        "[::1]:{port}",
        "10.1.2.3",
        "{hostname}",
        "{hostname}.local:{port}",
        ALLOWED,
        ALLOWED + ".",
    ],
)
def test_own_names_and_ip_addresses_are_accepted(proc: ServerProcess, host: str) -> None:
    shown = host.format(port=proc.http_port, hostname=socket.gethostname().split(".")[0])
    status, _ = send(proc, "GET", "/v2/health/ready", Host=shown)
    assert status == 200, shown
    status, _ = send(proc, "POST", "/v2/models/simple/infer", INFER, Host=shown)
    assert status == 200, shown


def test_a_same_origin_page_may_post_and_a_null_origin_may_not(proc: ServerProcess) -> None:
    here = f"127.0.0.1:{proc.http_port}"
    status, _ = send(
        proc, "POST", "/v2/repository/index", b"{}", Origin=f"http://{here}",
        Content_Type="application/json",
    )
    assert status == 200
    status, _ = send(proc, "POST", "/v2/repository/index", b"{}", Origin="null")
    assert status == 403
    # A different port of the same host is another origin (another service's page).
    status, _ = send(proc, "POST", "/v2/repository/index", b"{}", Origin="http://127.0.0.1:1")
    assert status == 403


def test_triton_clients_work_unchanged(proc: ServerProcess) -> None:
    """tritonclient (geventhttpclient and aiohttp) and libcurl's defaults (Triton's C++
    client, perf_analyzer: application/x-www-form-urlencoded on every control POST)."""
    client = httpclient.InferenceServerClient(proc.http_url)
    client.unload_model("simple")
    client.load_model("simple")
    assert client.is_model_ready("simple")
    tag = uuid.uuid4().hex[:8]
    handle = shm.create_shared_memory_region(f"o-{tag}", f"/edge_origins_{tag}", 64)
    try:
        client.register_system_shared_memory(f"o-{tag}", f"/edge_origins_{tag}", 64)
        client.unregister_system_shared_memory(f"o-{tag}")

        async def aio() -> None:
            async with aiohttpclient.InferenceServerClient(proc.http_url) as aclient:
                await aclient.register_system_shared_memory(f"a-{tag}", f"/edge_origins_{tag}", 64)
                await aclient.unload_model("simple")
                await aclient.load_model("simple")

        asyncio.run(aio())
        # What libcurl sends for Triton's C++ client: its Content-Type, an empty body.
        form = "application/x-www-form-urlencoded"
        status, body = send(
            proc, "POST", f"/v2/systemsharedmemory/region/a-{tag}/unregister", Content_Type=form
        )
        assert status == 200, body
        status, body = send(
            proc, "POST", "/v2/repository/models/simple/load", b"{}", Content_Type=form
        )
        assert status == 200, body
    finally:
        shm.destroy_shared_memory_region(handle)
    inputs = [httpclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    for inp in inputs:
        inp.set_data_from_numpy(np.ones((1, 16), np.int32))
    result = client.infer("simple", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.full((1, 16), 2))


def test_star_turns_the_checks_off(model_repository: Path, tmp_path: Path) -> None:
    with ServerProcess(
        model_repository, "--http-allowed-hosts=*", log_path=tmp_path / "server.log"
    ) as server:
        status, _ = send(server, "GET", "/v2", Host="anything.example")
        assert status == 200
        status, _ = send(
            server, "POST", "/v2/models/simple/infer", INFER, Origin="http://evil.example"
        )
        assert status == 200
