"""A decoupled step in an ensemble, as Triton's ensemble scheduler runs it: the steps after it
run once per response (each tensor's values by iteration), the ensemble answers whenever every
requested output has a value for one iteration, and a step fed by two decoupled origins is
refused at load."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from appliance.common.errors import ConfigError, InvalidInput
from appliance.common.model_config import ModelConfig
from appliance.runtime.specs import with_decoupled_steps
from appliance.scheduling.ensemble import (
    EnsemblePlan,
    EnsembleStep,
    StepEmit,
    StepRequest,
    StepTensor,
    decoupled_labels,
    run_ensemble,
)

# IN -> fan (decoupled: IN[0] responses, the i-th IN * (i + 1)) -> MID
#    MID -> double -> OUT_D;  MID -> slow (takes longer for earlier responses) -> OUT_S
FAN = EnsembleStep(0, "fan", "", {"x": "IN"}, {"y": "MID"})
DOUBLE = EnsembleStep(1, "double", "", {"x": "MID"}, {"y": "OUT_D"})
SLOW = EnsembleStep(2, "slow", "", {"x": "MID"}, {"y": "OUT_S"})


def _plan(
    *steps: EnsembleStep, outputs: tuple[str, ...], decoupled: frozenset[int]
) -> EnsemblePlan:
    return EnsemblePlan("e", steps, ("IN",), outputs, decoupled_steps=decoupled)


async def _run_step(
    step: EnsembleStep,
    inputs: dict[str, StepTensor],
    request: StepRequest,
    each: StepEmit | None = None,
) -> dict[str, StepTensor]:
    x = inputs["x"].data
    if step.model_name == "fan":
        assert each is not None
        for i in range(int(x[0])):
            await asyncio.sleep(0)
            await each({"y": StepTensor(x * (i + 1), 0)})
        return {}
    assert each is None
    if step.model_name == "slow":
        await asyncio.sleep(0.02 / float(x[0]))  # the first response's run finishes last
        return {"y": StepTensor(x + 0.5, 0)}
    return {"y": StepTensor(x * 2, 0)}


async def test_the_steps_after_a_decoupled_step_run_once_per_response() -> None:
    plan = _plan(FAN, DOUBLE, outputs=("OUT_D",), decoupled=frozenset({0}))
    responses: list[list[float]] = []
    out = await run_ensemble(
        plan,
        {"IN": StepTensor(np.array([3.0, 1.0]), 0)},
        _run_step,
        emit=lambda made: responses.append(made["OUT_D"].data.tolist()),
    )
    assert out == {}
    assert responses == [[6.0, 2.0], [12.0, 4.0], [18.0, 6.0]]


async def test_no_response_from_the_decoupled_step_answers_nothing() -> None:
    plan = _plan(FAN, DOUBLE, outputs=("OUT_D",), decoupled=frozenset({0}))
    responses: list[object] = []
    await run_ensemble(
        plan, {"IN": StepTensor(np.array([0.0]), 0)}, _run_step, emit=responses.append
    )
    assert responses == []


async def test_a_response_waits_for_every_requested_output_of_its_iteration() -> None:
    """Two steps make the two outputs; each response has both, paired by iteration (the
    order each tensor's values were made in)."""
    plan = _plan(FAN, DOUBLE, SLOW, outputs=("OUT_D", "OUT_S"), decoupled=frozenset({0}))
    responses: list[tuple[float, float]] = []
    await run_ensemble(
        plan,
        {"IN": StepTensor(np.array([2.0]), 0)},
        _run_step,
        emit=lambda made: responses.append(
            (float(made["OUT_D"].data[0]), float(made["OUT_S"].data[0]))
        ),
    )
    assert len(responses) == 2
    # 'slow' finishes its run for the second response (4.5) first; each value still goes
    # with the response it was made from (Triton pairs them in the order the runs end:
    # (4.0, 4.5), (8.0, 2.5)), and the responses keep their order.
    assert responses == [(4.0, 2.5), (8.0, 4.5)]


async def test_each_response_goes_out_as_soon_as_its_steps_are_done() -> None:
    """The step after a decoupled step answers each response while the decoupled step is
    still running (not when it ends), in order even when a later run finishes first; a
    failed run fails the request at once and cancels the decoupled step."""
    events: list[str] = []
    release = asyncio.Event()

    async def run_step(
        step: EnsembleStep,
        inputs: dict[str, StepTensor],
        request: StepRequest,
        each: StepEmit | None = None,
    ) -> dict[str, StepTensor]:
        x = inputs["x"].data
        if each is not None:
            for i in range(3):
                await each({"y": StepTensor(x + i, 0)})
                events.append(f"sent {i}")
                await asyncio.sleep(0.01)
            await release.wait()  # ends only once the test saw the responses
            events.append("fan done")
            return {}
        if float(x[0]) < 0:
            raise InvalidInput("negative")
        await asyncio.sleep(0.005 if float(x[0]) == 0 else 0)  # the first run ends last
        return {"y": StepTensor(x * 2, 0)}

    plan = _plan(FAN, DOUBLE, outputs=("OUT_D",), decoupled=frozenset({0}))
    got: list[float] = []

    def emit(made: dict[str, StepTensor]) -> None:
        got.append(float(made["OUT_D"].data[0]))
        events.append(f"answered {len(got) - 1}")
        if len(got) == 3:
            release.set()

    await asyncio.wait_for(
        run_ensemble(plan, {"IN": StepTensor(np.array([0.0]), 0)}, run_step, emit=emit), 5
    )
    assert got == [0.0, 2.0, 4.0]
    assert events.index("answered 0") < events.index("sent 2")
    assert events[-1] == "fan done"

    release.clear()
    got.clear()
    with pytest.raises(InvalidInput, match="negative"):
        await asyncio.wait_for(
            run_ensemble(plan, {"IN": StepTensor(np.array([-5.0]), 0)}, run_step, emit=emit), 5
        )
    assert events[-1] != "fan done"  # cancelled, not waited for


async def test_without_a_decoupled_step_one_response_is_returned() -> None:
    step = EnsembleStep(0, "double", "", {"x": "IN"}, {"y": "OUT_D"})
    plan = _plan(step, outputs=("OUT_D",), decoupled=frozenset())
    out = await run_ensemble(plan, {"IN": StepTensor(np.array([1.5]), 0)}, _run_step)
    assert out["OUT_D"].data.tolist() == [3.0]


def test_decoupled_labels_refuse_inputs_from_two_origins() -> None:
    mixed = EnsembleStep(1, "add", "", {"a": "IN", "b": "MID"}, {"y": "OUT"})
    plan = _plan(FAN, mixed, outputs=("OUT",), decoupled=frozenset({0}))
    assert decoupled_labels(plan, {0}) == (
        "in ensemble e, step of model 'add' receives inputs originated from different "
        "decoupled models"
    )
    assert decoupled_labels(plan, set()) == ""  # no decoupled step: nothing to pair
    # Two outputs of one decoupled step, or a chain of decoupled steps, are fine.
    pair = EnsembleStep(0, "fan2", "", {"x": "IN"}, {"y": "M1", "z": "M2"})
    joined = EnsembleStep(1, "add", "", {"a": "M1", "b": "M2"}, {"y": "OUT"})
    assert (
        decoupled_labels(_plan(pair, joined, outputs=("OUT",), decoupled=frozenset({0})), {0}) == ""
    )
    again = EnsembleStep(1, "fan", "", {"x": "MID"}, {"y": "OUT"})
    assert (
        decoupled_labels(_plan(FAN, again, outputs=("OUT",), decoupled=frozenset({0, 1})), {0, 1})
        == ""
    )


def test_with_decoupled_steps_marks_the_ensemble_decoupled() -> None:
    plan = _plan(FAN, DOUBLE, outputs=("OUT_D",), decoupled=frozenset())
    config = ModelConfig(name="e")
    marked = with_decoupled_steps(plan, config, lambda step: step.model_name == "fan")
    assert marked.decoupled_steps == {0}
    assert marked.decoupled
    assert config.model_transaction_policy.decoupled
    mixed = EnsembleStep(1, "add", "", {"a": "IN", "b": "MID"}, {"y": "OUT"})
    with pytest.raises(ConfigError, match="receives inputs originated from different"):
        with_decoupled_steps(
            _plan(FAN, mixed, outputs=("OUT",), decoupled=frozenset()),
            ModelConfig(name="e"),
            lambda step: step.model_name == "fan",
        )
