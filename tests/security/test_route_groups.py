"""Route completeness: every route and RPC of every listener sits in a restricted-API group.

The routes are enumerated from the application objects the server serves (the aiohttp app
`HttpFrontend.build` makes, the metrics app, gRPC's service descriptor that `add_to_server`
registers every RPC of), so a route added outside a group fails here with its name. Then a
running server with every group restricted answers each route, on every listener (TCP over
TLS and the Unix socket, HTTP and gRPC), 403 / PERMISSION_DENIED without the key: the
groups are applied on each path a request can take, the infer fast path included.
"""

from __future__ import annotations

import json
import re
import ssl
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from tritonclient.grpc import service_pb2 as pb

from appliance.common.access import APIS
from appliance.frontends.grpc.server import API_OF, SERVICE
from appliance.frontends.http.fastpath import _INFER_PATH
from appliance.frontends.http.server import HttpFrontend
from appliance.frontends.metrics import metrics_app
from configs.generate import SIMPLE_CONFIG, save, simple_model
from tests.pki import self_signed
from tests.security.harness import Http
from tests.serverproc import ServerProcess

KEY = "k3y"
ALL_GROUPS = ",".join(APIS) + ":admin-key=" + KEY

# Routes in no group on purpose, each with the reason.
UNRESTRICTED = {
    # aiohttp's catch-all: answers 404 "Not Found" or 405 "Method Not Allowed", nothing else.
    ("*", "/{tail}"): "answers 404 only",
}
# The metrics listener serves one read-only route on its own port (--metrics-address, a
# listener of its own that an operator binds or firewalls apart, as in tritonserver, whose
# restricted-API flags do not cover it either).
METRICS_UNRESTRICTED = {("GET", "/metrics"): "its own listener, read-only"}


def _example(path: str) -> str:
    """A concrete path for a route's pattern."""
    values = {"model": "simple", "version": "1", "region": "r", "asset": "app.js"}
    return re.sub(r"\{(\w+)(?::[^}]*)?\}", lambda m: values.get(m.group(1), "x"), path)


def _http_app() -> tuple[HttpFrontend, Any]:
    frontend = HttpFrontend(
        None,  # type: ignore[arg-type]  # building the routes touches no service
        None,  # type: ignore[arg-type]
        1,
        shared_memory=None,  # type: ignore[arg-type]
        limits=None,  # type: ignore[arg-type]
        status=object(),  # type: ignore[arg-type]
    )
    return frontend, frontend.build()


def _served_routes() -> list[tuple[str, str, tuple[str, ...]]]:
    """(method, path pattern, groups) of every route of the HTTP app; () if none. A route
    that shows what several APIs show (/status.json) needs each of their keys."""
    frontend, app = _http_app()
    found = []
    for route in app.router.routes():
        key = (route.method, route.resource.canonical)
        found.append((*key, frontend.route_groups.get(key, ())))
    return found


def test_every_http_route_is_in_a_group() -> None:
    routes = _served_routes()
    assert len(routes) > 40  # the app was enumerated, not an empty router
    outside = [
        f"{method} {path}"
        for method, path, groups in routes
        if (not groups or not set(groups) <= set(APIS)) and (method, path) not in UNRESTRICTED
    ]
    assert not outside, f"routes in no restricted-API group: {outside}"
    # The status page and generate routes are among them.
    groups = {path: group for _, path, group in routes}
    assert groups["/status.json"][0] == "status"
    assert "model-repository" in groups["/status.json"]
    assert groups["/v2/models/{model}/generate_stream"] == ("inference",)


def test_the_infer_fast_path_takes_only_inference_routes() -> None:
    """fastpath.py answers what its pattern matches before aiohttp's router: any route it
    would take must be in the inference group (it checks that group itself)."""
    for method, path, groups in _served_routes():
        if method == "POST" and _INFER_PATH.fullmatch(_example(path).encode()):
            assert groups == ("inference",), path
    assert _INFER_PATH.fullmatch(b"/v2/models/simple/versions/1/infer")


def test_every_rpc_is_in_a_group() -> None:
    names = [method.name for method in SERVICE.methods]
    assert "ModelInfer" in names
    assert "RepositoryModelLoad" in names
    outside = [name for name in names if API_OF.get(name) not in APIS]
    assert not outside, f"RPCs in no restricted-API group: {outside}"
    assert set(API_OF) <= set(names), set(API_OF) - set(names)


def test_the_metrics_listener_serves_only_its_route() -> None:
    app = metrics_app(None)  # type: ignore[arg-type]  # building touches no registry
    routes = {(r.method, r.resource.canonical) for r in app.router.routes()}
    routes -= {("HEAD", "/metrics")}  # add_get's own HEAD
    assert routes == set(METRICS_UNRESTRICTED), routes


