"""Ensembles (`platform: "ensemble"`): a graph of model steps wired by tensor names.

The plan is checked once at load time (every tensor has one producer, every step input is an
ensemble input or another step's output, every ensemble output is produced, no cycles). At run
time each step starts as soon as its inputs exist, so independent branches run concurrently;
each step is an ordinary request to its model, with that model's own validation, batching,
queue bounds, admission and statistics (as in Triton, an ensemble has no queue of its own). The
plan is built from the config by appliance/runtime/specs.py.

As Triton's ensemble scheduler does (core `ensemble_scheduler.cc`):
- every step's request carries the ensemble request's id and parameters (sequence id and
  flags, priority, timeout, custom parameters);
- each tensor remembers the batch size of the request that made it (0: not batched), and a
  step that batches differently gets it with a batch dimension of 1 added or stripped
  (`reshape_dims`), so steps with and without `max_batch_size` mix;
- an ensemble input the request leaves out (optional), or an output a step did not produce, is
  absent: the steps that read it run without it, and the response leaves it out;
- steps none of whose outputs the request needs (directly or through later steps) do not run;
- a step's error reaches the client with its code, its text prefixed `in ensemble '<name>', `.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from appliance.errors import ApplianceError, InvalidInput, ServerUnavailable
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
    batching: bool = False  # the ensemble's own max_batch_size > 0
    output_dims: dict[str, tuple[int, ...]] = field(default_factory=dict)  # config dims

    @property
    def models(self) -> set[str]:
        return {step.model_name for step in self.steps}

    def producer(self, tensor: str) -> tuple[EnsembleStep, str] | None:
        """The step that makes an ensemble tensor, and the step model's output name."""
        for step in self.steps:
            for model_output, name in step.outputs.items():
                if name == tensor:
                    return step, model_output
        return None


@dataclass(frozen=True, slots=True)
class StepTensor:
    """An ensemble tensor: its data and the batch size of the request that made it (0: that
    request's model does not batch)."""

    data: Array
    batch_size: int


@dataclass(frozen=True, slots=True)
class StepRequest:
    """What every step's request carries from the ensemble's request."""

    parameters: Mapping[str, Any]
    request_id: str = ""


# Runs one step: (step, its inputs by model input name, the ensemble request's id and
# parameters) -> its outputs by model output name. A step whose model did not produce an output
# leaves it out.
StepRunner = Callable[
    [EnsembleStep, dict[str, StepTensor], StepRequest], Awaitable[dict[str, StepTensor]]
]


def _dims_match(config: tuple[int, ...], dims: tuple[int, ...]) -> bool:
    return len(config) == len(dims) and all(c in (-1, d) for c, d in zip(config, dims, strict=True))


def reshape_dims(
    config_dims: tuple[int, ...], batching: bool, tensor_batch: int, dims: tuple[int, ...]
) -> tuple[int, ...]:
    """Triton's ReshapeTensorDims: the shape a tensor made by a request of batch size
    `tensor_batch` (0: not batched) takes as the input (or ensemble output) whose config dims
    are `config_dims`, for a model that batches or not. Only a batching model fed by a
    non-batching one (a batch dimension of 1 added when the dims match the config without
    one) and the reverse (a batch of 1 stripped when the dims do not match the config as they
    are) change anything."""
    if batching == (tensor_batch != 0):
        return dims
    if batching:
        return (1, *dims) if _dims_match(config_dims, dims) else dims
    if tensor_batch == 1 and not _dims_match(config_dims, dims):
        return dims[1:]
    return dims


def step_arrays(
    inputs: Mapping[str, StepTensor], input_dims: Mapping[str, tuple[int, ...]], batching: bool
) -> tuple[dict[str, Array], int]:
    """A step's inputs shaped for its model (`input_dims`: its config's input dims) and the
    batch size of the step's request (0 when the model does not batch)."""
    arrays: dict[str, Array] = {}
    for name, tensor in inputs.items():
        dims = input_dims.get(name)
        shape = tuple(tensor.data.shape)
        if dims is not None:
            wanted = reshape_dims(dims, batching, tensor.batch_size, shape)
            arrays[name] = tensor.data.reshape(wanted) if wanted != shape else tensor.data
        else:  # not one of the model's inputs: its validation says so
            arrays[name] = tensor.data
    batch = 0
    if batching:
        first = next((a for a in arrays.values() if a.ndim), None)
        batch = int(first.shape[0]) if first is not None else 1
    return arrays, batch


