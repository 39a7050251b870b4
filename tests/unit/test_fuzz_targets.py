"""The long fuzz run's targets (fuzz/targets.py) as a smoke test, and its findings as
regression cases. The long run: scripts/fuzz (atheris where installed, else hypothesis)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from appliance.common.errors import ConfigError
from appliance.common.model_config import parse_config_text, read_config, validate_config
from appliance.repository.s3 import RemoteObject, group_objects
from fuzz.run import NAMES
from fuzz.targets import TARGETS

SMOKE = settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))


def test_runner_knows_every_target() -> None:
    assert set(NAMES) == set(TARGETS)


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_target_on_random_bytes(name: str) -> None:
    @SMOKE
    @given(st.binary(max_size=512))
    def run(data: bytes) -> None:
        TARGETS[name](data)

    run()


def _obj(key: str) -> RemoteObject:
    return RemoteObject(key, 1, "e", 0.0)


def test_s3_keys_with_dot_segments_are_not_model_files() -> None:
    """Finding (atheris, s3 target): 'repo/m/../../x' grouped into model 'm' as file
    '../../x', which the sync then wrote outside the model store."""
    models = group_objects(
        "repo/",
        [
            _obj("repo/m/config.pbtxt"),
            _obj("repo/m/../../../etc/evil"),
            _obj("repo/m/1/../../../evil"),
            _obj("repo/m/./labels.txt"),
            _obj("repo/m/1/model.onnx"),
        ],
    )
    assert list(models["m"].files) == ["config.pbtxt"]
    assert {v: list(files) for v, files in models["m"].versions.items()} == {1: ["model.onnx"]}


def test_config_validation_without_a_model_gives_config_errors() -> None:
    config = parse_config_text('name: "m"\nmax_batch_size: -1\n', "config.pbtxt")
    with pytest.raises(ConfigError):
        validate_config(config, Path("/models/m"))


def test_config_numbers_out_of_range_are_config_errors() -> None:
    """Finding (atheris, config target): an enum or integer field given a number past its
    range made protobuf raise ValueError, not a ConfigError naming the file."""
    for text in (
        'name: "m"\ninput [ { name: "x", data_type: 66666666666666666666666 } ]\n',
        'name: "m"\nmax_batch_size: 99999999999999999999\n',
    ):
        with pytest.raises(ConfigError, match=r"^config.pbtxt: .*out of range"):
            parse_config_text(text, "config.pbtxt")


def test_config_file_with_a_number_out_of_range_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "config.pbtxt").write_text('name: "m"\nmax_batch_size: 99999999999999999999\n')
    with pytest.raises(ConfigError, match="out of range"):
        read_config(tmp_path)


def test_a_ledger_key_of_other_digits_does_not_lose_the_record() -> None:
    """Finding (ledger target): a 'failed' key such as '²' passed isdigit() and made int()
    raise, so the whole record was read as unreadable and started afresh."""
    from appliance.repository.ledger import LedgerEntry

    entry = LedgerEntry.from_json(
        {"last_good": 2, "failed": {"²": {}, "3": {"stage": "load", "reason": "bad"}}}
    )
    assert entry.last_good == 2
    assert list(entry.failed) == [3]


@pytest.mark.parametrize("name", ["../secret.txt", "/etc/hostname", "sub/../../secret.txt"])
def test_a_label_file_outside_the_model_folder_is_refused(tmp_path: Path, name: str) -> None:
    """Labels go to clients in classification results: a label_filename may not reach out of
    the model folder (an absolute path or '..'), else a config could serve any file's lines."""
    from appliance.runtime.loader import read_labels

    (tmp_path / "secret.txt").write_text("root:x:0:0\n")
    model = tmp_path / "m"
    model.mkdir()
    config = parse_config_text(
        'name: "m"\noutput [ { name: "P", data_type: TYPE_FP32, dims: [ 2 ], '
        f'label_filename: "{name}" }} ]\n',
        "config.pbtxt",
    )
    with pytest.raises(ConfigError, match="outside the model folder"):
        read_labels(model, config)
