"""Tree models (backend "fil"): XGBoost, LightGBM and scikit-learn forests trained here, served
in Triton FIL layouts and compared with the libraries' own predictions over HTTP and gRPC."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.http.aio as httpaio

from tests.serverproc import ServerProcess

_WHY = "tree libraries not installed: pip install edge-appliance[trees]"
xgb = pytest.importorskip("xgboost", reason=_WHY)
lgb = pytest.importorskip("lightgbm", reason=_WHY)
pytest.importorskip("onnxmltools", reason=_WHY)
skl2onnx = pytest.importorskip("skl2onnx", reason=_WHY)
datasets = pytest.importorskip("sklearn.datasets", reason=_WHY)
ensemble = pytest.importorskip("sklearn.ensemble", reason=_WHY)

FEATURES = 8


def fil_config(
    name: str, model_type: str, dims: int | None, kind: str = "KIND_AUTO", **params: str
) -> str:
    """A Triton FIL config.pbtxt; dims None leaves inputs and outputs to auto-complete."""
    params = {"model_type": model_type, **params}
    tensors = ""
    if dims is not None:
        tensors = (
            f'input [{{ name: "input__0" data_type: TYPE_FP32 dims: [ {FEATURES} ] }}]\n'
            f'output [{{ name: "output__0" data_type: TYPE_FP32 dims: [ {dims} ] }}]\n'
        )
    parameters = ",\n".join(
        f'  {{ key: "{k}" value: {{ string_value: "{v}" }} }}' for k, v in params.items()
    )
    return (
        f'name: "{name}"\nbackend: "fil"\nmax_batch_size: 64\n{tensors}'
        f"instance_group [{{ kind: {kind} }}]\nparameters [\n{parameters}\n]\n"
        "dynamic_batching { max_queue_delay_microseconds: 50000 }\n"
    )


FOREST_ORT_CONFIG = f"""name: "forest_ort"
platform: "onnxruntime_onnx"
max_batch_size: 64
input [{{ name: "X" data_type: TYPE_FP32 dims: [ {FEATURES} ] }}]
output [
  {{ name: "label" data_type: TYPE_INT64 dims: [ 1 ] reshape: {{ shape: [ ] }} }},
  {{ name: "probabilities" data_type: TYPE_FP32 dims: [ 2 ] }}
]
dynamic_batching {{ }}
"""


def place(repo: Path, name: str, config: str, files: dict[str, Path | bytes]) -> None:
    version = repo / name / "1"
    version.mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(config)
    for filename, source in files.items():
        target = version / filename
        if isinstance(source, bytes):
            target.write_bytes(source)
        else:
            shutil.copyfile(source, target)


@dataclass
class Trees:
    repo: Path
    cache: Path
    rows: np.ndarray  # test rows, FP32 [n, FEATURES]
    xgb_classifier: Any
    xgb_regressor: Any
    lgb_classifier: Any
    forest: Any


def train(tmp: Path) -> Trees:
    x, y = datasets.make_classification(
        n_samples=400, n_features=FEATURES, n_informative=5, random_state=0
    )
    x3, y3 = datasets.make_classification(
        n_samples=400, n_features=FEATURES, n_informative=5, n_classes=3, random_state=1
    )
    xr, yr = datasets.make_regression(n_samples=400, n_features=FEATURES, random_state=2)
    x, x3, xr = (a.astype(np.float32) for a in (x, x3, xr))
    xgb_classifier = xgb.XGBClassifier(n_estimators=20, max_depth=4, random_state=0).fit(x, y)
    xgb_regressor = xgb.XGBRegressor(n_estimators=20, max_depth=4, random_state=0).fit(xr, yr)
    lgb_classifier = lgb.LGBMClassifier(
        n_estimators=20, num_leaves=8, random_state=0, deterministic=True, verbose=-1
    ).fit(x3, y3)
    forest = ensemble.RandomForestClassifier(n_estimators=10, max_depth=5, random_state=0)
    forest.fit(x, y)

    files = tmp / "files"
    files.mkdir()
    xgb_classifier.save_model(files / "xgboost.json")
    xgb_classifier.get_booster().save_model(files / "xgboost.ubj")
    xgb_regressor.save_model(files / "regressor.json")
    lgb_classifier.booster_.save_model(str(files / "model.txt"))
    onnx_forest = skl2onnx.to_onnx(forest, x[:1], options={"zipmap": False})
    (files / "model.onnx").write_bytes(onnx_forest.SerializeToString())

    repo = tmp / "repo"
    repo.mkdir()
    # Triton's default file name for model_type "xgboost"; recent XGBoost writes UBJSON there.
    place(
        repo,
        "xgb_proba",
        fil_config("xgb_proba", "xgboost", 2, output_class="true", predict_proba="true"),
        {"xgboost.model": files / "xgboost.ubj"},
    )
    place(
        repo,
        "xgb_class",
        fil_config(
            "xgb_class", "xgboost_json", None, "KIND_GPU", output_class="true", threshold="0.3"
        ),
        {"xgboost.json": files / "xgboost.json"},
    )
    regressor_config = fil_config("xgb_reg", "xgboost_json", 1, output_class="false")
    place(
        repo,
        "xgb_reg",
        regressor_config.replace(
            'backend: "fil"', 'backend: "fil"\ndefault_model_filename: "r.js"'
        ),
        {"r.js": files / "regressor.json"},  # any name: the content tells,
    )
    lgb_proba = fil_config("lgb_proba", "lightgbm", 3, output_class="true", predict_proba="true")
    place(repo, "lgb_proba", lgb_proba, {"model.txt": files / "model.txt"})
    lgb_class = fil_config("lgb_class", "lightgbm", 1, output_class="true")
    place(repo, "lgb_class", lgb_class, {"model.txt": files / "model.txt"})
    # A scikit-learn forest exported with skl2onnx: as a plain ONNX Runtime model (the label
    # output is [batch] alone, so config.pbtxt gives it dims [1] and an empty reshape) ...
    place(repo, "forest_ort", FOREST_ORT_CONFIG, {"model.onnx": files / "model.onnx"})
    # ... and behind the FIL interface (model_type "onnx").
    forest_fil = fil_config("forest_fil", "onnx", 2, output_class="true", predict_proba="true")
    place(repo, "forest_fil", forest_fil, {"model.onnx": files / "model.onnx"})

    # Broken ones: each fails alone, with its reason.
    truncated = (files / "xgboost.json").read_bytes()[:500]
    broken = fil_config("broken_booster", "xgboost_json", 2, predict_proba="true")
    place(repo, "broken_booster", broken, {"xgboost.json": truncated})
    unknown = fil_config("unknown_type", "catboost", 1).replace(
        'backend: "fil"', 'backend: "fil"\ndefault_model_filename: "xgboost.json"'
    )
    place(repo, "unknown_type", unknown, {"xgboost.json": files / "xgboost.json"})
    wrong_dims = fil_config("wrong_dims", "lightgbm", 1, output_class="true", predict_proba="true")
    place(repo, "wrong_dims", wrong_dims, {"model.txt": files / "model.txt"})
    wrong_type = fil_config("wrong_type", "lightgbm", 1, output_class="true")
    place(repo, "wrong_type", wrong_type, {"model.txt": files / "xgboost.json"})

    rows = np.random.default_rng(7).normal(size=(37, FEATURES)).astype(np.float32)
    return Trees(repo, tmp / "cache", rows, xgb_classifier, xgb_regressor, lgb_classifier, forest)


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory) -> Trees:
    return train(tmp_path_factory.mktemp("trees"))


@pytest.fixture(scope="module")
def fil_server(trees: Trees, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = ServerProcess(
        trees.repo,
        log_path=tmp_path_factory.mktemp("fil-logs") / "server.log",
        env={"EDGE_APPLIANCE_FIL_CACHE": str(trees.cache)},
    )
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()


def infer(
    server: ServerProcess,
    protocol: str,
    model: str,
    rows: np.ndarray,
    output: str = "output__0",
    input_name: str = "input__0",
) -> np.ndarray:
    module: Any = httpclient if protocol == "http" else grpcclient
    client = module.InferenceServerClient(
        server.http_url if protocol == "http" else server.grpc_url
    )
    tensor = module.InferInput(input_name, list(rows.shape), "FP32")
    tensor.set_data_from_numpy(rows)
    result = client.infer(model, [tensor], outputs=[module.InferRequestedOutput(output)])
    return np.asarray(result.as_numpy(output))


PROTOCOLS = ["http", "grpc"]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_xgboost_probabilities_match_predict_proba(
    fil_server: ServerProcess, trees: Trees, protocol: str
) -> None:
    got = infer(fil_server, protocol, "xgb_proba", trees.rows)
    expected = trees.xgb_classifier.predict_proba(trees.rows)
    assert got.shape == (len(trees.rows), 2)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_xgboost_class_ids_apply_the_threshold(
    fil_server: ServerProcess, trees: Trees, protocol: str
) -> None:
    got = infer(fil_server, protocol, "xgb_class", trees.rows)
    positive = trees.xgb_classifier.predict_proba(trees.rows)[:, 1]
    expected = (positive > 0.3).astype(np.float32).reshape(-1, 1)
    assert (positive > 0.3).sum() != (positive > 0.5).sum(), "the threshold must matter here"
    np.testing.assert_array_equal(got, expected)


def test_auto_complete_fills_tensors_from_model_and_parameters(fil_server: ServerProcess) -> None:
    config = httpclient.InferenceServerClient(fil_server.http_url).get_model_config("xgb_class")
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["input"]] == [
        ("input__0", "TYPE_FP32", [FEATURES])
    ]
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["output"]] == [
        ("output__0", "TYPE_FP32", [1])
    ]
    assert config["default_model_filename"] == "xgboost.json"  # follows model_type


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_xgboost_regressor_matches_predict(
    fil_server: ServerProcess, trees: Trees, protocol: str
) -> None:
    got = infer(fil_server, protocol, "xgb_reg", trees.rows)
    expected = trees.xgb_regressor.predict(trees.rows).reshape(-1, 1)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_lightgbm_multiclass_matches_the_library(
    fil_server: ServerProcess, trees: Trees, protocol: str
) -> None:
    proba = infer(fil_server, protocol, "lgb_proba", trees.rows)
    np.testing.assert_allclose(
        proba, trees.lgb_classifier.predict_proba(trees.rows), rtol=1e-5, atol=1e-6
    )
    classes = infer(fil_server, protocol, "lgb_class", trees.rows)
    expected = trees.lgb_classifier.predict(trees.rows).astype(np.float32).reshape(-1, 1)
    np.testing.assert_array_equal(classes, expected)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_sklearn_forest_exported_with_skl2onnx(
    fil_server: ServerProcess, trees: Trees, protocol: str
) -> None:
    expected_proba = trees.forest.predict_proba(trees.rows)
    # As a plain ONNX Runtime model: skl2onnx's own outputs.
    labels = infer(fil_server, protocol, "forest_ort", trees.rows, "label", "X")
    np.testing.assert_array_equal(labels, trees.forest.predict(trees.rows).reshape(-1, 1))
    proba = infer(fil_server, protocol, "forest_ort", trees.rows, "probabilities", "X")
    np.testing.assert_allclose(proba, expected_proba, rtol=1e-5, atol=1e-6)
    # Behind the FIL interface.
    fil_proba = infer(fil_server, protocol, "forest_fil", trees.rows)
    np.testing.assert_allclose(fil_proba, expected_proba, rtol=1e-5, atol=1e-6)


def test_broken_models_fail_alone_with_their_reason(fil_server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(fil_server.http_url)
    index = {e["name"]: e for e in client.get_model_repository_index()}
    for name in ("broken_booster", "unknown_type", "wrong_dims", "wrong_type"):
        assert index[name]["state"] == "UNAVAILABLE", index[name]
    broken = index["broken_booster"]["reason"]
    assert "cannot read XGBoost model" in broken
    assert "broken_booster/1/xgboost.json" in broken
    assert "Stack trace" not in broken
    assert (
        "unknown model_type 'catboost'; expected one of xgboost, xgboost_json"
        in (index["unknown_type"]["reason"])
    )
    assert (
        "output 'output__0' dims [1] do not match what the LightGBM multiclass model returns "
        "with these parameters: [3] per row (3 classes)" in index["wrong_dims"]["reason"]
    )
    wrong_type = index["wrong_type"]["reason"]
    assert "model_type 'lightgbm' expects a LightGBM model but" in wrong_type
    assert "set model_type to 'xgboost' or 'xgboost_json' or 'xgboost_ubj'" in wrong_type
    assert index["xgb_proba"]["state"] == "READY"
    assert client.is_server_live()


def test_gpu_instances_run_on_cpu_and_say_so(fil_server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(fil_server.http_url)
    index = {e["name"]: e for e in client.get_model_repository_index()}
    assert index["xgb_class"]["state"] == "READY"
    assert "KIND_GPU instance(s)" in index["xgb_class"]["reason"]
    assert "tree models run on CPU here" in index["xgb_class"]["reason"]
    assert client.get_model_config("xgb_proba")["instance_group"][0]["kind"] == "KIND_CPU"


async def test_concurrent_requests_are_batched(fil_server: ServerProcess, trees: Trees) -> None:
    client = httpaio.InferenceServerClient(fil_server.http_url)
    try:
        before = (await client.get_inference_statistics("xgb_proba"))["model_stats"][0]

        async def one(i: int) -> np.ndarray:
            rows = trees.rows[i : i + 1 + i % 3]
            tensor = httpaio.InferInput("input__0", list(rows.shape), "FP32")
            tensor.set_data_from_numpy(rows)
            return (await client.infer("xgb_proba", [tensor])).as_numpy("output__0")

        outputs = await asyncio.gather(*(one(i) for i in range(16)))
        after = (await client.get_inference_statistics("xgb_proba"))["model_stats"][0]
    finally:
        await client.close()
    for i, out in enumerate(outputs):
        rows = trees.rows[i : i + 1 + i % 3]
        np.testing.assert_allclose(
            out, trees.xgb_classifier.predict_proba(rows), rtol=1e-5, atol=1e-6
        )
    assert after["execution_count"] - before["execution_count"] < 16
    assert max(b["batch_size"] for b in after["batch_stats"]) > 1


def test_conversion_is_cached_across_restarts(start_server, trees: Trees, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    repo, cache = tmp_path / "repo", tmp_path / "cache"
    shutil.copytree(trees.repo / "xgb_reg", repo / "xgb_reg")
    env = {"EDGE_APPLIANCE_FIL_CACHE": str(cache)}
    first = start_server(repo, env=env)
    assert "converted to ONNX" in first.log()
    expected = infer(first, "grpc", "xgb_reg", trees.rows)
    first.stop()
    cached = {p: p.stat().st_mtime_ns for p in cache.iterdir()}
    assert sorted(p.suffix for p in cached) == [".json", ".onnx"]

    second = start_server(repo, env=env)
    assert "reusing its ONNX conversion" in second.log()
    assert "converted to ONNX" not in second.log()
    assert {p: p.stat().st_mtime_ns for p in cache.iterdir()} == cached
    np.testing.assert_array_equal(infer(second, "http", "xgb_reg", trees.rows), expected)
    # Nothing was written beside the model: the poller and signed manifests see no new file.
    assert sorted(p.name for p in (repo / "xgb_reg" / "1").iterdir()) == ["r.js"]
