"""`edge-appliance status`: the status summary in a terminal, from a real server's
/status.json; an unreachable server exits 1 with the reason."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.integration import status_repo
from tests.serverproc import ROOT, ServerProcess, free_port


@pytest.fixture(scope="module")
def status_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = status_repo.build(tmp_path_factory.mktemp("status-cli-models"))
    proc = ServerProcess(root, log_path=tmp_path_factory.mktemp("status-cli") / "server.log")
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "appliance", "status", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )


def _model_line(out: str, name: str) -> list[str]:
    rows = [line.split() for line in out.splitlines() if line.split()[:1] == [name]]
    assert rows, f"no row for {name} in:\n{out}"
    return rows[0]


def test_status_names_each_model_and_its_state(status_server: ServerProcess) -> None:
    result = _cli("--url", f"http://{status_server.http_url}")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "edge-appliance" in out
    assert "ready" in out
    simple = _model_line(out, "simple")
    assert simple[1:3] == ["READY", "1"], simple
    broken = _model_line(out, "broken")
    assert broken[1] == "UNAVAILABLE", broken
    assert "version 1 UNAVAILABLE:" in out  # the failed version's reason
    assert "control mode none" in out


def test_status_sends_headers_to_a_restricted_page(tmp_path: Path) -> None:
    root = status_repo.build(tmp_path / "models")
    proc = ServerProcess(
        root, "--http-restricted-api=status:page-key=SECRET", log_path=tmp_path / "server.log"
    )
    try:
        proc.wait_ready()
        url = f"http://{proc.http_url}"
        denied = _cli("--url", url)
        assert denied.returncode == 1
        assert "HTTP 403" in denied.stderr, denied.stderr
        # Which header carries the key, and the flag that sends it.
        assert "expecting header 'page-key'" in denied.stderr, denied.stderr
        assert denied.stderr.rstrip().endswith("send the key with --header page-key=VALUE")
        allowed = _cli("--url", url, "--header", "page-key=SECRET")
        assert allowed.returncode == 0, allowed.stderr
        assert _model_line(allowed.stdout, "simple")[1] == "READY"
    finally:
        proc.stop()


def test_a_url_without_a_scheme_is_http(status_server: ServerProcess) -> None:
    result = _cli("--url", status_server.http_url)  # 127.0.0.1:PORT, as curl takes it
    assert result.returncode == 0, result.stderr
    assert _model_line(result.stdout, "simple")[1] == "READY"


class _CannedStatus(BaseHTTPRequestHandler):
    """Answers GET /status.json with the document the test put on the server."""

    def do_GET(self) -> None:
        body = json.dumps(self.server.doc).encode()  # type: ignore[attr-defined]  # set below
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:  # quiet
        pass


def _canned(doc: dict[str, Any], *args: str) -> subprocess.CompletedProcess[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _CannedStatus)
    server.doc = doc  # type: ignore[attr-defined]  # what the handler answers
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        return _cli("--url", f"http://127.0.0.1:{server.server_address[1]}", *args)
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_columns_fit_the_widest_cell_and_nothing_says_none() -> None:
    long_name = "a_model_name_longer_than_twenty_four_characters"
    doc = {
        "server": {"name": "edge-appliance", "version": None, "ready": True, "uptime_s": 5},
        "device": {"hostname": "box"},
        "models": [
            {
                "name": long_name,
                "state": "READY",
                "versions": [{"version": 1, "state": "READY"}],
                "live": {"requests_per_s": 12345.6, "p50_ms": 1.5, "p99_ms": 2.5, "error_rate": 0},
            },
            {
                "name": "m",
                "state": None,
                "versions": [{"version": None, "state": "UNAVAILABLE", "reason": "broken"}],
                "live": {},
            },
        ],
        "updates": {"control_mode": "none"},
        "recent_problems": [
            {"time_s": 1_700_000_000 + i, "level": "ERROR", "message": f"problem {i}"}
            for i in range(8)
        ],
    }
    result = _canned(doc)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "None" not in out, out
    lines = out.splitlines()
    header = next(line for line in lines if line.startswith("MODEL"))
    row = next(line for line in lines if line.startswith(long_name))
    other = next(line for line in lines if line.startswith("m "))
    # Every column starts where its heading starts, in every row.
    for heading in ("STATE", "VERSIONS"):
        at = header.index(heading)
        for line in (row, other):
            assert line[at - 2 : at] == "  ", (heading, header, line)
            assert line[at] != " ", (heading, header, line)
    # Right-aligned numbers end where their heading ends.
    end = header.index("REQ/S") + len("REQ/S")
    assert row[:end].endswith("12345.6"), (header, row)
    assert other[:end].endswith("-"), (header, other)
    # The problem list is cut to the newest 5, and says so.
    assert "problem 7" in out
    assert "problem 3" in out
    assert "problem 2" not in out
    assert "and 3 more problems (see --json)" in out
    full = _canned(doc, "--json")
    assert full.returncode == 0, full.stderr
    assert len(json.loads(full.stdout)["recent_problems"]) == 8


def test_unreachable_server_exits_1_with_the_reason() -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    for extra in ((), ("--watch", "1")):
        result = _cli("--url", url, *extra)
        assert result.returncode == 1, (extra, result)
        assert f"cannot reach the server at {url}" in result.stderr
        assert "refused" in result.stderr.lower(), result.stderr


def test_watch_refreshes_and_ctrl_c_exits_0(status_server: ServerProcess) -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "appliance",
            "status",
            "--url",
            f"http://{status_server.http_url}",
            "--watch",
            "0.5",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        # Ctrl-C as in a terminal: a test run started in the background inherits SIGINT
        # ignored, and Python then never raises KeyboardInterrupt.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        time.sleep(4)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert out.count("\x1b[2J") >= 2, out  # cleared and printed again
    assert out.count("simple") >= 2


def test_status_shows_fallbacks_and_switches(start_server: Any, tmp_path: Path) -> None:
    root = status_repo.build_ready(tmp_path / "models")
    proc = start_server(root, "--model-control-mode=poll", "--repository-poll-secs=0.5")

    def updates(name: str) -> dict[str, Any]:
        doc = status_repo.status_json(proc.http_url)
        return next(m for m in doc["updates"]["models"] if m["name"] == name)

    # A switch is seen between two samples of the sampler (every 2 s): version 1 first.
    status_repo.wait_for(lambda: updates("simple")["last_switch"], 20, "version 1 seen")
    staging = tmp_path / "staging-2"
    shutil.copytree(root / "simple" / "1", staging)
    staging.rename(root / "simple" / "2")
    status_repo.wait_for(
        lambda: (updates("simple")["last_switch"] or {}).get("to_versions") == [2],
        20,
        "the switch to version 2",
    )
    result = _cli("--url", f"http://{proc.http_url}")
    assert result.returncode == 0, result.stderr
    assert "simple: v1 -> v2 at " in result.stdout
    doc = status_repo.status_json(proc.http_url)
    gpu_model = next(m for m in doc["models"] if m["name"] == "simple_gpu")
    reasons = {i["reason"] for i in gpu_model["instances"]} - {""}
    for reason in reasons:  # on a machine without a usable GPU: why they run on CPU
        assert f"2 instance(s) on CPU: {reason}" in result.stdout
