"""A small repository for the status page's tests: `simple` and `broken` (fails to load); and
what the browser tests share: traffic in the background, screenshots."""

from __future__ import annotations

import base64
import json
import os
import re
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
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
    (root / "broken" / "config.pbtxt").write_text(SIMPLE_CONFIG.replace('"simple"', '"broken"'))
    return root


# `simple` with two GPU instances and dynamic batching: on a machine without a usable GPU both
# run on CPU, and the status page says why.
SIMPLE_GPU_CONFIG = SIMPLE_CONFIG.replace('"simple"', '"simple_gpu"') + (
    "instance_group [ { count: 2, kind: KIND_GPU } ]\n"
    "dynamic_batching { max_queue_delay_microseconds: 500 }\n"
)


def add_simple(root: Path, name: str) -> None:
    """A copy of `simple` named `name`."""
    save(simple_model(), root / name / "1" / "model.onnx")
    (root / name / "config.pbtxt").write_text(SIMPLE_CONFIG.replace('"simple"', f'"{name}"'))


def build_ready(root: Path) -> Path:
    """`simple` and `simple_gpu`: every model loads."""
    save(simple_model(), root / "simple" / "1" / "model.onnx")
    (root / "simple" / "config.pbtxt").write_text(SIMPLE_CONFIG)
    save(simple_model(), root / "simple_gpu" / "1" / "model.onnx")
    (root / "simple_gpu" / "config.pbtxt").write_text(SIMPLE_GPU_CONFIG)
    return root


@contextmanager
def traffic(
    http_url: str, models: tuple[str, ...] = ("simple",), clients: int = 2
) -> Iterator[None]:
    """`clients` threads sending `simple`-shaped requests to `models` in turn until the
    context exits."""
    stop = threading.Event()

    def send() -> None:
        client = httpclient.InferenceServerClient(http_url)
        inputs = [
            httpclient.InferInput("INPUT0", [1, 16], "INT32"),
            httpclient.InferInput("INPUT1", [1, 16], "INT32"),
        ]
        for item in inputs:
            item.set_data_from_numpy(np.ones((1, 16), np.int32))
        n = 0
        while not stop.is_set():
            client.infer(models[n % len(models)], inputs)
            n += 1
        client.close()

    threads = [threading.Thread(target=send, daemon=True) for _ in range(clients)]
    for thread in threads:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        for thread in threads:
            thread.join(10)


# A test's temporary folder (pytest's tmp_path and mktemp folders) and what the screenshots in
# docs/ show in its place, on every text of the page.
TEMP_PATH = re.compile(re.escape(tempfile.gettempdir()) + r"/pytest-of-[^/]+/pytest-[^/]+/[^/\s]+")
NEUTRAL_ROOT = "/var/lib/edge-appliance"
_NEUTRAL_PATHS_JS = """
const re = new RegExp(arguments[0], "g");
const walk = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
for (let n = walk.nextNode(); n; n = walk.nextNode()) {
  n.nodeValue = n.nodeValue.replace(re, arguments[1]);
}
"""


def neutral_paths(text: str) -> str:
    """What the screenshots show of `text` (the script above, in Python, for its test)."""
    return TEMP_PATH.sub(NEUTRAL_ROOT, text)


def screenshot(browser: Any, name: str, fallback: Path) -> Path:
    """The whole page (beyond the window) as a PNG: into $STATUS_SCREENSHOTS
    (scripts/status-screenshots writes docs/ that way), else into `fallback` (a test's
    tmp_path)."""
    folder = Path(os.environ.get("STATUS_SCREENSHOTS") or fallback)
    if os.environ.get("STATUS_SCREENSHOTS"):
        # The pictures in docs/ show a device's paths, not the test's temporary folders.
        browser.execute_script(_NEUTRAL_PATHS_JS, TEMP_PATH.pattern, NEUTRAL_ROOT)
    size = browser.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
    shot = browser.execute_cdp_cmd(
        "Page.captureScreenshot",
        {
            "format": "png",
            "captureBeyondViewport": True,
            "clip": {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1},
        },
    )
    path = folder / name
    path.write_bytes(base64.b64decode(shot["data"]))
    return path


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
            raise AssertionError(f"{what}: not within {timeout_s} s (last: {value!r})")
        time.sleep(0.2)
