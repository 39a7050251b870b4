"""Ragged batching's batch inputs and gathered tensors, with model_config.proto's examples, and
the config checks of `batch_input` and ragged inputs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from appliance.common.errors import ConfigError
from appliance.common.model_config import validate_config
from appliance.runtime.specs import batch_shaping
from appliance.scheduling.ragged import (
    BatchInputSpec,
    BatchShaping,
    ScatterSpec,
    batch_input,
    gather,
    scatter,
)
from edge_backends.api import ModelSignature, TensorSpec

F32, I32 = np.dtype(np.float32), np.dtype(np.int32)
# L0_batch_input's requests: batch 1 each, 2, 4, 1 and 3 elements.
SHAPES = [(1, 2), (1, 4), (1, 1), (1, 3)]


def spec(kind: str, dtype: np.dtype = F32) -> BatchInputSpec:  # type: ignore[type-arg]
    return BatchInputSpec(kind, ("T",), dtype, "INPUT")


def test_element_counts_as_l0_batch_input_expects_them() -> None:
    assert batch_input(spec("BATCH_ELEMENT_COUNT"), SHAPES).tolist() == [2, 4, 1, 3]
    accumulated = batch_input(spec("BATCH_ACCUMULATED_ELEMENT_COUNT", I32), SHAPES)
    assert accumulated.tolist() == [2, 6, 7, 10]
    assert accumulated.dtype == I32
    with_zero = batch_input(spec("BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO"), SHAPES)
    assert with_zero.tolist() == [0, 2, 6, 7, 10]
    assert batch_input(spec("BATCH_MAX_ELEMENT_COUNT_AS_SHAPE"), SHAPES).shape == (4,)


def test_item_shapes_as_model_config_proto_describes_them() -> None:
    # "one batch-2 input with shape [3, 1] and batch-1 input with shape [2, 2]"
    shapes = [(2, 3, 1), (1, 2, 2)]
    items = batch_input(spec("BATCH_ITEM_SHAPE"), shapes)
    assert items.tolist() == [[3, 1], [3, 1], [2, 2]]
    flat = batch_input(spec("BATCH_ITEM_SHAPE_FLATTEN"), shapes)
    assert flat.tolist() == [3, 1, 3, 1, 2, 2]


def test_gather_concatenates_ragged_inputs_flat_and_adds_the_batch_inputs() -> None:
    shaping = BatchShaping(
        frozenset({"INPUT"}), (BatchInputSpec("BATCH_ELEMENT_COUNT", ("N",), F32, "INPUT"),)
    )
    requests = [
        {"INPUT": np.full((1, n), n, np.float32), "X": np.full((1, 2), n, np.float32)}
        for n in (2, 3)
    ]
    batch = gather(requests, shaping)
    assert batch["INPUT"].tolist() == [2, 2, 3, 3, 3]  # 1-D: every request's elements
    assert batch["X"].shape == (2, 2)  # a plain input: along the batch dimension
    assert batch["N"].tolist() == [2, 3]
    assert "N" not in gather(requests, shaping, batch_inputs=False)  # a Python model's batch


def test_a_batch_output_is_cut_by_its_source_inputs_shapes() -> None:
    spec = ScatterSpec("OUT", "INPUT", (-1, -1))
    requests = [{"INPUT": np.zeros((1, 2))}, {"INPUT": np.zeros((2, 3))}]
    parts = scatter(spec, np.arange(8, dtype=np.float32), requests)
    assert [p.tolist() for p in parts] == [[[0, 1]], [[2, 3, 4], [5, 6, 7]]]
    with pytest.raises(ValueError, match="batch output 'OUT' has 7 elements"):
        scatter(spec, np.arange(7, dtype=np.float32), requests)


CONFIG = """
name: "m" max_batch_size: 4
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
batch_input [ { kind: BATCH_ACCUMULATED_ELEMENT_COUNT target_name: "INDEX"
                data_type: TYPE_FP32 source_input: "INPUT" } ]
"""


BATCH_OUTPUT = """batch_output [ {{ kind: BATCH_SCATTER_WITH_INPUT_SHAPE
                 target_name: ["{target}"] source_input: "INPUT" }} ]
"""


def config(text: str = CONFIG) -> mc.ModelConfig:
    return text_format.Parse(text, mc.ModelConfig())


def signature(input_shape: tuple[int, ...] = (-1,)) -> ModelSignature:
    return ModelSignature(
        inputs=(TensorSpec("INPUT", "FP32", input_shape), TensorSpec("INDEX", "FP32", (-1,))),
        outputs=(TensorSpec("OUT", "FP32", (-1, -1)),),
    )


def test_a_ragged_model_with_batch_inputs_is_accepted_and_read() -> None:
    validate_config(config(), Path("m"), signature())
    scattering = config(BATCH_OUTPUT.format(target="OUT") + CONFIG)
    flat_output = ModelSignature(
        inputs=signature().inputs, outputs=(TensorSpec("OUT", "FP32", (-1,)),)
    )
    validate_config(scattering, Path("m"), flat_output)  # a batch output's shape: the batch's
    with pytest.raises(ConfigError, match="dims"):
        validate_config(config(), Path("m"), flat_output)  # a plain output's is compared
    assert batch_shaping(scattering).scatter == (ScatterSpec("OUT", "INPUT", (-1, -1)),)
    shaping = batch_shaping(config())
    assert shaping.ragged == {"INPUT"}
    assert shaping.batch_inputs == (
        BatchInputSpec("BATCH_ACCUMULATED_ELEMENT_COUNT", ("INDEX",), F32, "INPUT"),
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("TYPE_FP32 source", "TYPE_INT64 source"), "batch input data type must be TYPE_INT32 or"),
        (('source_input: "INPUT"', 'source_input: "NOPE"'), "unknown source input name 'NOPE'"),
        (
            ('source_input: "INPUT"', 'source_input: ["INPUT", "INPUT"]'),
            "batch input kind 'BATCH_ACCUMULATED_ELEMENT_COUNT' expects 1 source input, got 2",
        ),
        (
            ("batch_input [", BATCH_OUTPUT.format(target="NOPE") + "batch_input ["),
            "unknown target output name 'NOPE'",
        ),
        (
            ("batch_input [", BATCH_OUTPUT.format(target='OUT", "OUT') + "batch_input ["),
            "target output name 'OUT' can only be specified once",
        ),
        (
            ("allow_ragged_batch: true", "allow_ragged_batch: true optional: true"),
            "for ragged input 'INPUT', which is not supported for optional input",
        ),
    ],
)
def test_batch_inputs_and_ragged_inputs_tritons_checks(
    change: tuple[str, str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        validate_config(config(CONFIG.replace(*change)), Path("m"), signature())


def test_a_ragged_input_must_be_one_dimensional_in_the_model() -> None:
    with pytest.raises(ConfigError, match=r"ragged input 'INPUT', model provides \[-1, -1\]"):
        validate_config(config(), Path("m"), signature((-1, -1)))
    missing = ModelSignature(
        inputs=(TensorSpec("INPUT", "FP32", (-1,)),), outputs=signature().outputs
    )
    with pytest.raises(ConfigError, match="batch input target 'INDEX' is not a model input"):
        validate_config(config(), Path("m"), missing)
