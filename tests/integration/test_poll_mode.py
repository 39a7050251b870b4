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
    assert _added(client) == 1.0  # version 1 keeps serving
    index = {(e["name"], e.get("version")): e for e in client.get_model_repository_index()}
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
