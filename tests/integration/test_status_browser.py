"""The status page in a real headless browser (Debian's chromium and chromium-driver, driven
by selenium), against a real server: it shows the models with their state, a failed model's
reason, where instances run (a GPU group's CPU fallback with the reason), and its charts; a
load / unload, an OTA switch and a rollback (local poll mode) and an S3 download's progress
show without a reload; no console errors.

STATUS_SCREENSHOTS=docs/ keeps each state's picture (scripts/status-screenshots)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration import status_repo
from tests.integration.status_repo import infer_simple, screenshot, traffic, wait_for
from tests.serverproc import ServerProcess

DASH, TIMES = "\u2013", "\u00d7"  # the page's "no value" and "2 x CPU"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")

pytestmark = [
    pytest.mark.skipif(
        importlib.util.find_spec("selenium") is None,
        reason="selenium is not installed (pip install -e '.[dev]')",
    ),
    pytest.mark.skipif(
        CHROMIUM is None or DRIVER is None,
        reason="no chromium / chromedriver on PATH (apt-get install chromium chromium-driver)",
    ),
]


@pytest.fixture(scope="module")
def page_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = status_repo.build(tmp_path_factory.mktemp("browser-models"))
    proc = ServerProcess(root, log_path=tmp_path_factory.mktemp("browser") / "server.log")
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (
        "--headless=new",
        "--no-sandbox",  # as root in a container
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1400,1000",
        f"--user-data-dir={tmp_path_factory.mktemp('chromium')}",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(str(DRIVER)), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


# The page redraws its tables every 2 s: an element found in one call may be gone in the next,
# so each read is one script, run between two redraws.
_READ = """
const [css, attr] = arguments;
const found = document.querySelector(css);
if (!found) return null;
if (attr) return found.getAttribute(attr);
return found.tagName === "TR"
  ? Array.from(found.querySelectorAll(":scope > td"), (td) => td.innerText)
  : found.innerText;
"""


def _read(browser: Any, css: str, attr: str = "") -> Any:
    return browser.execute_script(_READ, css, attr)


def _cells(browser: Any, table: str, model: str) -> list[str]:
    """The texts of a model's row's cells; [] when the table has no row for it."""
    return list(_read(browser, f'#{table} tbody tr[data-model="{model}"]') or [])


def _row(browser: Any, model: str) -> str:
    """A model's row in the models table, as one text; '' when it has none."""
    return " | ".join(_cells(browser, "models", model))


def _open(browser: Any, url: str) -> None:
    """Open the page afresh: the last test's page (polling a server now gone) is left first
    and its console errors dropped."""
    browser.get("about:blank")
    browser.get_log("browser")
    browser.get(url)


def _no_console_errors(browser: Any) -> None:
    severe = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert severe == [], severe


def _numbers(text: str) -> float | None:
    return None if text in ("", DASH) else float(text)


def _risen(browser: Any, model: str) -> int:
    """Points of a model's rate chart above the baseline: y above the chart's bottom (36 - 2
    padding)."""
    points = _read(browser, f'tr[data-model="{model}"] svg.rate polyline', "points") or ""
    return sum(1 for p in str(points).split() if "," in p and float(p.split(",")[1]) < 33.9)


def test_page_shows_models_and_its_chart_moves(
    browser: Any, page_server: ServerProcess, tmp_path: Path
) -> None:
    _open(browser, f"http://{page_server.http_url}/")  # redirected to /status
    assert browser.current_url.endswith("/status")
    wait_for(lambda: _row(browser, "simple"), 20, "the model table")
    simple = _row(browser, "simple")
    assert "READY" in simple
    assert "onnxruntime_onnx" in simple
    broken = _cells(browser, "models", "broken")
    assert "UNAVAILABLE" in broken[1]
    assert _read(browser, 'tr[data-model="broken"] .reason'), broken
    assert _read(browser, "#readiness") == "ready"
    assert _read(browser, "#device")  # host, CPU, memory, store

    assert not _risen(browser, "simple")  # no traffic yet: a flat line
    infer_simple(page_server.http_url, 30)
    wait_for(lambda: _risen(browser, "simple"), 20, "the rate chart to rise, without a reload")
    assert float(_read(browser, 'tr[data-model="simple"] .rate-value')) >= 0
    screenshot(browser, "status-failed-model.png", tmp_path)
    _no_console_errors(browser)


