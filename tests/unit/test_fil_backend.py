"""FIL backend: parameters, file names, format sniffing, output rules, the conversion cache."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from appliance.common.protocol import model_config_pb2 as mc
from appliance.runtime.autocomplete import resolve_backend
from edge_backends import fil_convert
from edge_backends.api import InstanceSpec, ModelLoadError
from edge_backends.fil import FilBackend, output_width
from edge_backends.fil_convert import TreeModel, require
from edge_backends.fil_params import (
    FilOptions,
    cache_root,
    default_filename,
    parse_options,
    sniff_family,
)

ROOT = Path(__file__).resolve().parents[2]
TREE_LIBRARIES = ("xgboost", "lightgbm", "sklearn", "onnxmltools", "skl2onnx")


def test_parameters_default_as_triton_fil() -> None:
    assert parse_options({}) == FilOptions("xgboost", False, False, 0.5)
    options = parse_options(
        {
            "model_type": "lightgbm",
            "output_class": "true",
            "predict_proba": "True",
            "threshold": "0.3",
        }
    )
    assert options == FilOptions("lightgbm", True, True, 0.3)
    assert parse_options({"is_classifier": "true"}).output_class  # FIL's newer name


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ({"model_type": "catboost"}, "unknown model_type 'catboost'; expected one of xgboost,"),
        (
            {"model_type": "treelite_checkpoint"},
            "model_type 'treelite_checkpoint' is not supported",
        ),
        ({"output_class": "maybe"}, "parameter 'output_class' must be true or false, got 'maybe'"),
        ({"threshold": "half"}, "parameter 'threshold' must be a number, got 'half'"),
    ],
)
def test_bad_parameters_are_named(parameters: dict[str, str], message: str) -> None:
    with pytest.raises(ModelLoadError) as info:
        parse_options(parameters)
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("model_type", "filename"),
    [
        ("", "xgboost.model"),
        ("xgboost", "xgboost.model"),
        ("xgboost_json", "xgboost.json"),
        ("xgboost_ubj", "xgboost.ubj"),
        ("lightgbm", "model.txt"),
        ("treelite_checkpoint", "checkpoint.tl"),
        ("onnx", "model.onnx"),
    ],
)
def test_default_filename_follows_model_type(
    model_type: str, filename: str, tmp_path: Path
) -> None:
    assert default_filename(model_type) == filename
    config = mc.ModelConfig(name="m", backend="fil")
    if model_type:
        config.parameters["model_type"].string_value = model_type
    assert resolve_backend(config, tmp_path, [1]) == "fil"
    assert config.default_model_filename == filename


def test_explicit_default_model_filename_wins(tmp_path: Path) -> None:
    config = mc.ModelConfig(name="m", backend="fil", default_model_filename="forest.json")
    config.parameters["model_type"].string_value = "lightgbm"
    resolve_backend(config, tmp_path, [1])
    assert config.default_model_filename == "forest.json"


@pytest.mark.parametrize(
    ("head", "suffix", "family"),
    [
        (b'{"learner": {', ".json", "xgboost"),
        (b"{L\x00\x00\x00\x00\x00\x00\x00\x07learner", ".model", "xgboost"),
        (b"tree\nversion=v4\n", ".txt", "lightgbm"),
        (b"\x08\x08\x12\x07skl2onnx", ".onnx", "onnx"),
        (b"\x00\x00\x00?binf", ".model", "xgboost"),  # legacy binary: the name tells
        (b"TREELITE", ".tl", None),
        (b"hello", ".txt", None),
    ],
)
def test_format_is_sniffed_from_content(head: bytes, suffix: str, family: str | None) -> None:
    assert sniff_family(head, suffix) == family


def _model(kind: str, classes: int) -> TreeModel:
    return TreeModel("xgboost", "XGBoost x", kind, 4, classes, Path("m.onnx"), "in", "out")


def test_output_width_follows_fil_rules() -> None:
    binary, multi, regressor = (
        _model("classifier", 2),
        _model("classifier", 3),
        _model("regressor", 0),
    )
    assert output_width(binary, FilOptions(predict_proba=True)) == 2
    assert output_width(multi, FilOptions(output_class=True, predict_proba=True)) == 3
    assert output_width(multi, FilOptions(output_class=True)) == 1
    assert output_width(binary, FilOptions()) == 1  # P(class 1), as a regressor reads it
    assert output_width(regressor, FilOptions()) == 1
    with pytest.raises(ModelLoadError, match="has 3 classes: set output_class true"):
        output_width(multi, FilOptions())
    with pytest.raises(ModelLoadError, match="is a regressor: set output_class and predict_proba"):
        output_width(regressor, FilOptions(output_class=True))


def test_missing_library_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "xgboost", None)  # `import xgboost` now raises ImportError
    with pytest.raises(ModelLoadError) as info:
        require("xgboost", "xgboost")
    assert "XGBoost models need the Python package 'xgboost'" in str(info.value)
    assert "install edge-appliance[trees]" in str(info.value)
    # The same reason reaches a model load.
    model = tmp_path / "xgboost.json"
    model.write_text('{"learner": {}, "version": [2, 1, 0]}')
    monkeypatch.setenv("EDGE_APPLIANCE_FIL_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ModelLoadError, match=r"install edge-appliance\[trees\]"):
        FilBackend().inspect(model)


def test_cache_folder_choice(tmp_path: Path) -> None:
    explicit, state = tmp_path / "explicit", tmp_path / "state"
    assert cache_root({"EDGE_APPLIANCE_FIL_CACHE": str(explicit)}) == explicit
    assert cache_root({"STATE_DIRECTORY": f"{state}:/other"}) == state / "fil-cache"
    assert cache_root({"XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "edge-appliance" / "fil"
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    fallback = cache_root({"EDGE_APPLIANCE_FIL_CACHE": str(blocked / "sub")})
    assert fallback.name.startswith("edge-appliance-fil-")


def test_tree_libraries_are_not_imported_without_a_fil_model() -> None:
    code = (
        "import sys, appliance.server.app, appliance.common.model_config, edge_backends.fil\n"
        f"print(sorted(m for m in {TREE_LIBRARIES!r} if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
        timeout=60,
    )
    assert out.stdout.strip() == "[]"


# With the tree libraries: conversion, its check and its cache.
def _train_xgboost(seed: int) -> object:
    xgb = pytest.importorskip("xgboost", reason="pip install edge-appliance[trees]")
    pytest.importorskip("onnxmltools", reason="pip install edge-appliance[trees]")
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(200, 4)).astype(np.float32)
    y = (x[:, 0] + seed * x[:, 1] > 0).astype(int)
    params = {"objective": "binary:logistic", "max_depth": 3, "seed": seed}
    return xgb.train(params, xgb.DMatrix(x, label=y), 10)


def test_second_load_reuses_the_cached_conversion(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    booster = _train_xgboost(1)
    path = tmp_path / "xgboost.json"
    booster.save_model(path)  # type: ignore[attr-defined]
    cache = tmp_path / "cache"
    monkeypatch.setenv("EDGE_APPLIANCE_FIL_CACHE", str(cache))
    caplog.set_level(logging.INFO, logger="edge_backends.fil_convert")
    first = FilBackend().model(path)
    assert "converted to ONNX" in caplog.text
    stamps = {p: p.stat().st_mtime_ns for p in cache.iterdir()}
    caplog.clear()
    second = FilBackend().model(path)  # a fresh backend: only the disk cache remembers
    assert second == first
    assert "reusing its ONNX conversion" in caplog.text
    assert {p: p.stat().st_mtime_ns for p in cache.iterdir()} == stamps
    # A process that finds the conversion cached never imports the tree libraries.
    code = (
        "import sys, pathlib\nfrom edge_backends.fil import FilBackend\n"
        f"FilBackend().model(pathlib.Path({str(path)!r}))\n"
        f"print(sorted(m for m in {TREE_LIBRARIES!r} if m in sys.modules))"
    )
    env = {**os.environ, "EDGE_APPLIANCE_FIL_CACHE": str(cache)}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env, timeout=60
    )
    assert out.stdout.strip() == "[]", out.stderr
    # A damaged cache entry is converted again, not served.
    first.onnx_path.write_bytes(b"damaged")
    caplog.clear()
    third = FilBackend().model(path)
    assert "is unusable" in caplog.text
    assert "converted to ONNX" in caplog.text
    instance = FilBackend().create_instance(
        InstanceSpec("m", 1, path, "i", parameters={"predict_proba": "true"})
    )
    rows = np.random.default_rng(3).normal(size=(5, 4)).astype(np.float32)
    got = instance.execute({"input__0": rows}, ["output__0"])["output__0"]
    xgb = pytest.importorskip("xgboost")
    expected = booster.predict(xgb.DMatrix(rows))  # type: ignore[attr-defined]
    np.testing.assert_allclose(got[:, 1], expected, rtol=1e-5, atol=1e-6)
    assert third.onnx_path == first.onnx_path
    # With --strict-model-config there is no auto-complete: the instance checks the dims.
    strict = {"output": [{"name": "output__0", "dims": [1]}]}
    with pytest.raises(ModelLoadError, match=r"dims \[1\] do not match .* \[2\] per row"):
        FilBackend().create_instance(
            InstanceSpec(
                "m", 1, path, "i", parameters={"predict_proba": "true"}, model_config=strict
            )
        )


def test_a_conversion_that_disagrees_with_the_library_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    one, other = _train_xgboost(1), _train_xgboost(2)
    path = tmp_path / "xgboost.json"
    one.save_model(path)  # type: ignore[attr-defined]
    monkeypatch.setenv("EDGE_APPLIANCE_FIL_CACHE", str(tmp_path / "cache"))
    model = FilBackend().model(path)
    # The same check, given another booster's predictions, must see the difference.
    with pytest.raises(ModelLoadError, match="disagrees with XGBoost on probe rows"):
        fil_convert._check(model, model.onnx_path, other, "xgboost", path)
