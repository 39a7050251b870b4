"""TensorFlow models: `check` and the server both say how to convert them, in the same words."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import onnx
import tritonclient.http as httpclient

from tests.integration.models import _add_constant_model
from tests.serverproc import ROOT

SAVEDMODEL_CONFIG = 'name: "tf_saved"\nplatform: "tensorflow_savedmodel"\nmax_batch_size: 8\n'


def _repo(root: Path) -> Path:
    saved = root / "tf_saved" / "1" / "model.savedmodel"
    (saved / "variables").mkdir(parents=True)
    (saved / "saved_model.pb").write_bytes(b"\0")
    (root / "tf_saved" / "config.pbtxt").write_text(SAVEDMODEL_CONFIG)
    (root / "tf_frozen" / "1").mkdir(parents=True)  # no config: found by its file
    (root / "tf_frozen" / "1" / "model.graphdef").write_bytes(b"\0")
    (root / "good" / "1").mkdir(parents=True)
    onnx.save(_add_constant_model(1), str(root / "good" / "1" / "model.onnx"))
    return root


def _check(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "appliance", "check", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        check=False,
    )


def test_check_prints_the_conversion_and_fails(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    result = _check(str(repo))
    assert result.returncode == 1, result.stdout + result.stderr
    out = result.stdout
    row = next(line for line in out.splitlines() if line.startswith("tf_saved "))
    assert row.split()[1:5] == ["-", "UNAVAILABLE", "tensorflow_savedmodel", "a"]
    assert row.endswith("a TensorFlow SavedModel, not run here: convert it to ONNX (below)")
    assert (
        f"tf_saved: TensorFlow SavedModel. Convert it to ONNX (pip install tf2onnx tensorflow):\n"
        f"  python -m tf2onnx.convert --saved-model {repo}/tf_saved/1/model.savedmodel "
        f"--output {repo}/tf_saved/1/model.onnx --opset 17\n"
        f'then set platform: "onnxruntime_onnx" in {repo}/tf_saved/config.pbtxt.'
    ) in out
    assert f"--graphdef {repo}/tf_frozen/1/model.graphdef --inputs INPUT_NAME:0" in out
    assert "then nothing else: the server finds model.onnx by its name." in out  # no config
    assert "NOT OK: 1 of 3 model versions would serve" in out


def test_check_json_carries_the_conversions(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    result = _check(str(repo), "--json")
    report = json.loads(result.stdout)
    assert report["serves"] is False
    saved = report["conversions"]["tf_saved"]
    assert saved["platform"] == "tensorflow_savedmodel"
    assert saved["command"].startswith("python -m tf2onnx.convert --saved-model ")
    reasons = {m["name"]: m.get("reason", "") for m in report["models"]}
    assert saved["command"] in reasons["tf_saved"]  # the server's reason says the same


def test_server_refuses_the_model_with_the_same_guidance(start_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    repo = _repo(tmp_path / "repo")
    proc = start_server(repo)
    client = httpclient.InferenceServerClient(proc.http_url)
    index = {e["name"]: e for e in client.get_model_repository_index()}
    assert index["good"]["state"] == "READY"
    reason = index["tf_saved"].get("reason", "")
    assert index["tf_saved"]["state"] == "UNAVAILABLE"
    assert reason.startswith(
        "model 'tf_saved' is a TensorFlow SavedModel (tensorflow_savedmodel), which "
        "edge-appliance does not run; convert it to ONNX (pip install tf2onnx tensorflow): "
        f"python -m tf2onnx.convert --saved-model {repo}/tf_saved/1/model.savedmodel"
    )
    assert 'set platform: "onnxruntime_onnx"' in reason
    assert "is a TensorFlow GraphDef (tensorflow_graphdef)" in index["tf_frozen"].get("reason", "")
    assert "tf2onnx.convert" in proc.log()
