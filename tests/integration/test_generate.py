"""Triton's generate extension over HTTP: /generate and /generate_stream (server-sent events)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.serverproc import ServerProcess


def _post(server: ServerProcess, path: str, body: dict) -> tuple[int, bytes, str]:  # type: ignore[type-arg]
    request = urllib.request.Request(
        f"http://{server.http_url}{path}", data=json.dumps(body).encode(), method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, resp.read(), resp.headers.get("Content-Type", "")
    except urllib.error.HTTPError as err:
        return err.code, err.read(), err.headers.get("Content-Type", "")


def _events(body: bytes) -> list[dict]:  # type: ignore[type-arg]
    return [
        json.loads(line[len(b"data: ") :])
        for line in body.split(b"\n")
        if line.startswith(b"data: ")
    ]


def test_generate_maps_fields_to_inputs_and_outputs_to_fields(server: ServerProcess) -> None:
    status, body, _ = _post(
        server, "/v2/models/simple/generate", {"INPUT0": list(range(16)), "INPUT1": [1] * 16}
    )
    assert status == 200, body
    doc = json.loads(body)
    assert doc["model_name"] == "simple"
    assert doc["OUTPUT0"] == [i + 1 for i in range(16)]
    assert doc["OUTPUT1"] == [i - 1 for i in range(16)]


@pytest.mark.parametrize(("count", "expected"), [(3, [0, 1, 2]), (0, [])])
def test_generate_stream_sends_one_event_per_response(
    server: ServerProcess, count: int, expected: list[int]
) -> None:
    status, body, content_type = _post(
        server, "/v2/models/py_repeat/generate_stream", {"IN": count}
    )
    assert status == 200
    assert content_type.startswith("text/event-stream")
    assert [event["OUT"] for event in _events(body)] == expected


def test_generate_refuses_several_responses_and_bad_input(server: ServerProcess) -> None:
    status, body, _ = _post(server, "/v2/models/py_repeat/generate", {"IN": 2})
    assert status == 400
    assert "expected a single response, got more" in json.loads(body)["error"]
    assert "use generate_stream" in json.loads(body)["error"]
    status, body, _ = _post(server, "/v2/models/simple/generate", {"INPUT0": ["x"] * 16})
    assert status == 400
    assert "input 'INPUT0'" in json.loads(body)["error"]


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def test_generate_on_a_decoupled_model_stops_at_the_second_response(
    server: ServerProcess,
) -> None:
    """A model that sends 200,000 responses: refused at the second, and nothing is held (the
    old server kept every response until the last: +180 MB). The responses the model goes
    on sending are dropped (issue 31, item 10)."""
    before = _rss_bytes(server.proc.pid)
    status, body, _ = _post(server, "/v2/models/py_repeat/generate", {"IN": 200_000})
    assert status == 400
    assert "sent a second one; the request is cancelled" in json.loads(body)["error"]
    # The model sends the rest meanwhile (it does not look at is_cancelled()): wait until
    # its instance is free again, then look at what the server holds.
    deadline = time.monotonic() + 60
    while True:
        status, body, _ = _post(server, "/v2/models/py_repeat/generate", {"IN": 1})
        if status == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert status == 200, body
    grown = _rss_bytes(server.proc.pid) - before
    assert grown < 48 << 20, f"the server grew by {grown >> 20} MiB"
