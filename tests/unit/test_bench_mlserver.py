"""bench/mlserver.py's parts that need no MLServer: wrk's output, the request and the check of
replies, the ratios; and, where wrk and the MLServer venv exist, the real wrk and the model."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from bench.mlserver import (
    INFER_PATH,
    MODEL_SOURCE,
    Point,
    Setting,
    Target,
    best,
    check_answer,
    default_venv,
    lua_script,
    parse_wrk,
    reply_problem,
    request_body,
    round_ratio,
    run_wrk,
    table,
)

# Real wrk 4.1.0 output with bench.mlserver's Lua script, against bench.ceiling_http (c=8, 1 s).
WRK_OK = """\
Running 1s test @ http://127.0.0.1:38839/v2/models/simple/infer
  1 threads and 8 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     4.10ms    4.03ms  18.79ms   82.58%
    Req/Sec     2.50k   842.40     3.97k    72.73%
  Latency Distribution
     50%    1.78ms
     75%    6.51ms
     90%   10.24ms
     99%   14.65ms
  2737 requests in 1.10s, 1.05MB read
Requests/sec:   2495.98
Transfer/sec:      0.95MB
WRK_RESULT {"requests":2737,"duration_us":1096565,"status_errors":0,"connect_errors":0,\
"read_errors":0,"write_errors":0,"timeout_errors":0,"p50_us":1784,"p99_us":14645}
"""

# The same against a model that does not exist: every answer a 404.
WRK_404 = """\
Running 1s test @ http://127.0.0.1:38839/v2/models/nosuch/infer
  1 threads and 8 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     2.42ms    4.44ms  26.86ms   90.65%
    Req/Sec     7.83k     3.62k   13.49k    75.00%
  Latency Distribution
     50%  582.00us
     75%    2.24ms
     90%    6.50ms
     99%   23.01ms
  6243 requests in 1.00s, 1.10MB read
  Non-2xx or 3xx responses: 6243