def test_all_ready_under_load_with_where_instances_run(
    browser: Any, start_server: Any, tmp_path: Path
) -> None:
    """Charts and percentiles move under load; simple_gpu's KIND_GPU group shows where its
    instances run, and on a machine without a usable GPU, the CPU fallback's reason."""
    root = status_repo.build_ready(tmp_path / "models")
    proc = start_server(root)
    _open(browser, f"http://{proc.http_url}/status")
    wait_for(lambda: _row(browser, "simple_gpu"), 20, "the model table")
    with traffic(proc.http_url, ("simple", "simple_gpu")):

        # Three points of load; a picture for the docs shows a longer stretch.
        points = 10 if os.environ.get("STATUS_SCREENSHOTS") else 3

        def charted() -> bool:
            cells = _cells(browser, "models", "simple_gpu")
            p50, p99 = _numbers(cells[6]), _numbers(cells[7])
            return bool(p50 and p99 and p99 >= p50 and _risen(browser, "simple") >= points)

        wait_for(charted, 10 + 3 * points, "percentiles and rate points under load")
        screenshot(browser, "status-page.png", tmp_path)
    instances = _cells(browser, "models", "simple_gpu")[3]
    doc = status_repo.status_json(proc.http_url)
    (gpu_model,) = [m for m in doc["models"] if m["name"] == "simple_gpu"]
    assert len(gpu_model["instances"]) == 2
    if all(i["kind"] == "KIND_CPU" for i in gpu_model["instances"]):  # no usable GPU here
        assert f"2 {TIMES} CPU" in instances, instances
        reason = gpu_model["instances"][0]["reason"]
        assert reason
        assert "CPU fallback: " + reason in instances
    else:
        assert "GPU" in instances, instances
    assert "READY" in _cells(browser, "models", "simple")[1]
    assert f"1 {TIMES} CPU" in _cells(browser, "models", "simple")[3]
    _no_console_errors(browser)


def test_a_load_and_an_unload_appear_without_a_reload(
    browser: Any, start_server: Any, tmp_path: Path
) -> None:
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    root = status_repo.build(tmp_path / "models")
    proc = start_server(root, "--model-control-mode=explicit", "--load-model=simple")
    _open(browser, f"http://{proc.http_url}/status")
    wait_for(lambda: _row(browser, "simple"), 20, "the model table")
    assert "READY" in _row(browser, "simple")
    assert _row(browser, "broken") == ""  # never asked for: not on the page

    client = httpclient.InferenceServerClient(proc.http_url)
    client.unload_model("simple")

    def state(model: str) -> str:
        cells = _cells(browser, "models", model)
        return cells[1] if cells else ""

    wait_for(lambda: state("simple") not in ("", "READY"), 15, "simple shown unloaded")
    client.load_model("simple")
    wait_for(lambda: state("simple") == "READY", 15, "simple shown ready again")
    with pytest.raises(InferenceServerException, match="failed"):
        client.load_model("broken")
    wait_for(lambda: state("broken") == "UNAVAILABLE", 15, "broken shown failed")
    reason = _read(browser, 'tr[data-model="broken"] .reason')
    assert reason, _row(browser, "broken")
    assert "onnx" in reason.lower()
    client.close()


