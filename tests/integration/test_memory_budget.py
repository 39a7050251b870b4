"""Models on demand under a memory budget (docs/memory.md), on the real server with the real
tritonclient: one load for concurrent first requests, least recently used eviction, a pinned
model never evicted, a refused load with its reason, the idle timer, and what it must never
unload (a model with a request in flight, a sequence in progress), an ensemble's steps loaded
on demand."""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from configs.generate import save
from tests.integration.models import RUNNING_SUM_CONFIG, running_sum_model, write_sized_model
from tests.serverproc import ServerProcess

RESIDENT = 'parameters { key: "resident" value: { string_value: "true" } }\n'
PIPE_CONFIG = """\
name: "pipe"
platform: "ensemble"
max_batch_size: 0
input [ { name: "INDEX", data_type: TYPE_INT64, dims: [ 1 ] } ]
output [ { name: "OUT", data_type: TYPE_FP32, dims: [ 1 ] } ]
ensemble_scheduling { step [ { model_name: "a" model_version: -1
  input_map { key: "INDEX" value: "INDEX" } output_map { key: "OUTPUT0" value: "OUT" } } ] }
"""
SLOW_CONFIG = """\
name: "slow"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ 1 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 1 ] } ]
"""
SLOW_MODEL = """\
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        time.sleep(2.5)  # longer than the idle time
        x = pb_utils.get_input_tensor_by_name(requests[0], "INPUT0")
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x.as_numpy())])]
"""


def _value(url: str, model: str) -> float:
    client = httpclient.InferenceServerClient(url, network_timeout=60)
    index = httpclient.InferInput("INDEX", [1], "INT64")
    index.set_data_from_numpy(np.array([0], dtype=np.int64))
    return float(client.infer(model, [index]).as_numpy("OUTPUT0")[0])


def _memory(proc: ServerProcess) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://{proc.http_url}/status.json", timeout=10) as answer:
        memory: dict[str, Any] = json.loads(answer.read())["memory"]
    return memory


def _states(proc: ServerProcess) -> dict[str, str]:
    return {m["name"]: m["state"] for m in _memory(proc)["models"]}


