"""Ensembles (`platform: "ensemble"`): a graph of model steps wired by tensor names.

The plan is checked once at load time (every tensor has one producer, every step input is an
ensemble input or another step's output, every ensemble output is produced, no cycles). At run
time each step starts as soon as its inputs exist, so independent branches run concurrently;
each step is an ordinary request to its model, with that model's own validation, batching,
queue bounds, admission and statistics (as in Triton, an ensemble has no queue of its own). The
plan is built from the config by appliance/runtime/specs.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from appliance.errors import ConfigError, ServerUnavailable
from appliance.scheduling.instances import Job
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


class EnsembleScheduler:
    """The ModelScheduler of an ensemble: runs the plan, counts what is in flight, stops."""

    def __init__(self, label: str, plan: EnsemblePlan, run_step: StepRunner) -> None:
        self._label = label
        self._plan = plan
        self._run_step = run_step
        self._active = 0
        self._closing = False
        self._idle = asyncio.Event()
        self._idle.set()

    def start(self) -> None:
        pass  # no instances of its own

    @property
    def pending(self) -> int:
        return 0

    @property
    def in_flight(self) -> int:
        return self._active

    def admit(self) -> None:
        """Each step's own model admits it; refused here only when closing."""
        if self._closing:
            raise ServerUnavailable(f"{self._label} is unloading; retry")

    def arrived(self) -> None:
        pass

    async def submit(self, job: Job) -> dict[str, Array]:
        if self._closing:
            raise ServerUnavailable(f"{self._label} is unloading; retry")
        self._active += 1
        self._idle.clear()
        try:
            # A step's error is already the client's (its own model's scheduler mapped it).
            return await run_ensemble(self._plan, job.inputs, self._run_step)
        finally:
            self._active -= 1
            if not self._active:
                self._idle.set()

    async def stop(self, timeout_s: float, reason: str) -> int:
        """Wait for running ensemble requests; those left fail with their steps' models,
        which are stopped under the same deadline."""
        self._closing = True
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except asyncio.TimeoutError:
            return self._active
        return 0

    def release(self, timeout_s: float) -> list[str]:
        return []

    def health(self, now_ns: int, stuck_ns: int) -> str:
        return ""
