"""`edge-appliance check`: an offline verdict on a repository, with a reason per problem."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import onnx

from tests.integration.models import _add_constant_model
from tests.serverproc import ROOT

CONFIG = 'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 4\n'


def _model(repo: Path, name: str, content: bytes | None = None, config: str | None = None) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(config or CONFIG.format(name=name))
    path = repo / name / "1" / "model.onnx"
    if content is None:
        onnx.save(_add_constant_model(1), str(path))
    else:
        path.write_bytes(content)


def _check(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "appliance", "check", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        check=False,
    )


def test_a_good_repository_passes(tmp_path: Path) -> None:
    _model(tmp_path, "good")
    _model(tmp_path, "auto", config="")  # auto-completed from the ONNX file
    result = _check(str(tmp_path), "--show-config")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "OK: 2 of 2 model versions would serve" in result.stdout
    assert '"max_batch_size"' in result.stdout  # the completed config is shown


def test_problems_are_listed_with_reasons_and_fail_the_check(tmp_path: Path) -> None:
    _model(tmp_path, "good")
    _model(tmp_path, "corrupt", b"not an onnx file")
    _model(tmp_path, "badconfig", config="max_batch_size: [nope")
    result = _check(str(tmp_path), "--json")
    assert result.returncode == 1
    verdict = json.loads(result.stdout)
    assert verdict["serves"] is False
    rows = {row["name"]: row for row in verdict["models"]}
    assert rows["good"]["state"] == "READY"
    assert rows["corrupt"]["state"] == "UNAVAILABLE"
    assert "onnxruntime cannot load" in rows["corrupt"]["reason"]
    assert rows["badconfig"]["state"] == "UNAVAILABLE"
    assert "config.pbtxt" in rows["badconfig"]["reason"]


def test_not_a_folder_is_a_clear_error(tmp_path: Path) -> None:
    result = _check(str(tmp_path / "missing"))
    assert result.returncode == 1
    assert "is not a directory" in result.stderr


def test_the_check_reads_the_named_custom_configs(tmp_path: Path) -> None:
    _model(tmp_path, "edge_only")
    custom = tmp_path / "edge_only" / "configs"
    custom.mkdir()
    (custom / "jetson.pbtxt").write_text("max_batch_size: [nope")
    assert _check(str(tmp_path)).returncode == 0  # config.pbtxt: fine
    result = _check(str(tmp_path), "--model-config-name=jetson", "--json")
    assert result.returncode == 1
    (row,) = json.loads(result.stdout)["models"]
    assert "configs/jetson.pbtxt" in row["reason"]
    refused = _check(str(tmp_path), "--model-config-name=../jetson")
    assert refused.returncode == 2
    assert "not a path" in refused.stderr
