"""Poll mode on a local folder: new versions switch in under load, bad ones roll back."""

from __future__ import annotations

import hashlib
import shutil
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.integration.models import _add_constant_model
from tests.serverproc import ServerProcess

CONFIG = 'name: "m"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 4\n'


def _version(repo: Path, version: int, value: int | None) -> None:
    """Write version `version` of model m adding `value` (None: a corrupt file), atomically."""
    staging = repo.parent / f"staging-{version}"
    staging.mkdir()
    path = staging / "model.onnx"
    if value is None:
        path.write_bytes(b"not a model")
    else:
        onnx.save(_add_constant_model(value), str(path))
    target = repo / "m" / str(version)
    if target.exists():
        shutil.rmtree(target)
    staging.rename(target)


def _added(client: httpclient.InferenceServerClient) -> float:
    inp = httpclient.InferInput("INPUT0", [1, 4], "FP32")
    inp.set_data_from_numpy(np.zeros((1, 4), np.float32))
    return float(client.infer("m", [inp]).as_numpy("OUTPUT0")[0, 0])


def _wait_for(predicate, timeout_s: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "the repository change was not picked up"
        time.sleep(0.1)


def _start(start_server, tmp_path: Path) -> tuple[ServerProcess, Path]:  # type: ignore[no-untyped-def]
    repo = tmp_path / "repo"
    (repo / "m").mkdir(parents=True)
    (repo / "m" / "config.pbtxt").write_text(CONFIG)
    _version(repo, 1, 1)
    proc = start_server(repo, "--model-control-mode=poll", "--repository-poll-secs=0.3")
    return proc, repo


def test_new_version_switches_in_under_load_without_failing_a_request(
    start_server,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    proc, repo = _start(start_server, tmp_path)
    client = httpclient.InferenceServerClient(proc.http_url)
    assert _added(client) == 1.0
    seen: Counter[float] = Counter()
    failures: list[str] = []
    stop = threading.Event()

    def load() -> None:
        own = httpclient.InferenceServerClient(proc.http_url)
        while not stop.is_set():
            try:
                seen[_added(own)] += 1
            except InferenceServerException as exc:
                failures.append(exc.message())

    thread = threading.Thread(target=load)
    thread.start()
    try:
        time.sleep(0.3)
        _version(repo, 2, 2)
        _wait_for(lambda: seen[2.0] > 20)
    finally:
        stop.set()
        thread.join()
    assert failures == []
    assert seen[1.0] > 0, seen
    assert seen[2.0] > 20, seen
    assert not client.is_model_ready("m", "1")  # the old version was drained and unloaded
    assert "model 'm' changed in the repository; loading" in proc.log()


def test_a_corrupt_new_version_rolls_back_until_fixed(start_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    proc, repo = _start(start_server, tmp_path)
    client = httpclient.InferenceServerClient(proc.http_url)
    _version(repo, 2, None)
    _wait_for(lambda: "version 2 failed to load" in proc.log())

    def index_rows() -> dict[tuple[str, str | None], dict[str, str]]:
        return {(e["name"], e.get("version")): e for e in client.get_model_repository_index()}

    # The log line comes before the load's end (its ledger writes, fsynced): the index then.
    _wait_for(lambda: ("m", "2") in index_rows())
    assert _added(client) == 1.0  # version 1 keeps serving
    index = index_rows()
    assert index[("m", "1")]["state"] == "READY"
    assert index[("m", "2")]["state"] == "UNAVAILABLE"
    assert "onnxruntime cannot load" in index[("m", "2")]["reason"]
    _version(repo, 2, 2)  # the fixed upload
    _wait_for(lambda: _added(client) == 2.0)
    with urllib.request.urlopen(f"http://127.0.0.1:{proc.metrics_port}/metrics") as resp:
        metrics = resp.read().decode()
    assert 'edge_model_load_total{model="m",result="failure"} 1.0' in metrics
    assert 'edge_model_load_total{model="m",result="success"} 2.0' in metrics
    assert "edge_repository_last_poll_timestamp_seconds" in metrics


def test_models_come_and_go_with_their_folders(start_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    proc, repo = _start(start_server, tmp_path)
    client = httpclient.InferenceServerClient(proc.http_url)
    staging = tmp_path / "n-staging"
    shutil.copytree(repo / "m", staging)
    (staging / "config.pbtxt").write_text(CONFIG.replace('"m"', '"n"'))
    staging.rename(repo / "n")
    _wait_for(lambda: client.is_model_ready("n"))
    shutil.rmtree(repo / "n")
    _wait_for(lambda: not client.is_model_ready("n"))
    assert client.is_model_ready("m")


def test_a_version_loads_only_once_its_manifest_matches(start_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    repo = tmp_path / "repo"
    (repo / "m").mkdir(parents=True)
    (repo / "m" / "config.pbtxt").write_text(CONFIG)
    _version(repo, 1, 1)
    _write_manifest(repo / "m" / "1")
    proc = start_server(
        repo, "--model-control-mode=poll", "--repository-poll-secs=0.3", "--require-manifest"
    )
    client = httpclient.InferenceServerClient(proc.http_url)
    assert _added(client) == 1.0
    _version(repo, 2, 2)  # files arrived, manifest not yet
    _wait_for(lambda: "no SHA256SUMS manifest" in proc.log())
    assert _added(client) == 1.0
    (repo / "m" / "2" / "SHA256SUMS").write_text("0" * 64 + "  model.onnx\n")  # wrong sum
    _wait_for(lambda: "does not match its sha256" in proc.log())
    assert _added(client) == 1.0
    _write_manifest(repo / "m" / "2")  # the upload completes
    _wait_for(lambda: _added(client) == 2.0)


def _write_manifest(folder: Path) -> None:
    digest = hashlib.sha256((folder / "model.onnx").read_bytes()).hexdigest()
    (folder / "SHA256SUMS").write_text(f"{digest}  model.onnx\n")


def _failing_model() -> onnx.ModelProto:
    """Loads fine, fails every run: gathers column 10 of a [batch, 4] input."""
    from onnx import TensorProto, helper

    from tests.integration.models import IR_VERSION, OPSET

    graph = helper.make_graph(
        [helper.make_node("Gather", ["INPUT0", "idx"], ["OUTPUT0"], axis=1)],
        "always_fails",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", 4])],
        initializer=[helper.make_tensor("idx", TensorProto.INT64, [4], [10, 10, 10, 10])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    return model


def test_a_new_version_failing_its_first_requests_is_rolled_back(  # type: ignore[no-untyped-def]
    start_server, tmp_path: Path
) -> None:
    repo = tmp_path / "repo"
    (repo / "m").mkdir(parents=True)
    (repo / "m" / "config.pbtxt").write_text(CONFIG)
    _version(repo, 1, 1)
    proc = start_server(
        repo,
        "--model-control-mode=poll",
        "--repository-poll-secs=0.3",
        "--model-rollback-error-rate=0.5",
        "--model-rollback-window=10",
    )
    client = httpclient.InferenceServerClient(proc.http_url)
    staging = tmp_path / "bad"
    staging.mkdir()
    onnx.save(_failing_model(), str(staging / "model.onnx"))
    staging.rename(repo / "m" / "2")
    _wait_for(lambda: client.is_model_ready("m", "2"))
    failures = 0
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            if _added(client) == 1.0:
                break  # version 1 serves again
        except InferenceServerException:
            failures += 1
    assert _added(client) == 1.0
    assert failures == 6  # rolled back at once: more than half of the first 10 failed
    index = {(e["name"], e.get("version")): e for e in client.get_model_repository_index()}
    assert index[("m", "2")]["state"] == "UNAVAILABLE"
    assert "rolled back: " in index[("m", "2")]["reason"]
    time.sleep(1.0)  # the poller does not bring the unchanged version back
    assert _added(client) == 1.0
    with urllib.request.urlopen(f"http://127.0.0.1:{proc.metrics_port}/metrics") as resp:
        assert 'edge_model_load_total{model="m",result="rollback"} 1.0' in resp.read().decode()
    _version(repo, 3, 3)  # a fixed release goes through
    _wait_for(lambda: _added(client) == 3.0)
    for _ in range(10):
        assert _added(client) == 3.0
    _wait_for(lambda: "version 3 passed its first 10 requests (0 failed)" in proc.log())
