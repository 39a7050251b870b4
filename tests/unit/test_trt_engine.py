"""TensorRT decisions from a recorded engine description: no GPU, no tensorrt needed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from google.protobuf import json_format

from appliance.common.model_config import ModelConfig
from appliance.common.protocol import model_config_pb2 as mc
from appliance.common.protojson import message_to_dict
from appliance.runtime.autocomplete import complete_config
from edge_backends.api import ModelLoadError
from edge_backends.trt_engine import (
    EngineDescription,
    EngineTensor,
    allowed_profiles,
    auto_complete,
    batching_shape,
    explain_deserialize_failure,
    select_profile,
    signature,
)

DATA = Path(__file__).parent / "data"


@pytest.fixture
def engine() -> EngineDescription:
    return EngineDescription.from_json(json.loads((DATA / "engine_two_profiles.json").read_text()))


def test_description_round_trips_through_json(engine: EngineDescription) -> None:
    assert EngineDescription.from_json(engine.to_json()) == engine
    assert [t.name for t in engine.inputs] == ["images", "scale"]
    assert [t.name for t in engine.outputs] == ["logits"]


def test_batch_limit_is_where_the_profiles_stop_covering(engine: EngineDescription) -> None:
    # The batcher may form any size up to the limit: 1-8 fit profile 0, 9-32 profile 1.
    assert batching_shape(engine).max_batch_size == 32
    gap = json.loads((DATA / "engine_two_profiles.json").read_text())
    for tensor in gap["tensors"]:
        for profile in tensor["profiles"][1:]:
            profile[0][0] = 12  # profile 1 now starts at 12: sizes 9-11 fit no profile
    assert batching_shape(EngineDescription.from_json(gap)).max_batch_size == 8
    fixed = EngineDescription(tensors=(EngineTensor("x", True, "FP32", (1, 4)),))
    shape = batching_shape(fixed)
    assert not shape.batching
    assert "'x' has a fixed first dimension" in shape.reasons[0]


def test_profile_chosen_by_batch_shape(engine: EngineDescription) -> None:
    def shapes(batch: int) -> dict[str, tuple[int, ...]]:
        return {"images": (batch, 3, 224, 224), "scale": (batch, 1)}

    assert select_profile(engine, shapes(1)) == 0
    assert select_profile(engine, shapes(8)) == 0
    assert select_profile(engine, shapes(9)) == 1
    assert select_profile(engine, shapes(32)) == 1
    # An instance group limited to profile 1 cannot run a batch of 4.
    with pytest.raises(ModelLoadError, match=r"profile 1: 'images' allows \[9, 3, 224, 224\]"):
        select_profile(engine, shapes(4), allowed=(1,))
    with pytest.raises(ModelLoadError, match="no optimization profile accepts"):
        select_profile(engine, shapes(33))
    with pytest.raises(ModelLoadError, match="'images' allows"):
        select_profile(engine, {"images": (2, 3, 200, 224), "scale": (2, 1)})
    with pytest.raises(ModelLoadError, match="input 'scale' is missing"):
        select_profile(engine, {"images": (2, 3, 224, 224)})


def test_instance_group_profiles_are_checked(engine: EngineDescription) -> None:
    assert allowed_profiles(["1", "0"], engine) == (1, 0)
    assert allowed_profiles([], engine) == ()
    with pytest.raises(ModelLoadError, match="profile '2' does not exist: the engine has 2"):
        allowed_profiles(["2"], engine)


def test_config_auto_completed_from_the_engine(engine: EngineDescription) -> None:
    config = ModelConfig(name="resnet", platform="tensorrt_plan")
    completed = auto_complete(engine, message_to_dict(config))
    config = json_format.ParseDict(completed, ModelConfig(), ignore_unknown_fields=True)
    complete_config(config, signature(engine), "resnet")
    assert config.max_batch_size == 32
    assert config.HasField("dynamic_batching")
    inputs = {i.name: (list(i.dims), mc.DataType.Name(i.data_type)) for i in config.input}
    assert inputs == {"images": ([3, 224, 224], "TYPE_FP16"), "scale": ([1], "TYPE_FP32")}
    assert [(o.name, list(o.dims)) for o in config.output] == [("logits", [1000])]


def test_config_max_batch_size_checked_against_the_engine(engine: EngineDescription) -> None:
    with pytest.raises(ModelLoadError, match="allow at most 32"):
        auto_complete(engine, {"max_batch_size": 64, "input": [], "output": []})
    fixed = EngineDescription(tensors=(EngineTensor("x", True, "FP32", (1, 4)),))
    with pytest.raises(ModelLoadError, match="cannot batch: 'x' has a fixed first dimension"):
        auto_complete(fixed, {"max_batch_size": 4})
    # A config that lists its tensors and asks for no batching is left alone.
    listed = {"max_batch_size": 0, "input": [{"name": "images"}], "output": []}
    assert auto_complete(engine, dict(listed)) == listed


@pytest.mark.parametrize(
    ("logged", "expected"),
    [
        (["The engine plan file is not compatible with this version of TensorRT, expecting "
          "library version 10.3.0.26 got 8.6.1.6, please rebuild."], "another TensorRT version"),
        (["The engine plan file is generated on an incompatible device, expecting compute 8.7 "
          "got compute 8.9, please rebuild."], "built for another GPU"),
        (["Serialization assertion magicTagRead == kMAGIC_TAG failed."],
         "another TensorRT version"),
        ([], "not a valid plan"),
    ],
)
def test_deserialize_failures_say_why(logged: list[str], expected: str) -> None:
    message = explain_deserialize_failure(logged, "10.3.0")
    assert expected in message
    assert message.startswith("TensorRT cannot deserialize the engine")
    for line in logged:
        assert line in message