def test_an_ota_switch_in_poll_mode_appears_without_a_reload(
    browser: Any, start_server: Any, tmp_path: Path
) -> None:
    root = status_repo.build(tmp_path / "models")
    proc = start_server(root, "--model-control-mode=poll", "--repository-poll-secs=1")
    _open(browser, f"http://{proc.http_url}/status")
    wait_for(lambda: _row(browser, "simple"), 20, "the model table")
    browser.execute_script("window.__sameDocument = true;")  # gone if the page reloads
    wait_for(
        lambda: "loaded v1" in (_cells(browser, "model-updates", "simple") or ["", "", ""])[2],
        20,
        "version 1 in the updates table",
    )

    def versions() -> str:
        cells = _cells(browser, "models", "simple")
        return cells[2] if len(cells) > 2 else ""

    assert "v1 READY" in versions(), versions()
    assert "v2" not in versions()

    # The OTA update: version 2 lands in the folder whole (a rename), as an updater writes it.
    staging = tmp_path / "staging-2"
    shutil.copytree(root / "simple" / "1", staging)
    staging.rename(root / "simple" / "2")

    # The default version policy (latest 1): version 2 serves and version 1 leaves.
    wait_for(
        lambda: "v2 READY" in versions() and "v1 READY" not in versions(),
        10,
        "the switch to version 2 on the open page",
    )
    assert browser.execute_script("return window.__sameDocument === true;")
    assert "READY" in _cells(browser, "models", "simple")[1]
    wait_for(
        lambda: "v1 \u2192 v2" in _cells(browser, "model-updates", "simple")[2],
        10,
        "the switch in the updates table",
    )
    _no_console_errors(browser)


def test_an_ota_switch_and_a_rollback_are_shown(
    browser: Any, start_server: Any, tmp_path: Path
) -> None:
    """Poll mode with automatic rollback: version 2 switches in (the page shows v1 -> v2),
    fails its first requests and is rolled back (v2 -> v1, the rollback with its reason)."""
    import onnx
    from tritonclient.utils import InferenceServerException

    from tests.integration.test_poll_mode import CONFIG, _added, _failing_model, _version

    repo = tmp_path / "repo"
    (repo / "m").mkdir(parents=True)
    (repo / "m" / "config.pbtxt").write_text(CONFIG)
    _version(repo, 1, 1)
    proc = start_server(
        repo,
        "--model-control-mode=poll",
        "--repository-poll-secs=0.5",
        "--model-rollback-error-rate=0.5",
        "--model-rollback-window=10",
    )
    _open(browser, f"http://{proc.http_url}/status")
    # The sampler (every 2 s) has seen version 1 serve: a switch is a change between samples,
    # and a load before the first sample is one too (it was once missed when the model loaded
    # before the sampler's first sample on a busy machine).
    wait_for(
        lambda: "loaded v1" in (_cells(browser, "model-updates", "m") or ["", "", ""])[2],
        20,
        "version 1 in the updates table",
    )
    staging = tmp_path / "bad"
    staging.mkdir()
    onnx.save(_failing_model(), str(staging / "model.onnx"))
    staging.rename(repo / "m" / "2")
    wait_for(
        lambda: "v1 \u2192 v2" in _cells(browser, "model-updates", "m")[2], 15, "the switch to v2"
    )
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(proc.http_url)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            if _added(client) == 1.0:
                break  # version 1 serves again
        except InferenceServerException:
            pass
    client.close()

    def rolled_back() -> list[str]:
        cells = _cells(browser, "model-updates", "m")
        return cells if "v2 rolled back" in cells[5] and "v2 \u2192 v1" in cells[2] else []

    cells = wait_for(rolled_back, 15, "the rollback on the open page")
    assert cells[1] == "v1"  # serving
    assert "of its first" in cells[5]  # probation's reason
    screenshot(browser, "status-ota-rollback.png", tmp_path)
    _no_console_errors(browser)


