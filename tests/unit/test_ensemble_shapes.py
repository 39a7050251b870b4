"""Ensemble rules as Triton's ensemble scheduler applies them: batch dimensions between steps
that batch differently, pruning, absent tensors, parameters and the error prefix."""

from __future__ import annotations

import numpy as np
import pytest

from appliance.common.errors import InvalidInput, QueueFull
from appliance.scheduling.ensemble import (
    EnsemblePlan,
    EnsembleStep,
    StepRequest,
    StepTensor,
    needed_steps,
    prefixed,
    reshape_dims,
    run_ensemble,
    step_arrays,
)


@pytest.mark.parametrize(
    ("config", "batching", "tensor_batch", "dims", "expected"),
    [
        ((4,), True, 0, (4,), (1, 4)),  # a non-batching step's output into a batching model
        ((-1, -1), True, 0, (16,), (16,)),  # dims that do not match: as they are
        ((4,), False, 1, (1, 4), (4,)),  # a batch of 1 into a non-batching model: stripped
        ((4,), False, 2, (2, 4), (2, 4)),  # a batch of 2 cannot be stripped
        ((1, 4), False, 1, (1, 4), (1, 4)),  # matches the config as it is: kept
        ((4,), True, 3, (3, 4), (3, 4)),  # both batch: unchanged
        ((4,), False, 0, (4,), (4,)),  # neither batches: unchanged
    ],
)
def test_reshape_dims_as_triton(
    config: tuple[int, ...],
    batching: bool,
    tensor_batch: int,
    dims: tuple[int, ...],
    expected: tuple[int, ...],
) -> None:
    assert reshape_dims(config, batching, tensor_batch, dims) == expected


def test_step_arrays_gives_the_step_request_its_batch_size() -> None:
    tensors = {"X": StepTensor(np.zeros(4, np.float32), 0)}
    arrays, batch = step_arrays(tensors, {"X": (4,)}, batching=True)
    assert arrays["X"].shape == (1, 4)
    assert batch == 1
    arrays, batch = step_arrays(tensors, {"X": (4,)}, batching=False)
    assert arrays["X"].shape == (4,)
    assert batch == 0


def _plan() -> EnsemblePlan:
    """IN -> a -> A -> c -> OUT_C; IN -> b -> B (ensemble output OUT_B); a also makes OUT_A."""
    return EnsemblePlan(
        "e",
        (
            EnsembleStep(0, "a", "", {"x": "IN"}, {"y": "A", "z": "OUT_A"}),
            EnsembleStep(1, "b", "", {"x": "IN"}, {"y": "OUT_B"}),
            EnsembleStep(2, "c", "", {"x": "A"}, {"y": "OUT_C"}),
        ),
        ("IN",),
        ("OUT_A", "OUT_B", "OUT_C"),
    )


def test_steps_no_requested_output_needs_are_pruned() -> None:
    plan = _plan()
    assert [s.model_name for s in needed_steps(plan, ("OUT_A", "OUT_B", "OUT_C"))] == [
        "a",
        "b",
        "c",
    ]
    assert [s.model_name for s in needed_steps(plan, ("OUT_B",))] == ["b"]
    assert [s.model_name for s in needed_steps(plan, ("OUT_C",))] == ["a", "c"]
    assert [s.model_name for s in needed_steps(plan, ("OUT_A",))] == ["a"]


async def test_every_step_carries_the_request_and_absent_tensors_stay_absent() -> None:
    plan = EnsemblePlan(
        "e",
        (
            EnsembleStep(0, "a", "", {"x": "IN", "opt": "OPT"}, {"y": "A", "never": "GONE"}),
            EnsembleStep(1, "b", "", {"x": "A", "maybe": "GONE"}, {"y": "OUT"}),
        ),
        ("IN", "OPT"),
        ("OUT", "GONE"),
    )
    seen: list[tuple[str, list[str], StepRequest]] = []

    async def run_step(
        step: EnsembleStep, inputs: dict[str, StepTensor], request: StepRequest
    ) -> dict[str, StepTensor]:
        seen.append((step.model_name, sorted(inputs), request))
        return {"y": StepTensor(inputs["x"].data + 1, inputs["x"].batch_size)}  # no "never"

    request = StepRequest({"sequence_id": 7, "priority": 1, "custom": "x"}, "req-1")
    out = await run_ensemble(
        plan, {"IN": StepTensor(np.array([1]), 0)}, run_step, request, ("OUT", "GONE")
    )
    assert out["OUT"].data.tolist() == [3]
    assert "GONE" not in out
    assert seen == [("a", ["x"], request), ("b", ["x"], request)]


def test_a_steps_error_keeps_its_code_with_triton_s_prefix() -> None:
    error = QueueFull("model 'm' is busy")
    shown = prefixed("ens", error)
    assert isinstance(shown, QueueFull)
    assert shown.message == "in ensemble 'ens', model 'm' is busy"
    assert error.message == "model 'm' is busy"  # shared by a batch: not changed
    assert isinstance(prefixed("ens", InvalidInput("x")), InvalidInput)