def _metric(proc: ServerProcess, name: str, **labels: str) -> float:
    url = f"http://127.0.0.1:{proc.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as answer:
        text = answer.read().decode()
    shown = ",".join(f'{k}="{v}"' for k, v in labels.items())
    key = re.escape(f"{name}{{{shown}}}" if labels else name)
    match = re.search(rf"^{key} (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def _wait_for(predicate: Any, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "not reached in time"
        time.sleep(0.1)


def _follows_the_schema(proc: ServerProcess) -> None:
    """status.json, memory included, as openapi.json documents it."""
    validator = pytest.importorskip("openapi_schema_validator", reason="openapi-schema-validator")
    from appliance.frontends.http.status_page import read_asset

    components = json.loads(read_asset("openapi.json"))["components"]
    schema = {**components["schemas"]["StatusReport"], "components": components}
    with urllib.request.urlopen(f"http://{proc.http_url}/status.json", timeout=10) as answer:
        validator.validate(json.loads(answer.read()), schema, cls=validator.OAS30Validator)


def _log(proc: ServerProcess) -> str:
    return proc.log_path.read_text()


@pytest.fixture(scope="module")
def budget_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("budget") / "repo"
    # Pinned, loaded at start: it also takes ONNX Runtime's one-time start-up memory.
    write_sized_model(repo, "keeper", 1, 9.0, RESIDENT)
    for value, name in enumerate(("a", "b", "c"), start=1):
        write_sized_model(repo, name, 50, float(value))
    write_sized_model(repo, "huge", 160, 5.0)
    return repo


def test_on_demand_loads_under_the_budget(start_server: Any, budget_repo: Path) -> None:
    proc = start_server(budget_repo, "--model-memory-budget=265M", "--model-load-on-demand")
    assert _states(proc) == {
        "keeper": "resident",
        "a": "not_loaded",
        "b": "not_loaded",
        "c": "not_loaded",
        "huge": "not_loaded",
    }

    # Eight first requests at once: one load, every request answered.
    results: list[float] = []
    threads = [
        threading.Thread(target=lambda: results.append(_value(proc.http_url, "a")))
        for _ in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [1.0] * 8
    assert _log(proc).count("loading model 'a' on demand") == 1
    assert _metric(proc, "edge_model_load_on_demand_total", model="a") == 1

    # b fits beside a; then a is asked for again, so b is the least recently used when c
    # needs room, and keeper (pinned, never asked for) stays.
    assert _value(proc.http_url, "b") == 2.0
    assert _value(proc.http_url, "a") == 1.0
    time.sleep(0.3)  # past the grace of a request just answered
    assert _value(proc.http_url, "c") == 3.0
    memory = _memory(proc)
    assert _states(proc) == {
        "keeper": "resident",
        "a": "resident",
        "b": "evicted",
        "c": "resident",
        "huge": "not_loaded",
    }
    by_name = {m["name"]: m for m in memory["models"]}
    _follows_the_schema(proc)
    assert "to make room for 'c'" in by_name["b"]["reason"]
    assert by_name["keeper"]["pinned"]
    assert memory["used_bytes"] <= memory["budget_bytes"] == 265 << 20
    assert by_name["a"]["bytes"] >= 50 << 20  # measured: at least its weights
    assert _metric(proc, "edge_model_unload_idle_or_budget_total", model="b", reason="budget")
    assert _metric(proc, "edge_model_memory_bytes", model="a", version="1") >= 50 << 20
    assert _metric(proc, "edge_model_memory_budget_bytes") == 265 << 20
    # b again: a is now the least recently used; keeper is older still, but pinned.
    time.sleep(0.3)
    assert _value(proc.http_url, "b") == 2.0
    assert _states(proc)["a"] == "evicted"
    assert _states(proc)["keeper"] == "resident"
    log = _log(proc)
    assert "unloading model 'b'" in log
    assert "to make room for 'c'" in log

    # Larger than the whole budget: refused with the numbers, nothing unloaded, no OOM.
    with pytest.raises(InferenceServerException) as refused:
        _value(proc.http_url, "huge")
    message = str(refused.value)
    assert "load refused" in message
    assert "larger than the whole budget" in message
    assert "160.0 MiB (estimated from its files)" in message
    assert "265.0 MiB" in message
    assert refused.value.status() == "503"
    assert _states(proc)["b"] == "resident"
    assert _states(proc)["c"] == "resident"
    assert _metric(proc, "edge_model_load_refused_total", model="huge") >= 1
    assert _log(proc).count("load refused: model 'huge'") == 1  # logged once


@pytest.fixture(scope="module")
def idle_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("idle") / "repo"
    write_sized_model(repo, "a", 1, 1.0)
    (repo / "pipe" / "1").mkdir(parents=True)
    (repo / "pipe" / "config.pbtxt").write_text(PIPE_CONFIG + RESIDENT)
    save(running_sum_model(with_corrid=False), repo / "running_sum" / "1" / "model.onnx")
    (repo / "running_sum" / "config.pbtxt").write_text(
        RUNNING_SUM_CONFIG.format(name="running_sum", idle_us=20_000_000, corrid="").replace(
            ',\n  { name: "CORR", data_type: TYPE_INT64, dims: [ 1 ] }', ""
        )
    )
    (repo / "slow" / "1").mkdir(parents=True)
    (repo / "slow" / "1" / "model.py").write_text(SLOW_MODEL)
    (repo / "slow" / "config.pbtxt").write_text(SLOW_CONFIG)
    return repo


def _sum(client: httpclient.InferenceServerClient, value: int, **sequence: Any) -> int:
    given = httpclient.InferInput("INPUT", [1, 1], "INT32")
    given.set_data_from_numpy(np.array([[value]], dtype=np.int32))
    return int(client.infer("running_sum", [given], **sequence).as_numpy("OUTPUT")[0, 0])


def test_idle_models_unload_but_never_one_in_use(start_server: Any, idle_repo: Path) -> None:
    proc = start_server(
        idle_repo, "--model-load-on-demand", "--model-idle-unload-secs=1", "--log-verbose=0"
    )
    # The pinned ensemble loaded at start with its step; the step idles out, the ensemble
    # stays, and the ensemble's next request loads its step again.
    assert _states(proc)["pipe"] == "resident"
    _wait_for(lambda: _states(proc)["a"] == "evicted")
    assert "idle for 1 s" in {m["name"]: m for m in _memory(proc)["models"]}["a"]["reason"]
    client = httpclient.InferenceServerClient(proc.http_url, network_timeout=60)
    index = httpclient.InferInput("INDEX", [1], "INT64")
    index.set_data_from_numpy(np.array([0], dtype=np.int64))
    assert float(client.infer("pipe", [index]).as_numpy("OUT")[0]) == 1.0
    assert _metric(proc, "edge_model_load_on_demand_total", model="a") == 1
    assert _states(proc)["pipe"] == "resident"

    # A sequence in progress keeps its model past the idle time; once it ends, it goes.
    assert _sum(client, 5, sequence_id=7, sequence_start=True) == 5
    time.sleep(2.5)
    assert _states(proc)["running_sum"] == "resident"
    assert _sum(client, 3, sequence_id=7, sequence_end=True) == 8
    _wait_for(lambda: _states(proc)["running_sum"] == "evicted")

    # A request in flight longer than the idle time keeps its model until it is answered.
    started = time.monotonic()
    slow = httpclient.InferInput("INPUT0", [1], "FP32")
    slow.set_data_from_numpy(np.array([4.0], dtype=np.float32))
    out = client.infer("slow", [slow]).as_numpy("OUTPUT0")
    took = time.monotonic() - started
    assert float(out[0]) == 4.0
    assert took > 1.6, f"the slow model ran in {took:.1f} s: too fast to test the idle timer"
    # Its last use is its answer: an unload line now would be one from while it ran.
    assert "unloading model 'slow'" not in _log(proc)
    _wait_for(lambda: _states(proc)["slow"] == "evicted")


@pytest.mark.parametrize("swap", [False, True], ids=["refused", "swapped"])
def test_an_update_that_does_not_fit_beside_the_old_version(
    start_server: Any, tmp_path: Path, swap: bool
) -> None:
    """An OTA update's new version is estimated before it loads beside the old one: refused
    with the reason while the old one serves, or, with --model-memory-swap-unavailable, loaded
    after the old one is unloaded."""
    repo = tmp_path / "repo"
    write_sized_model(repo, "m", 50, 1.0)
    flags = ["--model-memory-budget=200M", "--model-control-mode=poll"]
    flags.append("--repository-poll-secs=0.3")
    proc = start_server(repo, *flags, *(["--model-memory-swap-unavailable"] if swap else []))
    assert _value(proc.http_url, "m") == 1.0
    write_sized_model(tmp_path / "staging", "m", 50, 2.0)
    (tmp_path / "staging" / "m" / "1").rename(repo / "m" / "2")
    if swap:
        _wait_for(lambda: "version 2 is READY" in _log(proc), 30)
        assert _value(proc.http_url, "m") == 2.0
        assert "unloading them first" in _log(proc)
        return
    _wait_for(lambda: "load refused: model 'm'" in _log(proc), 30)
    assert _value(proc.http_url, "m") == 1.0  # the old version keeps serving
    client = httpclient.InferenceServerClient(proc.http_url)
    index = client.get_model_repository_index()
    reasons = " ".join(row.get("reason", "") for row in index if row["name"] == "m")
    assert "the loaded versions keep serving: load refused" in reasons, index