def test_a_download_in_progress_shows_its_progress(
    browser: Any, start_server: Any, tmp_path: Path
) -> None:
    """An S3 repository (moto on loopback) at 8 Mbit/s: a 6 MB version 2 takes seconds to
    arrive, and the page shows the progress bar moving, then the switch."""
    from tests.integration.test_s3_repository import Bucket
    from tests.s3servers import moto_server

    with moto_server() as s3:
        bucket = Bucket(s3)
        bucket.seed()
        proc = start_server(
            bucket.url,
            f"--model-store-dir={tmp_path / 'store'}",
            "--model-control-mode=poll",
            "--repository-poll-secs=0.5",
            "--model-download-limit-mbps=8",
            "--repository-sync-wait-secs=60",
            env=s3.env(),
        )
        _open(browser, f"http://{proc.http_url}/status")
        wait_for(lambda: _row(browser, "m"), 20, "the model table")
        bucket.put_version(2, 2, padding=6_000_000)

        def progress() -> tuple[float, float] | None:
            value = float(_read(browser, "#sources .download progress", "value") or 0)
            top = float(_read(browser, "#sources .download progress", "max") or 0)
            return (value, top) if value else None

        first = wait_for(progress, 20, "a download's progress bar")
        assert first[1] > 6_000_000  # the version's size
        assert "version 2" in _read(browser, "#sources .download")
        # What version 2 waits for is its download (not an earlier poll's reason).
        wait_for(
            lambda: "v2 UNAVAILABLE\nnot fetched: downloading: "
            in (_cells(browser, "models", "m") or ["", "", ""])[2],
            10,
            "version 2 shown downloading",
        )
        wait_for(lambda: (progress() or (0.0, 0.0))[0] > first[0], 10, "the bar to move")

        def rate() -> bool:
            text = str(_read(browser, ".download-numbers") or "")
            return "/s" in text and f"{DASH}/s" not in text

        wait_for(rate, 10, "a download rate")
        screenshot(browser, "status-download.png", tmp_path)
        wait_for(
            lambda: "v1 \u2192 v2" in (_cells(browser, "model-updates", "m") or ["", "", ""])[2],
            30,
            "the switch once the download is in",
        )
        assert _read(browser, "#sources .download") is None
        _no_console_errors(browser)


def test_the_memory_budget_shows_its_bar_and_each_model(
    browser: Any, start_server: Any, tmp_path: Path
) -> None:
    """docs/memory.md: the section appears with the budget's flags, the bar fills as a model
    loads on demand, and each model shows resident / not loaded."""
    from tests.integration.models import write_sized_model

    repo = tmp_path / "repo"
    resident = 'parameters { key: "resident" value: { string_value: "true" } }\n'
    write_sized_model(repo, "keeper", 1, 1.0, resident)
    write_sized_model(repo, "later", 8, 2.0)
    proc = start_server(repo, "--model-memory-budget=200M", "--model-load-on-demand")
    _open(browser, f"http://{proc.http_url}/status")
    wait_for(lambda: _cells(browser, "memory", "later"), 20, "the memory table")
    assert _cells(browser, "memory", "keeper")[1] == "resident (pinned)"
    assert _cells(browser, "memory", "later")[1] == "not loaded"
    assert "loads on its first request" in _cells(browser, "memory", "later")[5]
    assert "of 200.0 MB (bytes)" in (_read(browser, "#memory-text") or "")
    before = float(_read(browser, "#memory-used", "value") or 0)

    import numpy as np
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(proc.http_url)
    index = httpclient.InferInput("INDEX", [1], "INT64")
    index.set_data_from_numpy(np.array([0], dtype=np.int64))
    assert float(client.infer("later", [index]).as_numpy("OUTPUT0")[0]) == 2.0
    wait_for(lambda: _cells(browser, "memory", "later")[1] == "resident", 15, "later resident")
    assert float(_read(browser, "#memory-used", "value") or 0) >= before + 8 * 2**20
    assert "1 loads on demand" in (_read(browser, "#memory-text") or "")
    _no_console_errors(browser)
    client.close()
