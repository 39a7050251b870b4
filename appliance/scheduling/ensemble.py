"""Ensembles (`platform: "ensemble"`): a graph of model steps wired by tensor names.

The plan is checked once at load time (every tensor has one producer, every step input is an
ensemble input or another step's output, every ensemble output is produced, no cycles). At run
time each step starts as soon as its inputs exist, so independent branches run concurrently;
each step is an ordinary request to its model, with that model's own validation, batching and
statistics.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from appliance.errors import ConfigError
from appliance.model_config import ModelConfig
from appliance.types import Array


@dataclass(frozen=True)
class EnsembleStep:
    index: int
    model_name: str
    model_version: str  # "" = the latest ready version
    inputs: dict[str, str]  # step model input -> ensemble tensor
    outputs: dict[str, str]  # step model output -> ensemble tensor


@dataclass(frozen=True)
class EnsemblePlan:
    name: str
    steps: tuple[EnsembleStep, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]

    @property
    def models(self) -> set[str]:
        return {step.model_name for step in self.steps}


# Runs one step: (model, version, inputs by model input name, wanted outputs) -> outputs.
StepRunner = Callable[[EnsembleStep, dict[str, Array]], Awaitable[dict[str, Array]]]


def plan_from_config(config: ModelConfig) -> EnsemblePlan:
    """Check the ensemble's wiring; ConfigError names the step and tensor at fault."""
    where = f"ensemble '{config.name}'"
    if not config.ensemble_scheduling.step:
        raise ConfigError(f"{where}: ensemble_scheduling has no steps")
    inputs = tuple(i.name for i in config.input)
    outputs = tuple(o.name for o in config.output)
    producers: dict[str, int] = dict.fromkeys(inputs, -1)
    steps = []
    for index, step in enumerate(config.ensemble_scheduling.step):
        if not step.model_name:
            raise ConfigError(f"{where}: step {index} has no model_name")
        version = "" if step.model_version <= 0 else str(step.model_version)
        for model_output, tensor in step.output_map.items():
            if tensor in producers:
                raise ConfigError(
                    f"{where}: tensor '{tensor}' is produced twice (step {index} output "
                    f"'{model_output}')"
                )
            producers[tensor] = index
        steps.append(
            EnsembleStep(
                index, step.model_name, version, dict(step.input_map), dict(step.output_map)
            )
        )
    for step in steps:
        for model_input, tensor in step.inputs.items():
            if tensor not in producers:
                raise ConfigError(
                    f"{where}: step {step.index} ('{step.model_name}') input '{model_input}' "
                    f"reads tensor '{tensor}', which no ensemble input or step produces"
                )
    for name in outputs:
        if name not in producers:
            raise ConfigError(f"{where}: output '{name}' is not produced by any step")
    _check_acyclic(where, steps, producers)
    return EnsemblePlan(config.name, tuple(steps), inputs, outputs)


def _check_acyclic(where: str, steps: list[EnsembleStep], producers: dict[str, int]) -> None:
    done: set[int] = set()
    while len(done) < len(steps):
        ready = [
            s.index
            for s in steps
            if s.index not in done
            and all(producers[t] == -1 or producers[t] in done for t in s.inputs.values())
        ]
        if not ready:
            stuck = [s.index for s in steps if s.index not in done]
            raise ConfigError(f"{where}: steps {stuck} depend on each other (a cycle)")
        done.update(ready)


async def run_ensemble(
    plan: EnsemblePlan, inputs: dict[str, Array], run_step: StepRunner
) -> dict[str, Array]:
    """Run every step as soon as its inputs exist; return the ensemble's outputs."""
    tensors = dict(inputs)
    pending = list(plan.steps)
    running: dict[asyncio.Task[dict[str, Array]], EnsembleStep] = {}
    try:
        while pending or running:
            for step in [s for s in pending if all(t in tensors for t in s.inputs.values())]:
                pending.remove(step)
                feed = {model_input: tensors[t] for model_input, t in step.inputs.items()}
                running[asyncio.ensure_future(run_step(step, feed))] = step
            if not running:
                missing = sorted({t for s in pending for t in s.inputs.values()} - set(tensors))
                raise ConfigError(f"ensemble '{plan.name}': tensors {missing} were never made")
            done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                step = running.pop(task)
                produced = task.result()  # a failed step fails the ensemble request
                for model_output, tensor in step.outputs.items():
                    tensors[tensor] = produced[model_output]
    finally:
        for task in running:
            task.cancel()
    return {name: tensors[name] for name in plan.outputs}
