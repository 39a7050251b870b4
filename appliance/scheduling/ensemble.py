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
- a step's error reaches the client with its code, its text prefixed `in ensemble '<name>', `;
- a decoupled step (any number of responses per request) runs the steps after it once per
  response: each ensemble tensor keeps its values by iteration (a decoupled step's responses
  in the order it sent them; a later step's outputs at the iteration of the inputs it ran
  on), a step runs for iteration i once all its inputs have one, and the ensemble answers
  iteration i as soon as every requested output has it and i - 1 was answered: responses
  stream while the decoupled step still runs, in order. (Triton pairs a step's outputs with
  iterations in the order its runs end; here they stay with the response they came from.)
  An ensemble with a decoupled step is itself decoupled (its responses stream, then a final
  flag); the load refuses a step whose inputs come from different decoupled steps
  (`decoupled_labels`);
- a successful request counts one execution of batch size max(1, batch) in the ensemble's
  statistics (Triton's DecrementCounter); the steps' compute times are their models' own;
- `ensemble_scheduling { max_inflight_requests: N }` (0: no limit) bounds each step's requests
  in flight, across every request of the ensemble (Triton 2.5x's per-step limiter): a step
  takes one of its N slots before its request goes to its model and gives it back when the
  request ends. A decoupled step's next response is taken only once the steps it feeds have
  their slots, so a producer faster than its consumer is held back (its responses wait in its
  stream's bounded room, then the model blocks in send): memory stays bounded instead of one
  queued consumer request per response.
"""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from appliance.common.errors import ApplianceError, InvalidInput, ServerUnavailable
from appliance.common.types import Array
from appliance.scheduling.instances import Job
from appliance.scheduling.stats import ModelStats


@dataclass(frozen=True)
class EnsembleStep:
    index: int
    model_name: str
    model_version: str  # "" = the latest ready version
    inputs: dict[str, str]  # step model input -> ensemble tensor
    outputs: dict[str, str]  # step model output -> ensemble tensor
    # --model-namespacing: the ensemble's repository, whose copy of a name that more than one
    # repository holds the step calls ("": the model of that name).
    namespace: str = ""


@dataclass(frozen=True)
class EnsemblePlan:
    name: str
    steps: tuple[EnsembleStep, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    batching: bool = False  # the ensemble's own max_batch_size > 0
    output_dims: dict[str, tuple[int, ...]] = field(default_factory=dict)  # config dims
    decoupled_steps: frozenset[int] = frozenset()  # steps whose model is decoupled
    max_inflight_requests: int = 0  # per step, across requests; 0: no limit

    @property
    def decoupled(self) -> bool:
        """Whether the ensemble streams its responses (a decoupled step in it)."""
        return bool(self.decoupled_steps)

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
    # The compute durations (input, infer, output ns) of its steps' requests that succeeded,
    # summed as the steps finish: the ensemble's own, as tritonserver counts them.
    compute_ns: list[int] = field(default_factory=lambda: [0, 0, 0])


# A decoupled step's responses, each as a step's outputs by model output name; the step takes
# its next response once the awaitable is done (the steps it feeds have their slots).
StepEmit = Callable[[dict[str, StepTensor]], Awaitable[None]]


class StepRunner(Protocol):
    """Runs one step: (step, its inputs by model input name, the ensemble request's id and
    parameters) -> its outputs by model output name; a step whose model did not produce an
    output leaves it out. For a decoupled step `each` is given: it gets every response's
    outputs in order, on the event loop (awaited before the next is taken), and the step
    returns {} after the last one."""

    def __call__(
        self,
        step: EnsembleStep,
        inputs: dict[str, StepTensor],
        request: StepRequest,
        each: StepEmit | None = None,
    ) -> Awaitable[dict[str, StepTensor]]: ...


def decoupled_labels(plan: EnsemblePlan, decoupled: Collection[int]) -> str:
    """Triton's check of an ensemble with decoupled steps ('' when it passes): every tensor
    is labelled with the decoupled step it comes from (ensemble inputs 0); a step's inputs
    must all carry one label, or the step would have to pair responses that do not belong
    together."""
    label = dict.fromkeys(plan.inputs, 0)
    made = 0
    pending = list(plan.steps)
    while pending:
        ready = [s for s in pending if all(t in label for t in s.inputs.values())]
        if not ready:  # the plan's checks make this unreachable
            return ""
        for step in ready:
            pending.remove(step)
            labels = {label[t] for t in step.inputs.values()}
            if len(labels) > 1:
                return (
                    f"in ensemble {plan.name}, step of model '{step.model_name}' receives "
                    "inputs originated from different decoupled models"
                )
            own = labels.pop() if labels else 0
            if step.index in decoupled:
                made += 1
                own = made
            for tensor in step.outputs.values():
                label[tensor] = own
    return ""


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


class _Run:
    """One ensemble request in progress: each tensor's values by iteration, the steps launched
    for each iteration, and the responses assembled (see the module's docstring)."""

    def __init__(
        self,
        plan: EnsemblePlan,
        run_step: StepRunner,
        request: StepRequest,
        requested: Collection[str],
        respond: Callable[[dict[str, StepTensor]], None],
        slots: tuple[asyncio.Semaphore, ...] = (),
    ) -> None:
        self.plan = plan
        self.slots = slots  # each step's, shared by the ensemble's requests; () no limit
        self.run_step = run_step
        self.request = request
        self.requested = [name for name in plan.outputs if name in requested]
        self.respond = respond
        self.steps = needed_steps(plan, requested)
        # None: absent (an optional ensemble input not given, an output a step did not make).
        # A value is dropped once every step reading it was launched for its iteration and,
        # for a requested output, its response went out (`_release`): a long stream of a
        # decoupled step's responses holds only those still in use.
        self.tensors: dict[str, dict[int, StepTensor | None]] = {}
        self.made: dict[str, int] = {}  # values of each tensor made in order so far
        self.readers: dict[str, list[EnsembleStep]] = {}
        for step in self.steps:
            for name in step.inputs.values():
                self.readers.setdefault(name, []).append(step)
        # (step index, iteration), until every input of that run is dropped.
        self.launched: set[tuple[int, int]] = set()
        # Each running step and the iteration it runs for; the step tasks a decoupled step's
        # responses launch join while `run` waits, and `finished` wakes it for each that ends.
        self.running: dict[asyncio.Task[dict[str, StepTensor]], tuple[EnsembleStep, int]] = {}
        self.finished = asyncio.Event()
        self.responses = 0  # answered so far: the next response is that iteration's

    def add(
        self, values: Mapping[str, StepTensor | None], iteration: int | None = None
    ) -> list[asyncio.Future[None]]:
        """New values of ensemble tensors, each at `iteration` (a non-decoupled step's run for
        that iteration) or else at its tensor's next one (the ensemble's inputs, a decoupled
        step's responses in order): launch the steps they make ready and answer, in order,
        for the iterations every requested output has. Returns, for each step launched that
        waits for a slot (max_inflight_requests), a future done once it has it."""
        updated: list[tuple[str, int]] = []
        for name, value in values.items():
            if iteration is None:
                at = self.made.get(name, 0)
                self.made[name] = at + 1
            else:
                at = iteration
            updated.append((name, at))
            self.tensors.setdefault(name, {})[at] = value
        waiting: list[asyncio.Future[None]] = []
        for name, at in updated:
            for step in self.readers.get(name, ()):
                self._launch_if_ready(step, at, waiting)
        # Steps of different iterations may finish in any order; the responses keep theirs.
        while self.requested and all(
            self.responses in self.tensors.get(o, {}) for o in self.requested
        ):
            self._answer(self.responses)
        for name, at in updated:
            self._release(name, at)
        return waiting

    def _release(self, name: str, at: int) -> None:
        """Drop tensor `name`'s value at iteration `at` once nothing needs it any more."""
        if name in self.requested and at >= self.responses:
            return
        readers = self.readers.get(name, ())
        if any((step.index, at) not in self.launched for step in readers):
            return
        values = self.tensors.get(name)
        if values is None or values.pop(at, self) is self:
            return
        for step in readers:  # a run whose inputs are all dropped is never launched again
            if all(at not in self.tensors.get(t, {}) for t in step.inputs.values()):
                self.launched.discard((step.index, at))

    def _launch_if_ready(
        self, step: EnsembleStep, iteration: int, waiting: list[asyncio.Future[None]]
    ) -> None:
        key = (step.index, iteration)
        if key in self.launched:
            return
        feed: dict[str, StepTensor] = {}
        for model_input, name in step.inputs.items():
            made = self.tensors.get(name, {})
            if iteration not in made:
                return
            value = made[iteration]
            if value is not None:
                feed[model_input] = value
        self.launched.add(key)
        for name in step.inputs.values():
            self._release(name, iteration)
        has_slot = None
        if self.slots:
            has_slot = asyncio.get_running_loop().create_future()
            waiting.append(has_slot)
        task = asyncio.ensure_future(self._step(step, feed, has_slot))
        task.add_done_callback(lambda _: self.finished.set())
        self.running[task] = (step, iteration)

    async def _step(
        self,
        step: EnsembleStep,
        feed: dict[str, StepTensor],
        has_slot: asyncio.Future[None] | None,
    ) -> dict[str, StepTensor]:
        """One step's request, within its slot when the ensemble limits them."""
        if has_slot is None:
            return await self._request(step, feed)
        slot = self.slots[step.index]
        try:
            await slot.acquire()
        finally:
            has_slot.set_result(None)  # taken, or cancelled: nobody waits on it any more
        try:
            return await self._request(step, feed)
        finally:
            slot.release()

    def _request(
        self, step: EnsembleStep, feed: dict[str, StepTensor]
    ) -> Awaitable[dict[str, StepTensor]]:
        if step.index not in self.plan.decoupled_steps:
            return self.run_step(step, feed, self.request)

        async def each(produced: dict[str, StepTensor]) -> None:
            waiting = self.add({name: produced.get(out) for out, name in step.outputs.items()})
            if waiting:  # the steps this response launched, until they have their slot
                await asyncio.gather(*waiting)

        return self.run_step(step, feed, self.request, each)

    def _answer(self, iteration: int) -> None:
        outputs = {}
        for name in self.requested:
            value = self.tensors[name][iteration]
            if value is not None:
                outputs[name] = value
        self.responses += 1
        self.respond(outputs)
        for name in self.requested:
            self._release(name, iteration)

    async def run(self, inputs: Mapping[str, StepTensor]) -> None:
        given: dict[str, StepTensor | None] = dict.fromkeys(self.plan.inputs)
        given.update(inputs)
        try:
            self.add(given)
            while self.running:
                # Every step task, those launched while waiting included, sets `finished`
                # when it ends: each step's outputs go on (and out) as soon as it is done.
                self.finished.clear()
                done = [t for t in self.running if t.done()]
                if not done:
                    await self.finished.wait()
                    continue
                for task in done:  # in launch order
                    step, iteration = self.running.pop(task)
                    produced = task.result()  # a failed step fails the ensemble request
                    if step.index not in self.plan.decoupled_steps:
                        values = {name: produced.get(out) for out, name in step.outputs.items()}
                        self.add(values, iteration)
        finally:
            for task in self.running:
                task.cancel()


async def run_ensemble(
    plan: EnsemblePlan,
    inputs: Mapping[str, StepTensor],
    run_step: StepRunner,
    request: StepRequest | None = None,
    requested: Collection[str] | None = None,
    emit: Callable[[dict[str, StepTensor]], None] | None = None,
    slots: tuple[asyncio.Semaphore, ...] = (),
) -> dict[str, StepTensor]:
    """Run every needed step as soon as its inputs exist; return the ensemble's outputs
    (those that were produced) as their steps made them. A decoupled ensemble's responses go
    to `emit` as they are made (any number, none included) and {} is returned. `slots`:
    each step's semaphore (max_inflight_requests), shared by the ensemble's requests."""
    responses: list[dict[str, StepTensor]] = []
    wanted = requested or plan.outputs  # none named: all, as Triton asks for all
    run = _Run(plan, run_step, request or StepRequest({}), wanted, emit or responses.append, slots)
    await run.run(inputs)
    if emit is not None:
        return {}
    if not responses:  # only a decoupled step can leave an ensemble without a response
        raise InvalidInput(
            "unexpected deadlock, at least one output is not set while no more ensemble "
            "steps can be made"
        )
    return responses[0]


def prefixed(name: str, exc: ApplianceError) -> ApplianceError:
    """The client's error for a failed ensemble request, as tritonserver words it: the step's
    error (its class, so its code) with `in ensemble '<name>', ` before its text. A copy: one
    step error may fail several requests of a batch."""
    error = copy.copy(exc)
    error.args = (f"in ensemble '{name}', {exc.message}", *exc.args[1:])
    error.model_response = False  # the ensemble's request failed, whatever its step answered
    return error


class EnsembleScheduler:
    """The ModelScheduler of an ensemble: runs the plan, counts what is in flight, stops."""

    def __init__(
        self, label: str, plan: EnsemblePlan, run_step: StepRunner, stats: ModelStats | None = None
    ) -> None:
        self._label = label
        self._plan = plan
        self._run_step = run_step
        self._stats = stats  # the ensemble's own: each run is counted there (see submit)
        limit = plan.max_inflight_requests
        self._slots = tuple(asyncio.Semaphore(limit) for _ in plan.steps) if limit > 0 else ()
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

    @property
    def open_sequences(self) -> int:
        return 0

    def admit(self) -> None:
        """Each step's own model admits it; refused here only when closing."""
        if self._closing:
            raise ServerUnavailable(f"{self._label} is unloading; retry")

    def arrived(self) -> None:
        pass

    def run_here(self, job: Job, inline: bool = False) -> dict[str, Array] | BaseException | None:
        """No thread lane: an ensemble's steps run on the loop."""
        return None

    async def submit(self, job: Job) -> dict[str, Array]:
        queued = time.monotonic_ns()
        self.admit()
        self._active += 1
        self._idle.clear()
        plan = self._plan
        batch = job.batch_size if plan.batching else 0
        inputs = {name: StepTensor(array, batch) for name, array in job.inputs.items()}
        emit = job.emit
        step_request = StepRequest(job.parameters or {}, job.request_id)
        start = time.monotonic_ns()
        try:
            made = await run_ensemble(
                plan,
                inputs,
                self._run_step,
                step_request,
                job.output_names,
                None if emit is None else lambda made: emit(self._shaped(made)),
                self._slots,
            )
        except ApplianceError as exc:
            if self._stats is not None:
                self._stats.record_ensemble_run_failure(time.monotonic_ns() - start)
            raise prefixed(plan.name, exc) from exc
        finally:
            self._active -= 1
            if not self._active:
                self._idle.set()
        if self._stats is not None:
            # One execution per successful request, as Triton's ensemble scheduler counts
            # it: its compute durations are its steps' summed, its queue time the wait
            # before its first step was started (tritonserver's: from its enqueue to its run).
            size = max(1, job.batch_size)
            input_ns, infer_ns, output_ns = step_request.compute_ns
            self._stats.record_execution(
                size, size, input_ns, infer_ns, output_ns, (start - queued,)
            )
            self._stats.last_inference_ms = time.time_ns() // 1_000_000
        return self._shaped(made)

    def _shaped(self, made: dict[str, StepTensor]) -> dict[str, Array]:
        """A response's outputs in the ensemble's own dims (a batch dimension of 1 added or
        stripped where the ensemble batches differently from the step that made them)."""
        plan = self._plan
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
