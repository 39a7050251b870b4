"""Nothing a request or a repository holds can make the server load from outside it."""

from __future__ import annotations

import os
from pathlib import Path

import onnx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.integration.models import _add_constant_model

CONFIG = 'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 4\n'


def _model(folder: Path, name: str) -> None:
    (folder / name / "1").mkdir(parents=True)
    (folder / name / "config.pbtxt").write_text(CONFIG.format(name=name))
    onnx.save(_add_constant_model(1), str(folder / name / "1" / "model.onnx"))


def test_symlinks_out_of_the_repository_are_not_followed(start_server, tmp_path: Path) -> None:
    repo, outside = tmp_path / "repo", tmp_path / "outside"
    _model(repo, "good")
    _model(outside, "elsewhere")
    os.symlink(outside / "elsewhere", repo / "elsewhere")  # a model folder pointing out
    _model(repo, "sneaky")
    (repo / "sneaky" / "1" / "model.onnx").unlink()
    os.symlink(outside / "elsewhere" / "1" / "model.onnx", repo / "sneaky" / "1" / "model.onnx")
    proc = start_server(repo)
    client = httpclient.InferenceServerClient(proc.http_url)
    index = {e["name"]: e for e in client.get_model_repository_index()}
    assert "elsewhere" not in index
    assert client.is_model_ready("good")
    assert not client.is_model_ready("sneaky")
    assert "outside the model folder" in index["sneaky"]["reason"]
    assert "links outside the repository" in proc.log()


@pytest.mark.parametrize("name", ["../evil", "a/b", "..", " ..", ".. "])
def test_model_names_cannot_leave_the_repository(start_server, tmp_path: Path, name: str) -> None:
    repo = tmp_path / "repo"
    _model(repo, "good")
    proc = start_server(repo, "--model-control-mode=explicit")
    # Over HTTP a name with '/' matches no endpoint at all; gRPC carries any string.
    client = grpcclient.InferenceServerClient(proc.grpc_url)
    model = _add_constant_model(2).SerializeToString()
    config = '{"backend": "onnxruntime", "max_batch_size": 4}'
    with pytest.raises(InferenceServerException) as err:
        client.load_model(name, config=config, files={"file:1/model.onnx": model})
    assert err.value.status() == "StatusCode.INVALID_ARGUMENT"
    # tritonserver's words (ValidateModelName), then ours
    assert err.value.message() == (
        f"invalid model name '{name}', model name must not contain path traversal characters "
        "(one folder name expected)"
    )
    assert not list(Path("/tmp").glob("evil*"))
    assert not list(tmp_path.glob("evil*"))
    assert client.is_server_live()


EMPTY_NAME = "Model name cannot be empty. Please enter a valid name to deploy."


def test_empty_and_whitespace_names_are_refused_before_the_lookup(
    start_server, tmp_path: Path
) -> None:
    """tritonserver trims the name first: an empty or whitespace-only name is INVALID_ARG
    with its words, not a missing model folder (NOT_FOUND); '...' and '..my_model' are
    names like any other (a missing folder)."""
    repo = tmp_path / "repo"
    _model(repo, "good")
    for blank in (" ", "   ", "\t", "\n", "\r", "\f", "\v", " \t \n "):
        (repo / blank).mkdir()  # even a folder of that name is not loaded
    proc = start_server(repo, "--model-control-mode=explicit")
    http = httpclient.InferenceServerClient(proc.http_url)
    grpc = grpcclient.InferenceServerClient(proc.grpc_url)
    for name in ("", " ", "   ", "\t", "\n", "\r", "\f", "\v", " \t \n "):
        with pytest.raises(InferenceServerException) as err:
            grpc.load_model(name)
        assert (err.value.status(), err.value.message()) == (
            "StatusCode.INVALID_ARGUMENT",
            EMPTY_NAME,
        ), repr(name)
        if name:  # HTTP: an empty name is a different path (the repository index)
            with pytest.raises(InferenceServerException) as err:
                http.load_model(name)
            assert (err.value.status(), err.value.message()) == ("400", EMPTY_NAME), repr(name)
    for name in ("...", "..my_model", "model..1"):
        with pytest.raises(InferenceServerException) as err:
            grpc.load_model(name)
        assert "failed to poll from model repository" in err.value.message(), name
    http.load_model("good")
    assert http.is_model_ready("good")


def test_file_overrides_cannot_leave_their_folder(start_server, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    _model(repo, "good")
    proc = start_server(repo, "--model-control-mode=explicit")
    client = httpclient.InferenceServerClient(proc.http_url)
    payload = b"x"
    config = '{"backend": "onnxruntime", "max_batch_size": 4}'
    with pytest.raises(InferenceServerException, match="is not allowed"):
        client.load_model("good", config=config, files={"file:../../escape.txt": payload})
    assert client.is_server_live()
