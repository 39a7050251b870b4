"""Ensemble wiring checks and the step runner's ordering, without models."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from appliance.common.errors import ConfigError
from appliance.runtime.specs import plan_from_config
from appliance.scheduling.ensemble import (
    EnsembleStep,
    StepRequest,
    StepTensor,
    run_ensemble,
)

HEADER = 'name: "e" platform: "ensemble" input [ { name: "IN" } ] output [ { name: "OUT" } ]\n'


def config(steps: str) -> mc.ModelConfig:
    return text_format.Parse(
        HEADER + f"ensemble_scheduling {{ step [ {steps} ] }}", mc.ModelConfig()
    )


def step(model: str, inputs: dict[str, str], outputs: dict[str, str]) -> str:
    ins = " ".join(f'input_map {{ key: "{k}" value: "{v}" }}' for k, v in inputs.items())
    outs = " ".join(f'output_map {{ key: "{k}" value: "{v}" }}' for k, v in outputs.items())
    return f'{{ model_name: "{model}" {ins} {outs} }}'


def test_a_tensor_produced_twice_is_refused() -> None:
    steps = ", ".join([step("a", {"x": "IN"}, {"y": "T"}), step("b", {"x": "IN"}, {"y": "T"})])
    with pytest.raises(ConfigError, match="tensor 'T' is produced twice"):
        plan_from_config(config(steps))


def test_a_cycle_is_refused() -> None:
    steps = ", ".join(
        [
            step("a", {"x": "IN", "z": "U"}, {"y": "T"}),
            step("b", {"x": "T"}, {"y": "U"}),
            step("c", {"x": "T"}, {"y": "OUT"}),
        ]
    )
    with pytest.raises(ConfigError, match="depend on each other"):
        plan_from_config(config(steps))


def test_an_output_nobody_produces_is_refused() -> None:
    with pytest.raises(ConfigError, match="output 'OUT' is not produced by any step"):
        plan_from_config(config(step("a", {"x": "IN"}, {"y": "T"})))


async def test_independent_steps_run_concurrently() -> None:
    plan = plan_from_config(
        config(
            ", ".join(
                [
                    step("slow", {"x": "IN"}, {"y": "A"}),
                    step("fast", {"x": "IN"}, {"y": "B"}),
                    step("join", {"a": "A", "b": "B"}, {"y": "OUT"}),
                ]
            )
        )
    )
    started: list[str] = []
    both_running = asyncio.Event()

    async def run_step(
        s: EnsembleStep, tensors: dict[str, StepTensor], request: StepRequest
    ) -> dict[str, StepTensor]:
        return {k: StepTensor(v, 1) for k, v in (await arrays(s, tensors)).items()}

    async def arrays(s: EnsembleStep, tensors: dict[str, StepTensor]) -> dict[str, np.ndarray]:
        feed = {name: tensor.data for name, tensor in tensors.items()}
        started.append(s.model_name)
        if s.model_name in ("slow", "fast") and {"slow", "fast"} <= set(started):
            both_running.set()
        if s.model_name == "slow":
            await asyncio.wait_for(both_running.wait(), 1)  # only returns if "fast" started too
        if s.model_name == "join":
            return {"y": feed["a"] + feed["b"]}
        return {"y": feed["x"] + (1 if s.model_name == "slow" else 2)}

    out = await run_ensemble(plan, {"IN": StepTensor(np.array([10]), 1)}, run_step)
    assert out["OUT"].data.tolist() == [23]
    assert started[-1] == "join"
