"""The status page's endpoints through a real server: /status.json, /status, /, /openapi.json,
and their restricted-API group."""

from __future__ import annotations

import gzip
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from appliance.frontends.http.status_page import GZIP_JSON_BYTES, read_asset
from tests.integration import status_repo
from tests.integration.status_repo import get, infer_simple, status_json, wait_for
from tests.serverproc import ServerProcess


@pytest.fixture(scope="module")
def status_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = status_repo.build(tmp_path_factory.mktemp("status-models"))
    proc = ServerProcess(root, log_path=tmp_path_factory.mktemp("status") / "server.log")
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()


def _model(doc: dict[str, Any], name: str) -> dict[str, Any]:
    found = [m for m in doc["models"] if m["name"] == name]
    assert found, f"model {name} not in {[m['name'] for m in doc['models']]}"
    model: dict[str, Any] = found[0]
    return model


def test_status_json_shows_the_server_device_and_models(status_server: ServerProcess) -> None:
    doc = status_json(status_server.http_url)
    assert set(doc) == {
        "generated_s", "server", "device", "models", "updates", "recent_problems", "memory"
    }
    assert doc["memory"] is None  # no memory budget flags: docs/memory.md
    server = doc["server"]
    assert server["name"] == "edge-appliance"
    assert server["version"]
    assert server["uptime_s"] >= 0
    assert server["ready"] is True  # a failed model does not make the server unready
    assert any("broken" in problem for problem in server["problems"])
    assert doc["device"]["hostname"]
    assert doc["device"]["cpu_count"] >= 1

    simple = _model(doc, "simple")
    assert simple["state"] == "READY"
    assert simple["platform"] == "onnxruntime_onnx"
    assert [v["version"] for v in simple["versions"]] == [1]
    assert simple["instance_groups"], simple
    assert simple["max_batch_size"] == 8

    broken = _model(doc, "broken")
    assert broken["state"] == "UNAVAILABLE"
    assert broken["versions"][0]["reason"], broken

    updates = doc["updates"]
    assert updates["control_mode"] == "none"
    assert updates["sources"] == []
    assert updates["poll_interval_s"] is None

    # The load failure was logged as a warning or an error, and is in the ring, by model.
    problems = doc["recent_problems"]
    assert any(p["model"] == "broken" and p["level"] in ("WARNING", "ERROR") for p in problems)


def test_live_numbers_follow_traffic(status_server: ServerProcess) -> None:
    url = status_server.http_url
    infer_simple(url, 20)

    def moved() -> dict[str, Any] | None:
        live: dict[str, Any] = _model(status_json(url), "simple")["live"]
        return live if any(p["requests_per_s"] > 0 for p in live["points"]) else None

    live = wait_for(moved, 15, "a rate point for simple's requests")
    assert live["p50_ms"] is not None
    assert live["p50_ms"] > 0
    assert live["p99_ms"] >= live["p50_ms"]
    assert live["error_rate"] == 0
    assert live["window_s"] > 0


def test_root_redirects_and_the_page_is_served(status_server: ServerProcess) -> None:
    base = f"http://{status_server.http_url}"
    code, headers, _ = get(base + "/")
    assert code == 302
    assert headers["Location"] == "/status"
    code, headers, body = get(base + "/status")
    assert code == 200
    assert headers["Content-Type"].startswith("text/html")
    assert "script-src 'self'" in headers["Content-Security-Policy"]
    assert b"/status/status.js" in body
    for name, kind in (("status.js", "text/javascript"), ("status.css", "text/css")):
        code, headers, body = get(f"{base}/status/{name}")
        assert code == 200
        assert headers["Content-Type"].startswith(kind)
        assert "Content-Encoding" not in headers
        assert body == read_asset(name)
        # A browser accepts gzip: the copy gzipped once at start-up, a third of the bytes.
        code, headers, body = get(f"{base}/status/{name}", {"Accept-Encoding": "gzip, br"})
        assert code == 200
        assert headers["Content-Encoding"] == "gzip"
        assert headers["Vary"] == "Accept-Encoding"
        assert gzip.decompress(body) == read_asset(name)
        assert len(body) < len(read_asset(name)) / 2


@pytest.mark.parametrize(
    "path",
    [
        "/status/openapi.json",
        "/status/..%2Fserver.py",
        "/status/status.html.bak",
        "/status/a%0D%0Ab",  # quoted in the answer's reason: escaped, not a 500
    ],
)
def test_only_the_pages_own_files_are_served(status_server: ServerProcess, path: str) -> None:
    code, _, body = get(f"http://{status_server.http_url}{path}")
    assert code == 404
    assert "error" in json.loads(body)