Requests/sec:   6236.43
Transfer/sec:      1.10MB
WRK_RESULT {"requests":6243,"duration_us":1001053,"status_errors":6243,"connect_errors":0,\
"read_errors":0,"write_errors":0,"timeout_errors":0,"p50_us":582,"p99_us":23011}
"""

# MLServer 1.7.1's real reply to request_body() (AddSub from MODEL_SOURCE, parallel workers 1).
MLSERVER_REPLY = (
    b'{"model_name":"simple","id":"3adbd305-4d4f-4e66-914a-1427bf658de4","parameters":{},'
    b'"outputs":[{"name":"OUTPUT0","shape":[1,16],"datatype":"INT32","parameters":'
    b'{"content_type":"np"},"data":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16]},{"name":"OUTPUT1",'
    b'"shape":[1,16],"datatype":"INT32","parameters":{"content_type":"np"},'
    b'"data":[-1,0,1,2,3,4,5,6,7,8,9,10,11,12,13,14]}]}'
)


def test_a_clean_wrk_run_is_read_from_its_own_summary() -> None:
    result = parse_wrk(WRK_OK)
    assert result.requests == 2737
    assert result.problem() is None
    assert (result.p50_ms, result.p99_ms) == (1.784, 14.645)
    printed = float(re.search(r"Requests/sec:\s+([\d.]+)", WRK_OK).group(1))  # type: ignore[union-attr]
    assert result.infer_per_s == pytest.approx(printed, rel=1e-3)


def test_a_run_with_error_answers_does_not_count() -> None:
    result = parse_wrk(WRK_404)
    assert result.requests == 6243
    assert result.problem() == "wrk saw 6243 non-2xx"
    assert parse_wrk(WRK_OK.replace('"read_errors":0', '"read_errors":3')).problem() == (
        "wrk saw 3 read"
    )
    nothing = WRK_OK.replace('"requests":2737', '"requests":0')
    assert parse_wrk(nothing).problem() == "wrk completed no request"
    assert parse_wrk(nothing).problem(warm_up=True) is None
    assert parse_wrk(WRK_404).problem(warm_up=True) == "wrk saw 6243 non-2xx"


def test_wrk_output_without_a_summary_is_an_error() -> None:
    refused = "unable to connect to 127.0.0.1:1 Connection refused\n"  # real, exit status 1
    with pytest.raises(ValueError, match="unable to connect"):
        parse_wrk(refused)


def test_the_request_and_the_check_of_replies() -> None:
    body = json.loads(request_body())
    assert [i["name"] for i in body["inputs"]] == ["INPUT0", "INPUT1"]
    assert all(i["shape"] == [1, 16] and i["datatype"] == "INT32" for i in body["inputs"])
    assert body["inputs"][0]["data"] == list(range(16))
    assert reply_problem(200, MLSERVER_REPLY) is None
    wrong = MLSERVER_REPLY.replace(b"[-1,0,1,", b"[-1,0,2,")
    assert reply_problem(200, wrong).startswith("wrong OUTPUT1")  # type: ignore[union-attr]
    assert reply_problem(400, b'{"error":"bad"}').startswith("HTTP 400")  # type: ignore[union-attr]
    assert reply_problem(200, b"<html>").startswith("unreadable")  # type: ignore[union-attr]


def test_the_lua_script_posts_the_body_and_prints_a_summary() -> None:
    script = lua_script(request_body())
    assert 'wrk.method = "POST"' in script
    assert f"wrk.body = [==[{request_body().decode()}]==]" in script
    assert "done = function(summary, latency, requests)" in script
    with pytest.raises(ValueError, match="Lua"):
        lua_script(b'{"a": "]==]"}')


def test_ratios_are_medians_of_the_rounds_in_the_better_direction() -> None:
    nan = math.nan
    # throughput: ours over theirs per round (3.0, 2.0; the round with a gap is left out)
    assert round_ratio([3000, 2800, nan], [1000, 1400, 900], cost=False) == 2.5
    # CPU per request: theirs over ours, so > 1 means ours is cheaper
    assert round_ratio([200, 250, 100], [600, 500, 0], cost=True) == 2.5
    assert math.isnan(round_ratio([nan], [1.0], cost=False))


def point(rate: float, cpu_us: float) -> Point:
    return Point(rate, 1.0, 2.0, cpu_us, 0.0)


def test_the_reference_is_the_fastest_and_the_cheapest_setting() -> None:
    def target(name: str, *points: Point) -> Target:
        return Target("MLServer", name, server=None, points=list(points))  # type: ignore[arg-type]

    w0 = target("w0", point(1000, 900), point(1100, 800), point(math.nan, math.nan))
    w1 = target("w1", point(900, 700), point(950, 750), point(800, 790))
    broken = target("w2", point(math.nan, math.nan))
    assert best([w0, w1, broken], "infer_per_s", highest=True) is w0
    assert best([w0, w1, broken], "cpu_us", highest=False) is w1
    assert best([broken], "infer_per_s", highest=True) is None


def test_the_table_gives_medians_and_marks_starved_points() -> None:
    quiet = Point(3000, 1.0, 2.0, 300, 10.0, server_pct=90.0)
    starved = Point(200, 9.0, 900.0, 700, 150.0, server_pct=14.0)
    lost = Point(math.nan, math.nan, math.nan, math.nan, math.nan, problem="wrk saw 1 non-2xx")
    target = Target("MLServer", "w0", server=None, points=[quiet, starved, lost])  # type: ignore[arg-type]
    header, _, row = table([target])
    assert header.startswith("| server | setting | infer/s |")
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert cells == [
        "MLServer", "w0", "1,600", "5.00", "451.00", "500", "52%", "80%",
        "3,000 / 200* / -", "300 / 700* / -",
    ]  # fmt: skip


def test_settings() -> None:
    setting = Setting.parse("w1+h11+gzip")
    assert (setting.workers, setting.httptools, setting.gzip, setting.metrics) == (
        1,
        False,
        True,
        False,
    )
    assert setting.name == "w1+h11+gzip"
    config = Setting.parse("w0").settings_json(8080)
    assert config["parallel_workers"] == 0
    assert config["metrics_endpoint"] is None
    assert (config["gzip_enabled"], config["debug"], config["http_port"]) == (False, False, 8080)
    with pytest.raises(ValueError, match="bad MLServer setting"):
        Setting.parse("w1+fast")


class Answer(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as wrk expects
    reply = MLSERVER_REPLY

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        status = 200 if self.path == INFER_PATH else 404
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(self.reply)))
        self.end_headers()
        self.wfile.write(self.reply)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def answering() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join()


@pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk is not on PATH (apt-get install wrk)")
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="the bench pins wrk to core 1")
def test_real_wrk_and_check_against_a_loopback_server(
    answering: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = tmp_path / "post.lua"
    script.write_text(lua_script(request_body()))
    result = run_wrk(shutil.which("wrk") or "", script, answering, 1, 4)
    assert result.problem() is None
    assert result.requests > 10
    assert check_answer(answering) is None
    monkeypatch.setattr(Answer, "reply", MLSERVER_REPLY.replace(b"16]}", b"17]}"))
    assert check_answer(answering).startswith("wrong OUTPUT0")  # type: ignore[union-attr]


MLSERVER_PYTHON = default_venv() / "bin" / "python"
RUN_MODEL = """
import asyncio, sys
sys.path.insert(0, sys.argv[1])
from model import AddSub
from mlserver.settings import ModelSettings
from mlserver.types import InferenceRequest

async def main():
    model = AddSub(ModelSettings(name="simple", implementation=AddSub))
    assert await model.load()
    reply = await model.predict(InferenceRequest.model_validate_json(sys.argv[2]))
    print(reply.model_dump_json())

asyncio.run(main())
"""


@pytest.mark.skipif(
    not MLSERVER_PYTHON.exists(),
    reason=f"no MLServer venv at {default_venv()} (python -m bench.mlserver makes it)",
)
def test_the_mlserver_model_adds_and_subtracts(tmp_path: Path) -> None:
    (tmp_path / "model.py").write_text(MODEL_SOURCE)
    done = subprocess.run(
        [str(MLSERVER_PYTHON), "-c", RUN_MODEL, str(tmp_path), request_body().decode()],
        capture_output=True,
        timeout=60,
        check=True,
    )
    assert reply_problem(200, done.stdout) is None
