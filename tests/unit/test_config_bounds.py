"""Config numbers that size memory or threads are bounded (issue 17, items 8 and 13): beyond a
bound the config is refused with the field, its value and the bound, before a scheduler or an
instance is made from it."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from appliance.common.errors import ConfigError
from appliance.common.model_config import (
    DEFAULT_BOUNDS,
    ConfigBounds,
    check_bounds,
    instance_count,
    validate_config,
)
from appliance.common.settings import SchedulingSettings
from appliance.flags import serve as serve_flags

U64_MAX = 18446744073709551615
BASE = """
name: "m"
backend: "onnxruntime"
max_batch_size: 8
input [ { name: "x", data_type: TYPE_FP32, dims: [ 4 ] } ]
output [ { name: "y", data_type: TYPE_FP32, dims: [ 4 ] } ]
"""
WHERE = "m/config.pbtxt (model 'm')"


def config(extra: str) -> mc.ModelConfig:
    return text_format.Parse(BASE + extra, mc.ModelConfig())


def refusal(extra: str, bounds: ConfigBounds = DEFAULT_BOUNDS) -> str:
    with pytest.raises(ConfigError) as info:
        validate_config(config(extra), Path("m"), None, bounds)
    message = info.value.message
    assert message.startswith(f"{WHERE}: "), message
    return message[len(WHERE) + 2 :]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            "dynamic_batching { default_queue_policy { max_queue_size: 65537 } }",
            "dynamic_batching.default_queue_policy.max_queue_size is 65537, more than the "
            "65536 allowed",
        ),
        (
            "dynamic_batching { priority_levels: 2 default_priority_level: 1 "
            "priority_queue_policy { key: 2 value { max_queue_size: 100000000 } } }",
            "dynamic_batching.priority_queue_policy[2].max_queue_size is 100000000, more than "
            "the 65536 allowed",
        ),
        (
            "dynamic_batching { preferred_batch_size: [ 1000000 ] }",
            "dynamic_batching.preferred_batch_size is 1000000, more than the 65536 allowed",
        ),
        (
            "dynamic_batching { preferred_batch_size: [ " + ", ".join(["1"] * 65) + " ] }",
            "the number of dynamic_batching.preferred_batch_size entries is 65, more than the "
            "64 allowed",
        ),
        (
            "sequence_batching { oldest { max_candidate_sequences: 4097 } }",
            "sequence_batching.oldest.max_candidate_sequences is 4097, more than the 4096 allowed",
        ),
        (
            "sequence_batching { oldest { preferred_batch_size: [ 70000 ] } }",
            "sequence_batching.oldest.preferred_batch_size is 70000, more than the 65536 allowed",
        ),
        (
            'sequence_batching { state [ { input_name: "s" output_name: "t" '
            "data_type: TYPE_FP32 dims: [ 100000, 100000 ] } ] }",
            "the element count of sequence_batching state 's' dims [100000, 100000] is "
            "10000000000, more than the 33554432 allowed",
        ),
        (
            'sequence_batching { state [ { input_name: "s" output_name: "t" '
            "data_type: TYPE_FP32 dims: [ -1 ] initial_state [ { data_type: TYPE_FP32 "
            'dims: [ 65536, 65536 ] zero_data: true name: "z" } ] } ] }',
            "the element count of sequence_batching state 's' initial_state dims [65536, 65536] "
            "is 4294967296, more than the 33554432 allowed",
        ),
        (
            'model_warmup [ { name: "w" batch_size: 8 inputs { key: "x" value { '
            "data_type: TYPE_FP32 dims: [ 100000000 ] zero_data: true } } } ]",
            "the element count of model_warmup 'w' input 'x' dims (batch first) "
            "[8, 100000000] is 800000000, more than the 33554432 allowed",
        ),
        (
            'model_warmup [ { name: "w" batch_size: 9 inputs { key: "x" value { '
            "data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } } } ]",
            "model_warmup 'w' batch_size is 9, more than max_batch_size 8",
        ),
        (
            "instance_group [ { count: 2000 kind: KIND_CPU } ]",
            "instance_group asks for 2000 instances ('0' count 2000), more than the 64 per "
            "model allowed (--max-instances-per-model)",
        ),
        (
            'instance_group [ { name: "a" count: 40 kind: KIND_CPU }, '
            '{ name: "b" count: 20 kind: KIND_GPU gpus: [ 0, 1 ] } ]',
            "instance_group asks for 80 instances ('a' count 40, 'b' count 20 on 2 GPUs), more "
            "than the 64 per model allowed (--max-instances-per-model)",
        ),
    ],
)
def test_each_bound_is_refused_with_the_field_and_the_bound(extra: str, message: str) -> None:
    assert refusal(extra) == message


def test_max_batch_size_is_bounded() -> None:
    cfg = config("")
    cfg.max_batch_size = 2**31 - 1
    with pytest.raises(ConfigError, match="max_batch_size is 2147483647, more than the 65536"):
        validate_config(cfg, Path("m"))


def test_dims_longer_than_numpy_holds_are_refused() -> None:
    cfg = config("")
    cfg.input[0].dims[:] = [1] * 65
    with pytest.raises(ConfigError, match="the number of input 'x' dims is 65, more than the 64"):
        validate_config(cfg, Path("m"))


def test_values_at_the_bounds_pass() -> None:
    validate_config(
        config(
            # priority_levels has no bound (any uint64, as in Triton: queues per level in use)
            f"dynamic_batching {{ priority_levels: {U64_MAX} default_priority_level: 1 "
            "default_queue_policy { max_queue_size: 65536 } preferred_batch_size: [ 4, 8 ] }\n"
            "instance_group [ { count: 32 kind: KIND_CPU }, { count: 16 gpus: [ 0, 1 ] } ]\n"
            'model_warmup [ { name: "w" batch_size: 8 inputs { key: "x" value { '
            "data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } } } ]"
        ),
        Path("m"),
    )


def test_instance_count_counts_each_gpu_listed() -> None:
    cfg = config(
        "instance_group [ { count: 3 kind: KIND_CPU gpus: [ 0, 1 ] }, "
        "{ count: 2 kind: KIND_GPU gpus: [ 0, 1, 2 ] }, { kind: KIND_AUTO } ]"
    )
    assert instance_count(cfg) == 3 + 6 + 1


def test_the_instance_bound_comes_from_the_settings() -> None:
    bounds = ConfigBounds.from_settings(SchedulingSettings(max_instances_per_model=2))
    assert bounds.max_instances == 2
    assert ConfigBounds().max_instances == SchedulingSettings().max_instances_per_model == 64
    assert refusal("instance_group [ { count: 3 kind: KIND_CPU } ]", bounds) == (
        "instance_group asks for 3 instances ('0' count 3), more than the 2 per model allowed "
        "(--max-instances-per-model)"
    )
    check_bounds(config("instance_group [ { count: 2 kind: KIND_CPU } ]"), WHERE, bounds)


def _flags(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    serve_flags.add_serve_flags(parser)
    return parser.parse_args(["--model-repository", "/models", *argv])


def test_the_flag_sets_the_instance_bound() -> None:
    assert serve_flags.settings_from_args(_flags()).scheduling.max_instances_per_model == 64
    settings = serve_flags.settings_from_args(_flags("--max-instances-per-model=8"))
    assert settings.scheduling.max_instances_per_model == 8


@pytest.mark.parametrize("value", ["0", "-1", "many"])
def test_the_flag_refuses_what_is_not_a_positive_count(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        _flags(f"--max-instances-per-model={value}")
    assert "--max-instances-per-model" in capsys.readouterr().err