def test_openapi_is_served(status_server: ServerProcess) -> None:
    code, headers, body = get(f"http://{status_server.http_url}/openapi.json")
    assert code == 200
    assert headers["Content-Type"].startswith("application/json")
    assert json.loads(body) == json.loads(read_asset("openapi.json"))


def test_the_status_group_is_restricted(
    start_server: Any, tmp_path: Path
) -> None:
    root = status_repo.build(tmp_path / "models")
    proc = start_server(root, "--http-restricted-api=status:page-key=s3cret")
    base = f"http://{proc.http_url}"
    for path in ("/", "/status", "/status.json", "/status/status.js", "/openapi.json"):
        code, _, body = get(base + path)
        assert code == 403, path
        assert "expecting header 'page-key'" in json.loads(body)["error"]
    code, _, body = get(base + "/status.json", {"page-key": "s3cret"})
    assert code == 200
    assert _model(json.loads(body), "simple")["state"] == "READY"
    code, _, _ = get(base + "/v2/health/ready")  # other groups stay open
    assert code == 200


def test_status_json_follows_its_documented_schema(status_server: ServerProcess) -> None:
    validator = pytest.importorskip("openapi_schema_validator", reason="openapi-schema-validator")
    infer_simple(status_server.http_url, 5)
    wait_for(
        lambda: _model(status_json(status_server.http_url), "simple")["live"]["points"],
        15,
        "a rate point",
    )
    openapi = json.loads(read_asset("openapi.json"))
    components = openapi["components"]
    schema = {**components["schemas"]["StatusReport"], "components": components}
    validator.validate(status_json(status_server.http_url), schema, cls=validator.OAS30Validator)


def test_a_poll_since_a_time_gets_only_the_newer_points(status_server: ServerProcess) -> None:
    url = status_server.http_url
    infer_simple(url, 5)

    def two_points() -> dict[str, Any] | None:
        live: dict[str, Any] = _model(status_json(url), "simple")["live"]
        return live if len(live["points"]) >= 2 else None

    live = wait_for(two_points, 15, "two rate points")
    last = live["points"][-1]["time_s"]
    code, _, body = get(f"http://{url}/status.json?since={live['points'][-2]['time_s']}")
    assert code == 200
    newer = _model(json.loads(body), "simple")["live"]
    assert newer["points"][0]["time_s"] == last  # the older ones are not sent again
    assert newer["ring_points"] >= live["ring_points"]
    assert newer["p50_ms"] is not None  # the window's numbers all the same


@pytest.mark.parametrize("since", ["abc", "nan", "inf", "1e999", "%0A"])
def test_a_bad_since_is_a_400(status_server: ServerProcess, since: str) -> None:
    code, _, body = get(f"http://{status_server.http_url}/status.json?since={since}")
    assert code == 400
    assert "since: expected seconds since the epoch" in json.loads(body)["error"]


def test_a_big_status_json_goes_gzipped(start_server: Any, tmp_path: Path) -> None:
    """12 models: a first poll well over GZIP_JSON_BYTES goes gzipped to a client that takes
    gzip; the page's later polls (?since=) of the 2-model server stay plain."""
    root = tmp_path / "models"
    for i in range(12):
        status_repo.add_simple(root, f"simple_{i}")
    proc = start_server(root)
    url = f"http://{proc.http_url}/status.json"
    code, headers, plain = get(url)
    assert code == 200
    assert "Content-Encoding" not in headers
    assert len(plain) >= GZIP_JSON_BYTES
    code, headers, body = get(url, {"Accept-Encoding": "gzip, deflate"})
    assert code == 200
    assert headers["Content-Encoding"] == "gzip"
    assert headers["Vary"] == "Accept-Encoding"
    doc = json.loads(gzip.decompress(body))
    assert [m["name"] for m in doc["models"]] == sorted(f"simple_{i}" for i in range(12))
    assert len(body) < len(plain) / 3


def test_the_pages_later_polls_stay_plain(status_server: ServerProcess) -> None:
    url = f"http://{status_server.http_url}/status.json?since={time.time() + 60}"
    code, headers, body = get(url, {"Accept-Encoding": "gzip"})
    assert code == 200
    assert len(body) < GZIP_JSON_BYTES
    assert "Content-Encoding" not in headers
    assert json.loads(body)["models"]