def needed_steps(plan: EnsemblePlan, requested: Collection[str]) -> list[EnsembleStep]:
    """The steps to run for the requested outputs (Triton's pruning): a step is left out when
    every tensor it makes is an ensemble output the request does not ask for, or is read only
    by steps that are left out."""
    ignored = {name for name in plan.outputs if name not in requested}
    producer = {t: s for s in plan.steps for t in s.outputs.values()}
    readers: dict[str, set[int]] = {}
    for s in plan.steps:
        for t in s.inputs.values():
            readers.setdefault(t, set()).add(s.index)
    left = {s.index: len(s.outputs) for s in plan.steps}
    pruned: set[int] = set()
    while ignored:
        newly: set[str] = set()
        for tensor in ignored:
            step = producer.get(tensor)
            if step is None:
                continue
            left[step.index] -= 1
            if left[step.index] == 0:
                pruned.add(step.index)
                for t in step.inputs.values():
                    readers[t].discard(step.index)
                    if not readers[t]:
                        newly.add(t)
        ignored = newly
    return [s for s in plan.steps if s.index not in pruned]


async def run_ensemble(
    plan: EnsemblePlan,
    inputs: Mapping[str, StepTensor],
    run_step: StepRunner,
    request: StepRequest | None = None,
    requested: Collection[str] | None = None,
) -> dict[str, StepTensor]:
    """Run every needed step as soon as its inputs exist; return the ensemble's outputs
    (those that were produced) as their steps made them."""
    request = request or StepRequest({})
    # None: absent (an optional ensemble input not given, an output a step did not produce).
    tensors: dict[str, StepTensor | None] = dict.fromkeys(plan.inputs)
    tensors.update(inputs)
    pending = needed_steps(plan, plan.outputs if requested is None else requested)
    running: dict[asyncio.Task[dict[str, StepTensor]], EnsembleStep] = {}
    try:
        while pending or running:
            for step in [s for s in pending if all(t in tensors for t in s.inputs.values())]:
                pending.remove(step)
                feed = {}
                for model_input, name in step.inputs.items():
                    tensor = tensors[name]
                    if tensor is not None:
                        feed[model_input] = tensor
                running[asyncio.ensure_future(run_step(step, feed, request))] = step
            if not running:  # the plan's checks make this unreachable
                missing = sorted({t for s in pending for t in s.inputs.values()} - set(tensors))
                raise InvalidInput(
                    f"unexpected deadlock, at least one output is not set while no more "
                    f"ensemble steps can be made (tensors {missing})"
                )
            done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                step = running.pop(task)
                produced = task.result()  # a failed step fails the ensemble request
                for model_output, name in step.outputs.items():
                    tensors[name] = produced.get(model_output)
    finally:
        for task in running:
            task.cancel()
    outputs = {}
    for name in plan.outputs:
        tensor = tensors.get(name)
        if tensor is not None:
            outputs[name] = tensor
    return outputs


def prefixed(name: str, exc: ApplianceError) -> ApplianceError:
    """The client's error for a failed ensemble request, as tritonserver words it: the step's
    error (its class, so its code) with `in ensemble '<name>', ` before its text. A copy: one
    step error may fail several requests of a batch."""
    error = copy.copy(exc)
    error.args = (f"in ensemble '{name}', {exc.message}", *exc.args[1:])
    return error


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
        self.admit()
        self._active += 1
        self._idle.clear()
        plan = self._plan
        batch = job.batch_size if plan.batching else 0
        inputs = {name: StepTensor(array, batch) for name, array in job.inputs.items()}
        try:
            made = await run_ensemble(
                plan,
                inputs,
                self._run_step,
                StepRequest(job.parameters or {}, job.request_id),
                job.output_names,
            )
        except ApplianceError as exc:
            raise prefixed(plan.name, exc) from exc
        finally:
            self._active -= 1
            if not self._active:
                self._idle.set()
        outputs = {}
        for name, tensor in made.items():
            dims = plan.output_dims.get(name)
            shape = made_shape = tuple(tensor.data.shape)
            if dims is not None:
                shape = reshape_dims(dims, plan.batching, tensor.batch_size, shape)
            outputs[name] = tensor.data.reshape(shape) if shape != made_shape else tensor.data
        return outputs

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