@pytest.fixture(scope="module")
def locked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Path, Path]]:
    """A server with every group restricted, on TLS and Unix sockets for HTTP and gRPC."""
    root = tmp_path_factory.mktemp("routes_repo")
    save(simple_model(), root / "simple" / "1" / "model.onnx")
    (root / "simple" / "config.pbtxt").write_text(SIMPLE_CONFIG)
    certs = tmp_path_factory.mktemp("routes_pki")
    cert, key = self_signed(certs, "server")
    sockets = Path("/tmp") / f"edge-routes-{uuid.uuid4().hex[:8]}"
    sockets.mkdir()
    proc = ServerProcess(
        root,
        f"--http-ssl-cert={cert}",
        f"--http-ssl-key={key}",
        "--grpc-use-ssl=true",
        f"--grpc-server-cert={cert}",
        f"--grpc-server-key={key}",
        f"--http-unix-socket={sockets / 'http.sock'}",
        f"--grpc-unix-socket={sockets / 'grpc.sock'}",
        f"--http-restricted-api={ALL_GROUPS}",
        f"--grpc-restricted-protocol={ALL_GROUPS}",
        log_path=tmp_path_factory.mktemp("routes_logs") / "server.log",
    )
    try:
        unix = Http(unix_path=str(sockets / "http.sock"))
        deadline = time.monotonic() + 120
        while True:
            assert proc.proc.poll() is None, proc.log()
            try:
                if unix.request("GET", "/v2/health/ready", headers={"admin-key": KEY})[0] == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, proc.log()
            time.sleep(0.1)
        yield proc, sockets, cert
    finally:
        proc.stop()
        for path in sockets.glob("*"):
            path.unlink()
        sockets.rmdir()


class _Tls(Http):
    """Http over TLS to the TCP listener."""

    def __init__(self, port: int, cafile: Path) -> None:
        super().__init__("127.0.0.1", port)
        self.context = ssl.create_default_context(cafile=str(cafile))

    def connect(self):  # type: ignore[no-untyped-def]
        return self.context.wrap_socket(super().connect(), server_hostname="localhost")


def test_a_locked_server_refuses_every_route_on_every_listener(locked) -> None:  # type: ignore[no-untyped-def]
    proc, sockets, cert = locked
    listeners = {
        "tls": _Tls(proc.http_port, cert),
        "unix": Http(unix_path=str(sockets / "http.sock")),
    }
    routes = [r for r in _served_routes() if (r[0], r[1]) not in UNRESTRICTED]
    for where, http in listeners.items():
        for method, path, groups in routes:
            body = json.dumps({}).encode() if method == "POST" else b""
            status, answer = http.request(method, _example(path), body)
            assert status == 403, (where, method, path, status, answer[:200])
            assert f"({groups[0]} API)".encode() in answer, answer
            # With the key the route is reached (whatever it then answers): not a 403.
            status, answer = http.request(method, _example(path), body, {"admin-key": KEY})
            assert b"This API is restricted" not in answer, (where, method, path)
        # The fast path's infer with a binary body, and a path the router does not know.
        header = b'{"inputs": []}'
        status, _ = http.request(
            "POST",
            "/v2/models/simple/infer",
            header,
            {"Inference-Header-Content-Length": str(len(header))},
        )
        assert status == 403, where
        assert http.request("GET", "/no/such/route")[0] == 404


def test_a_locked_server_refuses_every_rpc_on_every_listener(locked) -> None:  # type: ignore[no-untyped-def]
    proc, sockets, cert = locked
    credentials = grpc.ssl_channel_credentials(cert.read_bytes())
    channels = {
        "tls": grpc.secure_channel(f"localhost:{proc.grpc_port}", credentials),
        "unix": grpc.insecure_channel(f"unix://{sockets / 'grpc.sock'}"),
    }
    for where, channel in channels.items():
        with channel:
            for method in SERVICE.methods:
                path = f"/{SERVICE.full_name}/{method.name}"
                request = getattr(pb, method.input_type.name)()
                if method.name == "ModelStreamInfer":
                    call = channel.stream_stream(path)(iter([request.SerializeToString()]))
                    with pytest.raises(grpc.RpcError) as err:
                        list(call)
                else:
                    with pytest.raises(grpc.RpcError) as err:
                        channel.unary_unary(path)(request.SerializeToString(), timeout=30)
                assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED, (where, path)
                assert f"({API_OF[method.name]} API)" in (err.value.details() or "")
    # With the key: served.
    channel = grpc.insecure_channel(f"unix://{sockets / 'grpc.sock'}")
    with channel:
        answer = channel.unary_unary(f"/{SERVICE.full_name}/ServerLive")(
            pb.ServerLiveRequest().SerializeToString(),
            metadata=(("triton-grpc-protocol-admin-key", KEY),),
            timeout=30,
        )
    assert pb.ServerLiveResponse.FromString(answer).live
