"""A small repository for the status page's tests: `simple` and `broken` (fails to load)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.http as httpclient

from configs.generate import SIMPLE_CONFIG, save, simple_model


def build(root: Path) -> Path:
    save(simple_model(), root / "simple" / "1" / "model.onnx")
    (root / "simple" / "config.pbtxt").write_text(SIMPLE_CONFIG)
    (root / "broken" / "1").mkdir(parents=True)
    (root / "broken" / "1" / "model.onnx").write_bytes(b"not an onnx model")
    (root / "broken" / "config.pbtxt").write_text(
        SIMPLE_CONFIG.replace('"simple"', '"broken"')
    )
    return root


def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    """Status, headers and body of a GET (no redirect followed)."""

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any, **kwargs: Any) -> None:
            return None

    opener = urllib.request.build_opener(NoRedirect)
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with opener.open(request, timeout=10) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def status_json(http_url: str) -> dict[str, Any]:
    code, _, body = get(f"http://{http_url}/status.json")
    assert code == 200, body
    doc: dict[str, Any] = json.loads(body)
    return doc


def infer_simple(http_url: str, count: int) -> None:
    client = httpclient.InferenceServerClient(http_url)
    inputs = [
        httpclient.InferInput("INPUT0", [1, 16], "INT32"),
        httpclient.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    for item in inputs:
        item.set_data_from_numpy(np.ones((1, 16), np.int32))
    for _ in range(count):
        client.infer("simple", inputs)
    client.close()


def wait_for(check: Any, timeout_s: float, what: str) -> Any:
    """Poll `check()` until it returns something true, with a deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s} s")
        time.sleep(0.2)
