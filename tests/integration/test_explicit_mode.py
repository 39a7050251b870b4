"""Explicit model control: file overrides, ensembles with their dependencies, unload_dependents."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.integration.models import _add_constant_model

CONFIG = {
    "name": "fresh",
    "platform": "onnxruntime_onnx",
    "max_batch_size": 4,
    "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
    "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
}


def _repo(tmp_path: Path, source: Path, *names: str) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    for name in names:
        shutil.copytree(source / name, repo / name)
    return repo


def _add(module, client, model: str) -> float:  # type: ignore[no-untyped-def]
    inp = module.InferInput("INPUT0", [1, 4], "FP32")
    inp.set_data_from_numpy(np.zeros((1, 4), np.float32))
    return float(client.infer(model, [inp]).as_numpy("OUTPUT0")[0, 0])


@pytest.mark.parametrize("module", [httpclient, grpcclient])
def test_load_a_model_from_file_overrides(start_server, model_repository, tmp_path, module) -> None:  # type: ignore[no-untyped-def]
    proc = start_server(
        _repo(tmp_path, model_repository, "simple"), "--model-control-mode=explicit"
    )
    client = module.InferenceServerClient(proc.http_url if module is httpclient else proc.grpc_url)
    model_bytes = _add_constant_model(7).SerializeToString()
    client.load_model("fresh", config=json.dumps(CONFIG), files={"file:1/model.onnx": model_bytes})
    assert client.is_model_ready("fresh")
    assert _add(module, client, "fresh") == 7.0
    with pytest.raises(InferenceServerException, match="need the 'config' parameter"):
        client.load_model("fresh", files={"file:1/model.onnx": model_bytes})
    with pytest.raises(InferenceServerException, match="is not allowed"):
        client.load_model(
            "fresh", config=json.dumps(CONFIG), files={"file:../../escape.onnx": model_bytes}
        )
    assert _add(module, client, "fresh") == 7.0  # failed loads left it serving


def test_ensemble_loads_its_models_and_unloads_them_with_it(
    start_server,
    model_repository: Path,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    repo = _repo(
        tmp_path, model_repository, "ensemble_parallel", "versioned_all", "add_sub_fp32", "simple"
    )
    proc = start_server(repo, "--model-control-mode=explicit", "--load-model=ensemble_parallel")
    client = httpclient.InferenceServerClient(proc.http_url)
    for model in ("ensemble_parallel", "versioned_all", "add_sub_fp32"):
        assert client.is_model_ready(model), model
    assert not client.is_model_ready("simple")
    inp = httpclient.InferInput("IN", [1, 4], "FP32")
    inp.set_data_from_numpy(np.zeros((1, 4), np.float32))
    np.testing.assert_array_equal(
        client.infer("ensemble_parallel", [inp]).as_numpy("SUM"), [[3] * 4]
    )
    client.unload_model("ensemble_parallel", unload_dependents=True)
    for model in ("ensemble_parallel", "versioned_all", "add_sub_fp32"):
        assert not client.is_model_ready(model), model


@pytest.mark.parametrize("module", [httpclient, grpcclient])
def test_unload_dependents_keeps_a_step_the_client_loaded_itself(  # type: ignore[no-untyped-def]
    start_server, model_repository: Path, tmp_path: Path, module
) -> None:
    """As tritonserver's dependency graph: an unload with unload_dependents takes along only
    the steps loaded for the ensemble, not one the client had loaded with a load of its own
    (before or after the ensemble's)."""
    repo = _repo(tmp_path, model_repository, "ensemble_parallel", "versioned_all", "add_sub_fp32")
    proc = start_server(repo, "--model-control-mode=explicit")
    client = module.InferenceServerClient(proc.http_url if module is httpclient else proc.grpc_url)
    client.load_model("versioned_all")  # the client's own, before the ensemble
    client.load_model("ensemble_parallel")  # loads add_sub_fp32 for itself
    assert client.is_model_ready("add_sub_fp32")
    client.unload_model("ensemble_parallel", unload_dependents=True)
    assert not client.is_model_ready("ensemble_parallel")
    assert client.is_model_ready("versioned_all")
    assert not client.is_model_ready("add_sub_fp32")
    client.load_model("ensemble_parallel")  # add_sub_fp32 for the ensemble again ...
    client.load_model("add_sub_fp32")  # ... then the client's own as well
    client.unload_model("ensemble_parallel", unload_dependents=True)
    assert client.is_model_ready("add_sub_fp32")
    assert client.is_model_ready("versioned_all")


def test_file_override_model_serves_the_written_file(
    start_server, model_repository, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    """The override folder holds exactly the bytes sent (checked through a second version)."""
    proc = start_server(
        _repo(tmp_path, model_repository, "simple"), "--model-control-mode=explicit"
    )
    client = httpclient.InferenceServerClient(proc.http_url)
    path = tmp_path / "m.onnx"
    onnx.save(_add_constant_model(3), str(path))
    config = dict(CONFIG, version_policy={"all": {}})
    client.load_model(
        "fresh",
        config=json.dumps(config),
        files={
            "file:1/model.onnx": _add_constant_model(1).SerializeToString(),
            "file:2/model.onnx": path.read_bytes(),
        },
    )
    inp = httpclient.InferInput("INPUT0", [1, 4], "FP32")
    inp.set_data_from_numpy(np.zeros((1, 4), np.float32))
    assert float(client.infer("fresh", [inp], model_version="2").as_numpy("OUTPUT0")[0, 0]) == 3.0
    assert float(client.infer("fresh", [inp], model_version="1").as_numpy("OUTPUT0")[0, 0]) == 1.0


def test_override_folders_are_removed_when_no_longer_used(
    start_server, model_repository, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    proc = start_server(
        _repo(tmp_path, model_repository, "simple"), "--model-control-mode=explicit"
    )
    client = httpclient.InferenceServerClient(proc.http_url)

    def override_folders() -> list[str]:
        return re.findall(r"loading model 'fresh' from (\S+)", proc.log())

    files = {"file:1/model.onnx": _add_constant_model(1).SerializeToString()}
    client.load_model("fresh", config=json.dumps(CONFIG), files=files)
    first = Path(override_folders()[-1])
    assert first.is_dir()
    client.load_model("fresh", config=json.dumps(CONFIG), files=files)  # replaces it
    second = Path(override_folders()[-1])
    assert second != first
    assert not first.exists()
    assert second.is_dir()
    client.unload_model("fresh")
    assert not second.exists()
