"""bench.inprocess: each point runs the real server in a fresh process and measures requests
that were really answered (the check line comes from the answer)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.common import ROOT
from bench.inprocess import POINTS, http_request, measure
from bench.mlserver import write_simple


def test_the_http_requests_are_what_tritonclient_sends() -> None:
    for binary in (False, True):
        head, _, body = http_request(binary).partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        assert lines[0] == b"POST /v2/models/simple/infer HTTP/1.1"
        fields = dict(line.split(b": ", 1) for line in lines[1:])
        assert int(fields[b"Content-Length"]) == len(body)
        json_length = int(fields.get(b"Inference-Header-Content-Length", len(body)))
        doc = json.loads(body[:json_length])
        assert [i["name"] for i in doc["inputs"]] == ["INPUT0", "INPUT1"]
        assert len(body) - json_length == (128 if binary else 0)


@pytest.mark.parametrize("point", POINTS)
def test_each_point_measures_answered_requests(point: str, tmp_path: Path) -> None:
    repository = str(write_simple(tmp_path))
    figures, check = measure(ROOT, repository, point, requests=200, rounds=2, core=0)
    assert len(figures) == 2, check
    assert all(0 < us < 100_000 for us in figures)
    assert check == ("OUTPUT0 right" if point == "grpc" else "HTTP/1.1 200 OK")
