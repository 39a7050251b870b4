"""--model-namespacing (tritonserver's flag), on the real server with tritonclient, after the
cases of Triton's L0_model_namespacing: two repositories each hold a model `composing_model`
that computes differently (addsub: sum then difference; subadd: the other way round) and an
ensemble calling it, so each answer shows which repository's step ran."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.serverproc import ServerProcess

AMBIGUOUS = "model namespace must be provided to resolve ambiguity"

TENSORS = """\
input [
  { name: "INPUT0", data_type: TYPE_FP32, dims: [ 4 ] },
  { name: "INPUT1", data_type: TYPE_FP32, dims: [ 4 ] }
]
output [
  { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 4 ] },
  { name: "OUTPUT1", data_type: TYPE_FP32, dims: [ 4 ] }
]
"""
PYTHON_CONFIG = 'name: "{name}"\nbackend: "python"\nmax_batch_size: 0\n' + TENSORS
ENSEMBLE_CONFIG = (
    'name: "{name}"\nplatform: "ensemble"\nmax_batch_size: 0\n'
    + TENSORS
    + """\
ensemble_scheduling {
  step [ {
    model_name: "{step}"
    model_version: -1
    input_map { key: "INPUT0", value: "INPUT0" }
    input_map { key: "INPUT1", value: "INPUT1" }
    output_map { key: "OUTPUT0", value: "OUTPUT0" }
    output_map { key: "OUTPUT1", value: "OUTPUT1" }
  } ]
}
"""
)
# OUTPUT0 = INPUT0 {op0} INPUT1, OUTPUT1 = INPUT0 {op1} INPUT1.
MODEL = """\
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            outputs = [pb_utils.Tensor("OUTPUT0", a {op0} b), pb_utils.Tensor("OUTPUT1", a {op1} b)]
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
"""

A = np.arange(4, dtype=np.float32) + 10
B = np.ones(4, dtype=np.float32)
ADDSUB = (A + B, A - B)
SUBADD = (A - B, A + B)


def _python(repo: Path, name: str, op0: str, op1: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(PYTHON_CONFIG.replace("{name}", name))
    code = MODEL.replace("{op0}", op0).replace("{op1}", op1)
    (repo / name / "1" / "model.py").write_text(code)


def _ensemble(repo: Path, name: str, step: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    config = ENSEMBLE_CONFIG.replace("{name}", name).replace("{step}", step)
    (repo / name / "config.pbtxt").write_text(config)


def repositories(root: Path) -> list[Path]:
    """addsub_repo and subadd_repo: `composing_model` and `simple_ensemble` in both, an
    ensemble of a name of its own in each (simple_addsub, simple_subadd)."""
    addsub, subadd = root / "addsub_repo", root / "subadd_repo"
    _python(addsub, "composing_model", "+", "-")
    _python(subadd, "composing_model", "-", "+")
    for repo, unique in ((addsub, "simple_addsub"), (subadd, "simple_subadd")):
        _ensemble(repo, unique, "composing_model")
        _ensemble(repo, "simple_ensemble", "composing_model")
    return [addsub, subadd]


def _infer(client: httpclient.InferenceServerClient, model: str) -> tuple[np.ndarray, ...]:
    inputs = [httpclient.InferInput(n, [4], "FP32") for n in ("INPUT0", "INPUT1")]
    inputs[0].set_data_from_numpy(A)
    inputs[1].set_data_from_numpy(B)
    result = client.infer(model, inputs)
    return result.as_numpy("OUTPUT0"), result.as_numpy("OUTPUT1")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("namespacing")
    repos: list[Path | str] = list(repositories(root))
    with ServerProcess(
        repos,
        "--model-namespacing=true",
        "--model-control-mode=explicit",
        "--load-model=*",
        log_path=root / "server.log",
    ) as proc:
        yield proc


def test_each_ensemble_calls_its_own_repositorys_model(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    for got, want in zip(_infer(client, "simple_addsub"), ADDSUB, strict=True):
        np.testing.assert_allclose(got, want)
    for got, want in zip(_infer(client, "simple_subadd"), SUBADD, strict=True):
        np.testing.assert_allclose(got, want)


@pytest.mark.parametrize("model", ["composing_model", "simple_ensemble"])
def test_a_shared_name_is_ambiguous(server: ServerProcess, model: str) -> None:
    http = httpclient.InferenceServerClient(server.http_url)
    with pytest.raises(InferenceServerException, match=AMBIGUOUS) as caught:
        _infer(http, model)
    assert caught.value.status() == "400"
    assert f"There are 2 identifiers of model '{model}'" in caught.value.message()
    with pytest.raises(InferenceServerException, match=AMBIGUOUS):
        http.get_model_metadata(model)
    with pytest.raises(InferenceServerException, match=AMBIGUOUS):
        http.get_model_config(model)
    assert http.is_model_ready(model) is False
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    inputs = [grpcclient.InferInput(n, [4], "FP32") for n in ("INPUT0", "INPUT1")]
    inputs[0].set_data_from_numpy(A)
    inputs[1].set_data_from_numpy(B)
    with pytest.raises(InferenceServerException, match=AMBIGUOUS) as by_grpc:
        grpc.infer(model, inputs)
    assert by_grpc.value.status() == "StatusCode.INVALID_ARGUMENT"


def test_the_index_lists_each_copy(server: ServerProcess) -> None:
    index = httpclient.InferenceServerClient(server.http_url).get_model_repository_index()
    names = sorted(row["name"] for row in index)
    assert names == sorted(
        [
            "composing_model",
            "composing_model",
            "simple_addsub",
            "simple_ensemble",
            "simple_ensemble",
            "simple_subadd",
        ]
    )
    assert {row["state"] for row in index} == {"READY"}
    assert all(set(row) == {"name", "version", "state"} for row in index)  # READY: no reason


def test_statistics_and_metrics_of_each_copy(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    _infer(client, "simple_addsub")
    with pytest.raises(InferenceServerException, match=AMBIGUOUS):
        client.get_inference_statistics("composing_model")
    every = client.get_inference_statistics()["model_stats"]
    assert [s["name"] for s in every].count("composing_model") == 2
    url = f"http://127.0.0.1:{server.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    # Each copy has series of its own (no two samples with the same labels).
    success = [
        line
        for line in text.splitlines()
        if line.startswith("nv_inference_request_success{") and "composing_model" in line
    ]
    assert len(success) == 2
    assert len({sample.rsplit(" ", 1)[0] for sample in success}) == 2


def test_load_and_unload_by_a_shared_name_act_on_each_copy(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    client.unload_model("simple_ensemble")
    index = client.get_model_repository_index()
    states = [row["state"] for row in index if row["name"] == "simple_ensemble"]
    assert states == ["UNAVAILABLE", "UNAVAILABLE"]
    client.load_model("simple_ensemble")
    index = client.get_model_repository_index()
    states = [row["state"] for row in index if row["name"] == "simple_ensemble"]
    assert states == ["READY", "READY"]
    for got, want in zip(
        _infer(client, "simple_subadd"), SUBADD, strict=True
    ):  # the others still serve
        np.testing.assert_allclose(got, want)


def test_without_the_flag_a_name_in_two_repositories_stops_the_start(tmp_path: Path) -> None:
    repos = repositories(tmp_path)
    command = [sys.executable, "-m", "appliance", "serve", "--http-port=0", "--grpc-port=0"]
    command += ["--allow-metrics=false"]
    for repo in repos:
        command += ["--model-repository", str(repo)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode != 0
    assert "is in two repositories" in done.stdout + done.stderr


def _wait_for(predicate: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "the repository change was not picked up"
        time.sleep(0.1)


def _answers(client: httpclient.InferenceServerClient, model: str, want: tuple) -> bool:
    try:
        got = _infer(client, model)
    except InferenceServerException:
        return False
    return all(np.allclose(g, w) for g, w in zip(got, want, strict=True))


def test_steps_resolve_again_when_a_copy_comes_and_goes(tmp_path: Path) -> None:
    """L0_model_namespacing's test_dynamic_resolution: with one copy of composing_model gone,
    both ensembles call the other; with it back, each calls its own again."""
    repos: list[Path | str] = list(repositories(tmp_path))
    own = tmp_path / "addsub_repo" / "composing_model"
    away = tmp_path / "composing_model"
    flags = ("--model-namespacing=true", "--model-control-mode=poll", "--repository-poll-secs=0.3")
    with ServerProcess(repos, *flags, log_path=tmp_path / "server.log") as server:
        client = httpclient.InferenceServerClient(server.http_url)
        assert _answers(client, "simple_addsub", ADDSUB)
        own.rename(away)
        # One poll loads the remaining copy under the plain name, then unloads both copies.
        _wait_for(
            lambda: all(
                _answers(client, model, SUBADD)
                for model in ("composing_model", "simple_addsub", "simple_subadd")
            )
        )
        away.rename(own)
        _wait_for(
            lambda: (
                _answers(client, "simple_addsub", ADDSUB)
                and _answers(client, "simple_subadd", SUBADD)
            )
        )
        with pytest.raises(InferenceServerException, match=AMBIGUOUS):
            _infer(client, "composing_model")


def test_the_embedding_options_model_namespacing(tmp_path: Path) -> None:
    """tritonserver.Options(model_namespacing=True), in process, as Triton's Python API."""
    from appliance import tritonserver

    options = tritonserver.Options(
        model_repository=[str(repo) for repo in repositories(tmp_path)],
        model_namespacing=True,
        server_args=["--model-store-dir", str(tmp_path / "store")],
    )
    server = tritonserver.Server(options).start(wait_until_ready=True)
    try:
        responses = list(server.model("simple_subadd").infer(inputs={"INPUT0": A, "INPUT1": B}))
        outputs = responses[0].outputs
        np.testing.assert_allclose(np.asarray(outputs["OUTPUT0"]), SUBADD[0])
        np.testing.assert_allclose(np.asarray(outputs["OUTPUT1"]), SUBADD[1])
    finally:
        server.stop()


def test_explicit_loads_follow_a_copy_that_comes_and_goes(tmp_path: Path) -> None:
    """test_dynamic_resolution in EXPLICIT mode: loads made with one copy away call the other;
    once it is back, a load of the ensemble loads its own copy again, and the other ensemble
    keeps the copy of its own repository, although the name is ambiguous again."""
    repos: list[Path | str] = list(repositories(tmp_path))
    own = tmp_path / "addsub_repo" / "composing_model"
    away = tmp_path / "composing_model"
    flags = ("--model-namespacing=true", "--model-control-mode=explicit")
    with ServerProcess(repos, *flags, log_path=tmp_path / "server.log") as server:
        client = httpclient.InferenceServerClient(server.http_url)
        own.rename(away)
        for model in ("simple_addsub", "simple_subadd"):
            client.load_model(model)
        for model in ("simple_subadd", "simple_addsub", "composing_model"):
            assert _answers(client, model, SUBADD), model
        away.rename(own)
        client.load_model("simple_addsub")
        assert _answers(client, "simple_addsub", ADDSUB)
        assert _answers(client, "simple_subadd", SUBADD)
        with pytest.raises(InferenceServerException, match=AMBIGUOUS):
            _infer(client, "composing_model")
