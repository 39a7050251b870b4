"""TensorFlow models: recognised by config or files, refused with the conversion to do."""

from __future__ import annotations

from pathlib import Path

import pytest

from appliance.common.errors import ConfigError
from appliance.common.model_config import parse_config_text
from appliance.common.tf_advice import tensorflow_advice
from appliance.runtime.autocomplete import resolve_backend


def _savedmodel(model_dir: Path, version: int = 1) -> None:
    (model_dir / str(version) / "model.savedmodel" / "variables").mkdir(parents=True)
    (model_dir / str(version) / "model.savedmodel" / "saved_model.pb").write_bytes(b"\0")


def test_savedmodel_platform_gets_the_tf2onnx_command_and_the_config_change(
    tmp_path: Path,
) -> None:
    model_dir = tmp_path / "tfm"
    _savedmodel(model_dir, 1)
    _savedmodel(model_dir, 3)
    config = parse_config_text('name: "tfm"\nplatform: "tensorflow_savedmodel"\n', "test")
    with pytest.raises(ConfigError) as caught:
        resolve_backend(config, model_dir, [1, 3])
    message = caught.value.message
    assert "model 'tfm' is a TensorFlow SavedModel (tensorflow_savedmodel)" in message
    assert (
        f"python -m tf2onnx.convert --saved-model {model_dir}/3/model.savedmodel "
        f"--output {model_dir}/3/model.onnx --opset 17" in message
    )
    assert f'set platform: "onnxruntime_onnx" in {model_dir}/config.pbtxt' in message
    assert "(repeat the conversion for each version folder)" in message


def test_graphdef_names_its_tensors_from_the_config(tmp_path: Path) -> None:
    model_dir = tmp_path / "frozen"
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "1" / "model.graphdef").write_bytes(b"\0")
    config = parse_config_text(
        'name: "frozen"\nplatform: "tensorflow_graphdef"\n'
        'input [ { name: "images", data_type: TYPE_FP32, dims: [ 3 ] } ]\n'
        'output [ { name: "scores", data_type: TYPE_FP32, dims: [ 2 ] },'
        ' { name: "boxes", data_type: TYPE_FP32, dims: [ 4 ] } ]\n',
        "test",
    )
    advice = tensorflow_advice(config, model_dir, [1])
    assert advice is not None
    assert advice.command == (
        f"python -m tf2onnx.convert --graphdef {model_dir}/1/model.graphdef "
        "--inputs images:0 --outputs scores:0,boxes:0 "
        "--rename-inputs images --rename-outputs scores,boxes "
        f"--output {model_dir}/1/model.onnx --opset 17"
    )


def test_files_alone_identify_a_tensorflow_model(tmp_path: Path) -> None:
    model_dir = tmp_path / "noconfig"
    _savedmodel(model_dir)
    config = parse_config_text("", "test")
    with pytest.raises(ConfigError, match="is a TensorFlow SavedModel"):
        resolve_backend(config, model_dir, [1])


def test_tensorflow_backend_name_with_a_file_name(tmp_path: Path) -> None:
    model_dir = tmp_path / "named"
    (model_dir / "2").mkdir(parents=True)
    (model_dir / "2" / "frozen.pb").write_bytes(b"\0")
    config = parse_config_text(
        'name: "named"\nbackend: "tensorflow"\ndefault_model_filename: "frozen.pb"\n', "test"
    )
    with pytest.raises(ConfigError) as caught:
        resolve_backend(config, model_dir, [2])
    assert "--savedmodel" not in caught.value.message
    assert f"--saved-model {model_dir}/2/frozen.pb" in caught.value.message
    assert "remove its backend line and remove default_model_filename" in caught.value.message


def test_an_onnx_file_beside_a_savedmodel_is_served(tmp_path: Path) -> None:
    model_dir = tmp_path / "both"
    _savedmodel(model_dir)
    (model_dir / "1" / "model.onnx").write_bytes(b"\0")
    config = parse_config_text("", "test")
    assert resolve_backend(config, model_dir, [1]) == "onnxruntime"


def test_other_models_get_no_advice(tmp_path: Path) -> None:
    (tmp_path / "m" / "1").mkdir(parents=True)
    config = parse_config_text('platform: "onnxruntime_onnx"\n', "test")
    assert tensorflow_advice(config, tmp_path / "m", [1]) is None
