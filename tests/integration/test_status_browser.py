"""The status page in a real headless browser (Debian's chromium and chromium-driver, driven
by selenium), against a real server: it shows the models with their state, a failed model's
reason, and its charts, a load / unload and an OTA switch (local poll mode) show without a
reload; no console errors."""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration import status_repo
from tests.integration.status_repo import infer_simple, wait_for
from tests.serverproc import ServerProcess

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


def _row(browser: Any, model: str) -> Any:
    from selenium.webdriver.common.by import By

    rows = browser.find_elements(By.CSS_SELECTOR, f'#models tbody tr[data-model="{model}"]')
    return rows[0] if rows else None


def test_page_shows_models_and_its_chart_moves(
    browser: Any, page_server: ServerProcess, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By

    browser.get(f"http://{page_server.http_url}/")  # redirected to /status
    assert browser.current_url.endswith("/status")
    wait_for(lambda: _row(browser, "simple"), 20, "the model table")
    simple = _row(browser, "simple")
    assert "READY" in simple.text
    assert "onnxruntime_onnx" in simple.text
    broken = _row(browser, "broken")
    assert "UNAVAILABLE" in broken.text
    assert broken.find_elements(By.CSS_SELECTOR, ".reason"), broken.text
    assert browser.find_element(By.ID, "readiness").text == "ready"
    assert browser.find_element(By.ID, "device").text  # host, CPU, memory, store

    def rate_chart() -> str:
        row = _row(browser, "simple")
        line = row.find_elements(By.CSS_SELECTOR, "svg.rate polyline") if row else []
        return str(line[0].get_attribute("points")) if line else ""

    def peak() -> bool:
        # A point above the baseline: y below the chart's bottom (36 - 2 padding).
        return any(float(p.split(",")[1]) < 33.9 for p in rate_chart().split() if "," in p)

    assert not peak()  # no traffic yet: a flat line
    infer_simple(page_server.http_url, 30)
    wait_for(peak, 20, "the rate chart to rise after requests, without a reload")
    rate = float(_row(browser, "simple").find_element(By.CSS_SELECTOR, ".rate-value").text)
    assert rate >= 0
    # STATUS_SCREENSHOTS=docs/ keeps the picture (README shows one).
    folder = Path(os.environ.get("STATUS_SCREENSHOTS", str(tmp_path)))
    browser.save_screenshot(str(folder / "status-page.png"))

    severe = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert severe == [], severe


def test_a_load_and_an_unload_appear_without_a_reload(
    browser: Any, start_server: Any, tmp_path: Path
) -> None:
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    root = status_repo.build(tmp_path / "models")
    proc = start_server(root, "--model-control-mode=explicit", "--load-model=simple")
    browser.get(f"http://{proc.http_url}/status")
    wait_for(lambda: _row(browser, "simple"), 20, "the model table")
    assert "READY" in _row(browser, "simple").text
    assert _row(browser, "broken") is None  # never asked for: not on the page

    client = httpclient.InferenceServerClient(proc.http_url)
    client.unload_model("simple")

    def state(model: str) -> str:
        row = _row(browser, model)
        return str(row.find_elements("css selector", "td")[1].text) if row else ""

    wait_for(lambda: state("simple") not in ("", "READY"), 15, "simple shown unloaded")
    client.load_model("simple")
    wait_for(lambda: state("simple") == "READY", 15, "simple shown ready again")
    with pytest.raises(InferenceServerException, match="failed"):
        client.load_model("broken")
    wait_for(lambda: state("broken") == "UNAVAILABLE", 15, "broken shown failed")
    reason = _row(browser, "broken").find_elements("css selector", ".reason")
    assert reason, _row(browser, "broken").text
    assert "onnx" in reason[0].text.lower()
    client.close()


def test_an_ota_switch_in_poll_mode_appears_without_a_reload(
    browser: Any, start_server: Any, tmp_path: Path
) -> None:
    root = status_repo.build(tmp_path / "models")
    proc = start_server(root, "--model-control-mode=poll", "--repository-poll-secs=1")
    browser.get(f"http://{proc.http_url}/status")
    wait_for(lambda: _row(browser, "simple"), 20, "the model table")
    browser.execute_script("window.__sameDocument = true;")  # gone if the page reloads

    def versions() -> str:
        row = _row(browser, "simple")
        cells = row.find_elements("css selector", "td") if row else []
        return str(cells[2].text) if len(cells) > 2 else ""

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
    assert "READY" in _row(browser, "simple").find_elements("css selector", "td")[1].text
    severe = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert severe == [], severe
