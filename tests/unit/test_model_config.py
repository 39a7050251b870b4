"""config.pbtxt parsing, auto-complete, validation and version policy."""

from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from appliance.common.errors import ConfigError
from appliance.common.model_config import (
    check_file_names,
    parse_config_text,
    read_config,
    validate_config,
)
from appliance.runtime.autocomplete import complete_config
from appliance.runtime.version_policy import select_versions
from edge_backends.api import ModelSignature, TensorSpec

BATCHED = ModelSignature(
    inputs=(TensorSpec("x", "FP32", (-1, 3)),), outputs=(TensorSpec("y", "INT64", (-1, 2)),)
)
FIXED = ModelSignature(
    inputs=(TensorSpec("x", "FP32", (1, 3)),), outputs=(TensorSpec("y", "INT64", (1, 2)),)
)


def config(text: str) -> mc.ModelConfig:
    return text_format.Parse(text, mc.ModelConfig())


def test_read_config_reports_file_and_position(tmp_path: Path) -> None:
    (tmp_path / "config.pbtxt").write_text('name: "m"\nmax_batch_size: x\n')
    with pytest.raises(ConfigError, match=r"config.pbtxt: 2:\d+"):
        read_config(tmp_path)


def test_missing_config_is_empty(tmp_path: Path) -> None:
    cfg, found = read_config(tmp_path)
    assert not found
    assert cfg.name == ""


def test_auto_complete_of_a_batching_model() -> None:
    cfg = mc.ModelConfig()
    complete_config(cfg, BATCHED, "m")
    assert cfg.name == "m"
    assert cfg.max_batch_size == 4
    assert cfg.HasField("dynamic_batching")
    assert [(i.name, i.data_type, list(i.dims)) for i in cfg.input] == [("x", mc.TYPE_FP32, [3])]
    assert [(o.name, o.data_type, list(o.dims)) for o in cfg.output] == [("y", mc.TYPE_INT64, [2])]
    assert cfg.instance_group[0].count == 1
    assert cfg.version_policy.latest.num_versions == 1


@pytest.mark.parametrize(("default", "batcher"), [(16, True), (1, False), (0, False)])
def test_auto_complete_uses_the_default_max_batch_size(default: int, batcher: bool) -> None:
    """--backend-config default-max-batch-size; the dynamic batcher above 1, as tritonserver."""
    cfg = mc.ModelConfig()
    complete_config(cfg, BATCHED, "m", default)
    assert cfg.max_batch_size == default
    assert cfg.HasField("dynamic_batching") is batcher
    # Without batching, the batch dimension is one of the tensor's own.
    assert list(cfg.input[0].dims) == ([-1, 3] if default == 0 else [3])


def test_auto_complete_of_a_fixed_shape_model_does_not_batch() -> None:
    cfg = mc.ModelConfig()
    complete_config(cfg, FIXED, "m")
    assert cfg.max_batch_size == 0
    assert not cfg.HasField("dynamic_batching")
    assert list(cfg.input[0].dims) == [1, 3]


def test_partial_config_keeps_what_is_given() -> None:
    cfg = config('max_batch_size: 2\ninput [ { name: "x" } ]')
    complete_config(cfg, BATCHED, "m")
    assert cfg.max_batch_size == 2
    assert list(cfg.input[0].dims) == [3]
    assert cfg.input[0].data_type == mc.TYPE_FP32


def test_partial_config_naming_an_unknown_tensor_fails() -> None:
    cfg = config('input [ { name: "nope" } ]')
    with pytest.raises(ConfigError, match=r"input .nope. in config\.pbtxt is not in the model"):
        complete_config(cfg, BATCHED, "m")


def _complete(text: str) -> mc.ModelConfig:
    cfg = config(text)
    complete_config(cfg, BATCHED, "m")
    return cfg


def test_validate_rejects_wrong_datatype(tmp_path: Path) -> None:
    cfg = _complete(
        'name: "m"\nmax_batch_size: 4\n'
        'input [ { name: "x", data_type: TYPE_INT32, dims: [3] } ]\n'
        'output [ { name: "y", data_type: TYPE_INT64, dims: [2] } ]'
    )
    with pytest.raises(ConfigError, match="input 'x': data_type TYPE_INT32 does not match"):
        validate_config(cfg, tmp_path / "m", BATCHED)


def test_validate_rejects_batching_on_a_fixed_model(tmp_path: Path) -> None:
    cfg = config(
        'name: "m"\nmax_batch_size: 4\n'
        'input [ { name: "x", data_type: TYPE_FP32, dims: [3] } ]\n'
        'output [ { name: "y", data_type: TYPE_INT64, dims: [2] } ]'
    )
    with pytest.raises(ConfigError, match="first dimension is not dynamic"):
        validate_config(cfg, tmp_path / "m", FIXED)


def test_validate_rejects_name_mismatch(tmp_path: Path) -> None:
    cfg = _complete('name: "other"')
    with pytest.raises(ConfigError, match="does not match the model folder 'm'"):
        validate_config(cfg, tmp_path / "m", BATCHED)


def test_validate_rejects_bad_preferred_batch_size(tmp_path: Path) -> None:
    cfg = _complete('name: "m"\nmax_batch_size: 4\ndynamic_batching { preferred_batch_size: [8] }')
    with pytest.raises(ConfigError, match="preferred_batch_size 8"):
        validate_config(cfg, tmp_path / "m", BATCHED)


def test_validate_rejects_zero_dims(tmp_path: Path) -> None:
    cfg = config(
        'name: "m"\ninput [ { name: "x", data_type: TYPE_FP32, dims: [0] } ]\n'
        'output [ { name: "y", data_type: TYPE_INT64, dims: [2] } ]'
    )
    with pytest.raises(ConfigError, match=r"dims must be positive or -1, got \[0\]"):
        validate_config(cfg, tmp_path / "m")


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("", [5]),
        ("latest { num_versions: 2 }", [5, 3]),
        ("all { }", [5, 3, 1]),
        ("specific { versions: [1, 3, 9] }", [3, 1]),
    ],
)
def test_version_policy(policy: str, expected: list[int]) -> None:
    parsed = text_format.Parse(policy, mc.ModelVersionPolicy())
    assert select_versions(parsed, [1, 3, 5]) == expected


@pytest.mark.parametrize(
    "text",
    [
        'default_model_filename: "../x.onnx"',
        'default_model_filename: "/opt/x.onnx"',
        'default_model_filename: "sub/model.onnx"',
        'default_model_filename: ".."',
        'cc_model_filenames { key: "8.7" value: "../engine.plan" }',
        'output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] label_filename: "../../l" } ]',
        'model_warmup [ { name: "w" inputs { key: "x" value: { data_type: TYPE_FP32 '
        'dims: [ 1 ] input_data_file: "../../secret" } } } ]',
    ],
)
def test_a_config_field_naming_a_file_must_be_a_plain_name(text: str) -> None:
    config = parse_config_text(text, "config.pbtxt")
    with pytest.raises(ConfigError, match="must be a plain file name"):
        check_file_names(config, "config.pbtxt")


def test_plain_file_names_pass() -> None:
    config = parse_config_text(
        'default_model_filename: "model.savedmodel" '
        'output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] label_filename: "labels.txt" } ]',
        "config.pbtxt",
    )
    check_file_names(config, "config.pbtxt")
