"""Version policies, auto-complete, model control modes and start-up flags on a real server."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.serverproc import ServerProcess


def _add_one(client: httpclient.InferenceServerClient, model: str, version: str = "") -> float:
    """The versioned models add their version number to the input."""
    inp = httpclient.InferInput("INPUT0", [1, 4], "FP32")
    inp.set_data_from_numpy(np.zeros((1, 4), np.float32))
    result = client.infer(model, [inp], model_version=version)
    assert result.get_response()["model_version"] == (
        version or result.get_response()["model_version"]
    )
    return float(result.as_numpy("OUTPUT0")[0, 0])


def test_latest_policy_serves_only_the_newest(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    assert _add_one(client, "versioned_latest") == 3.0
    assert client.is_model_ready("versioned_latest", "3")
    assert not client.is_model_ready("versioned_latest", "2")
    with pytest.raises(
        InferenceServerException, match="'versioned_latest' version 1 is not found"
    ) as err:
        _add_one(client, "versioned_latest", "1")
    assert err.value.status() == "404"


def test_all_policy_serves_every_version(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    assert [_add_one(client, "versioned_all", v) for v in ("1", "2", "3")] == [1.0, 2.0, 3.0]
    assert _add_one(client, "versioned_all") == 3.0
    meta = client.get_model_metadata("versioned_all")
    assert meta["versions"] == ["1", "2", "3"]


def test_specific_policy_serves_the_listed_versions(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    assert client.is_model_ready("versioned_specific", "1")
    assert not client.is_model_ready("versioned_specific", "2")
    assert client.is_model_ready("versioned_specific", "3")


def test_auto_complete_without_config(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    config = client.get_model_config("auto_fp32")
    assert config["platform"] == "onnxruntime_onnx"
    assert config["backend"] == "onnxruntime"
    assert config["max_batch_size"] == 4  # Triton's default for batchable models
    # Triton's normalised defaults: the preferred size, one CPU group named as the model
    assert config["dynamic_batching"]["preferred_batch_size"] == [4]
    assert [(g["name"], g["kind"], g["count"]) for g in config["instance_group"]] == [
        ("auto_fp32", "KIND_CPU", 1)
    ]
    assert config["optimization"]["input_pinned_memory"] == {"enable": True}
    assert config["input"][0]["dims"] == [4]
    nobatch = client.get_model_config("auto_nobatch")
    assert nobatch["max_batch_size"] == 0
    assert nobatch["input"][0]["dims"] == [2, 3]
    inp = httpclient.InferInput("INPUT0", [2, 3], "FP32")
    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    inp.set_data_from_numpy(data)
    np.testing.assert_array_equal(client.infer("auto_nobatch", [inp]).as_numpy("OUTPUT0"), data)


def _repo_with(tmp_path: Path, source: Path, *names: str) -> Path:
    repo = tmp_path / "repo"
    for name in names:
        shutil.copytree(source / name, repo / name)
    return repo


def test_strict_model_config_refuses_missing_config(
    start_server,
    model_repository: Path,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    repo = _repo_with(tmp_path, model_repository, "simple", "auto_fp32")
    proc = start_server(repo, "--strict-model-config=true")
    index = {
        e["name"]: e
        for e in httpclient.InferenceServerClient(proc.http_url).get_model_repository_index()
    }
    assert index["simple"]["state"] == "READY"
    assert index["auto_fp32"]["state"] == "UNAVAILABLE"
    assert "--strict-model-config" in index["auto_fp32"]["reason"]


def test_exit_on_error_stops_a_server_with_a_broken_model(
    start_server,
    model_repository: Path,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    repo = _repo_with(tmp_path, model_repository, "simple", "broken_model_file")
    proc = start_server(repo, "--exit-on-error", "true", wait=False)
    assert proc.proc.wait(60) == 1
    assert "broken_model_file" in proc.log()


def test_explicit_mode_loads_only_what_it_is_told(
    start_server,
    model_repository: Path,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    repo = _repo_with(tmp_path, model_repository, "simple", "identity_fp32", "versioned_all")
    proc = start_server(repo, "--model-control-mode=explicit", "--load-model", "simple")
    client = httpclient.InferenceServerClient(proc.http_url)
    assert client.is_model_ready("simple")
    assert not client.is_model_ready("identity_fp32")
    index = {e["name"]: e for e in client.get_model_repository_index()}
    assert index["identity_fp32"] == {"name": "identity_fp32"}  # never loaded: its name alone

    client.load_model("identity_fp32")
    assert client.is_model_ready("identity_fp32")

    grpc = grpcclient.InferenceServerClient(proc.grpc_url)
    grpc.unload_model("identity_fp32")
    assert not grpc.is_model_ready("identity_fp32")
    inp = httpclient.InferInput("INPUT0", [1, 1], "FP32")
    inp.set_data_from_numpy(np.zeros((1, 1), np.float32))
    with pytest.raises(InferenceServerException, match="has no available versions"):
        client.infer("identity_fp32", [inp])

    with pytest.raises(InferenceServerException, match="no model folder named 'nope'"):
        client.load_model("nope")


def test_explicit_load_with_config_override(
    start_server,
    model_repository: Path,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    repo = _repo_with(tmp_path, model_repository, "versioned_all")
    proc = start_server(repo, "--model-control-mode=explicit")
    client = httpclient.InferenceServerClient(proc.http_url)
    override = {
        "name": "versioned_all",
        "platform": "onnxruntime_onnx",
        "max_batch_size": 2,
        "version_policy": {"specific": {"versions": [2]}},
    }
    client.load_model("versioned_all", config=json.dumps(override))
    assert client.is_model_ready("versioned_all", "2")
    assert not client.is_model_ready("versioned_all", "3")
    assert client.get_model_config("versioned_all")["max_batch_size"] == 2
    with pytest.raises(
        InferenceServerException,
        match="failed to load 'versioned_all', failed to poll from model repository: Invalid",
    ):
        client.load_model("versioned_all", config="{not json")
    assert client.is_model_ready("versioned_all", "2")  # a failed reload keeps serving


def test_tritonserver_flag_spellings_are_accepted(
    start_server,
    model_repository: Path,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    repo = _repo_with(tmp_path, model_repository, "simple")
    proc = start_server(
        repo,
        "--allow-grpc=false",
        "--log-verbose=1",
        "--strict-readiness",
        "true",
        "--backend-config=python,shm-default-byte-size=1048576",
        "--http-thread-count",
        "4",
        "--id=edge",
    )
    client = httpclient.InferenceServerClient(proc.http_url)
    assert client.is_server_ready()
    log = proc.log()
    assert (
        "--backend-config python,shm-default-byte-size=1048576 is a tritonserver flag that "
        "edge-appliance ignores" in log
    )
    assert "--http-thread-count is a tritonserver flag that edge-appliance ignores" in log
    assert "GRPCInferenceService" not in log  # --allow-grpc=false


def test_strict_readiness_reports_not_ready_with_a_failed_model(
    start_server,
    model_repository: Path,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    repo = _repo_with(tmp_path, model_repository, "simple", "broken_config")
    proc = start_server(repo, "--strict-readiness=true", wait=False)
    proc.wait_ready(path="/v2/health/live")
    client = httpclient.InferenceServerClient(proc.http_url)
    assert client.is_server_live()
    assert not client.is_server_ready()
    assert client.is_model_ready("simple")


def test_sigterm_drains_and_exits_cleanly(
    start_server,
    model_repository: Path,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    repo = _repo_with(tmp_path, model_repository, "simple")
    proc = start_server(repo)
    assert proc.stop() == 0
    assert "shutting down" in proc.log()


def test_repositories_merge(start_server, model_repository: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    first = tmp_path / "a"
    second = tmp_path / "b"
    shutil.copytree(model_repository / "simple", first / "simple")
    shutil.copytree(model_repository / "identity_fp32", second / "identity_fp32")
    proc = start_server([first, second])
    client = httpclient.InferenceServerClient(proc.http_url)
    assert client.is_model_ready("simple")
    assert client.is_model_ready("identity_fp32")
