"""Log flags and Triton's logging extension (`/v2/logging`, gRPC LogSettings) with tritonclient."""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from configs.generate import SIMPLE_CONFIG, save, simple_model
from tests.serverproc import ServerProcess

DEFAULTS = {
    "log_file": "",
    "log_info": True,
    "log_warning": True,
    "log_error": True,
    "log_verbose_level": 0,
    "log_format": "default",
}
ISO_LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (INFO|WARNING|ERROR|DEBUG) ")


def _repo(root: Path) -> Path:
    save(simple_model(), root / "simple" / "1" / "model.onnx")
    (root / "simple" / "config.pbtxt").write_text(SIMPLE_CONFIG)
    return root


def _grown(path: Path, since: int, pattern: str, timeout_s: float = 10) -> str:
    """What the log gained after byte `since`, once it holds `pattern`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = path.read_bytes()[since:].decode(errors="replace")
        if pattern in text:
            return text
        time.sleep(0.02)
    raise AssertionError(f"{pattern!r} not logged to {path}:\n{path.read_text()}")


def _grpc_settings(client: grpcclient.InferenceServerClient) -> dict[str, object]:
    settings = client.get_log_settings(as_json=True)["settings"]
    return {key: next(iter(value.values())) for key, value in settings.items()}


def test_log_settings_over_http_and_grpc_change_the_log(
    start_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    log_file = tmp_path / "server.log"
    proc = start_server(
        _repo(tmp_path / "models"),
        "--model-control-mode=explicit",
        "--load-model=simple",
        f"--log-file={log_file}",
        "--log-format=ISO8601",
    )
    http = httpclient.InferenceServerClient(proc.http_url)
    grpc_client = grpcclient.InferenceServerClient(proc.grpc_url)
    assert "logging" in http.get_server_metadata()["extensions"]

    # --log-file: the log goes there (ISO 8601 stamps), not to stderr.
    lines = log_file.read_text().splitlines()
    assert any("server is ready" in line for line in lines)
    assert all(ISO_LINE.match(line) for line in lines), lines
    assert "server is ready" not in proc.log()

    expected = {**DEFAULTS, "log_file": str(log_file), "log_format": "ISO8601"}
    assert http.get_log_settings() == expected
    assert _grpc_settings(grpc_client) == expected

    # Verbose level 1: each HTTP request and gRPC call is a debug line.
    size = log_file.stat().st_size
    assert http.update_log_settings({"log_verbose_level": 1})["log_verbose_level"] == 1
    http.is_server_live()
    grpc_client.is_server_live()
    grown = _grown(log_file, size, "gRPC call: ServerLive")
    assert "DEBUG appliance.frontends.http.server: HTTP request: GET /v2/health/live" in grown

    # Over gRPC: verbose off and info off; a model reload then logs nothing.
    updated = grpc_client.update_log_settings(
        {"log_verbose_level": 0, "log_info": False}, as_json=True
    )["settings"]
    assert updated["log_info"] == {"bool_param": False}
    assert updated["log_file"] == {"string_param": str(log_file)}
    size = log_file.stat().st_size
    http.unload_model("simple")
    http.load_model("simple")
    http.is_server_live()
    assert log_file.stat().st_size == size

    # Info on again, as JSON lines: the same reload is logged.
    settings = http.update_log_settings({"log_info": True, "log_format": "json"})
    assert settings == {**expected, "log_format": "json"}
    size = log_file.stat().st_size
    http.unload_model("simple")
    http.load_model("simple")
    grown = _grown(log_file, size, "is READY")
    records = [json.loads(line) for line in grown.splitlines()]
    assert {"ts", "level", "logger", "msg"} <= set(records[0])
    assert any(r["msg"] == "model 'simple' unloaded" and r["level"] == "info" for r in records), (
        records
    )


@pytest.mark.parametrize(
    ("change", "status", "message"),
    [
        ({"log_info": "false"}, "400", "log setting 'log_info' must be a boolean"),
        ({"log_verbose_level": -1}, "400", "'log_verbose_level' must be an integer >= 0, got -1"),
        ({"log_verbose_level": "1"}, "400", "'log_verbose_level' must be an integer >= 0"),
        ({"log_format": "xml"}, "400", "must be one of default, ISO8601, json; got 'xml'"),
        ({"log_colour": True}, "400", "unknown log setting 'log_colour'"),
        (
            {"log_file": "/etc/passwd"},
            "501",
            "log file location can not be updated through network protocol",
        ),
    ],
)
def test_bad_log_settings_over_http(
    server: ServerProcess, change: dict[str, object], status: str, message: str
) -> None:
    http = httpclient.InferenceServerClient(server.http_url)
    before = http.get_log_settings()
    with pytest.raises(InferenceServerException, match=re.escape(message)) as err:
        http.update_log_settings({"log_warning": False, **change})
    assert err.value.status() == status
    assert http.get_log_settings() == before  # nothing applied, not even log_warning


def test_bad_log_settings_over_grpc(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException, match="unknown log setting 'log_colour'") as err:
        client.update_log_settings({"log_colour": True})
    assert err.value.status() == "StatusCode.INVALID_ARGUMENT"
    with pytest.raises(InferenceServerException, match="must be one of default") as err:
        client.update_log_settings({"log_format": "xml"})
    assert err.value.status() == "StatusCode.INVALID_ARGUMENT"
    # A wrong type, which tritonclient never sends: a number for a boolean.
    request = service_pb2.LogSettingsRequest()
    request.settings["log_info"].uint32_param = 1
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as rpc_err:
            stub.LogSettings(request)
    assert rpc_err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "log setting 'log_info' must be a boolean (true or false), got 1" in str(
        rpc_err.value.details()
    )


def test_journal_lines_carry_syslog_priorities(tmp_path: Path) -> None:
    log_path = tmp_path / "journal.log"
    log_path.touch()  # the "journal": stderr is this file, and JOURNAL_STREAM names it
    info = os.stat(log_path)
    proc = ServerProcess(
        _repo(tmp_path / "models"),
        "--http-thread-count=4",  # ignored, with a warning that --log-warning=false hides
        "--log-warning=false",
        log_path=log_path,
        env={"JOURNAL_STREAM": f"{info.st_dev}:{info.st_ino}"},
    )
    try:
        proc.wait_ready()
    finally:
        assert proc.stop() == 0
    lines = proc.log().splitlines()
    assert "<6>appliance.server.app: server is ready: 1 of 1 model ready" in lines
    ours = [line for line in lines if line.startswith("<")]
    assert all(re.match(r"<[3-7]>[a-z_.]+: ", line) for line in ours), ours
    assert "--http-thread-count" not in proc.log()
