"""A remote repository that cannot be synced (a misspelled bucket) is named, with its reason,
everywhere the device reports health: `/v2/health/ready?verbose=true`, the status page's
`status.json` and `edge-appliance status`; readiness itself stays ready on the local models
(issue 37, item 3)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import onnx
import pytest

from tests.integration.models import _add_constant_model
from tests.s3servers import S3Server, moto_server
from tests.serverproc import ROOT


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with moto_server() as server:
        yield server


def _verbose_ready(http_url: str) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(f"http://{http_url}/v2/health/ready?verbose=true")
    try:
        with urllib.request.urlopen(request, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_a_misspelled_bucket_is_named_in_readiness_status_json_and_the_status_command(
    start_server, s3: S3Server, tmp_path: Path
) -> None:
    local = tmp_path / "local"
    (local / "here" / "1").mkdir(parents=True)
    (local / "here" / "config.pbtxt").write_text(
        'name: "here"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 4\n'
    )
    onnx.save(_add_constant_model(3), str(local / "here" / "1" / "model.onnx"))
    s3.make_bucket("real-bucket")
    url = f"s3://{s3.host_port}/reel-bucket/models"  # the typo
    proc = start_server([local, url], f"--model-store-dir={tmp_path / 'store'}", env=s3.env())
    deadline = time.monotonic() + 30
    while True:
        status, body = _verbose_ready(proc.http_url)
        named = [p for p in body["problems"] if "reel-bucket" in p]
        if named or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    # Ready: the local model serves, as an unattended device must go on doing.
    assert status == 200, body
    assert body["ready"] is True
    assert named, f"the failing source is not named in the verbose readiness: {body}"
    assert "unreachable" in named[0]
    assert "does not exist" in named[0]  # the reason: NoSuchBucket
    with urllib.request.urlopen(f"http://{proc.http_url}/status.json", timeout=5) as resp:
        doc = json.loads(resp.read())
    assert any("reel-bucket" in p and "does not exist" in p for p in doc["server"]["problems"])
    out = subprocess.run(
        [sys.executable, "-m", "appliance", "status", "--url", f"http://{proc.http_url}"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    ).stdout
    lines = [line for line in out.splitlines() if "reel-bucket" in line]
    assert any("problem" in line and "does not exist" in line for line in lines), out
