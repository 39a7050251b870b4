"""The data plane both front ends call: resolve the model, validate tensors, submit, respond."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping
from types import TracebackType
from typing import Any, NamedTuple, cast

import numpy as np

from appliance.common.errors import (
    ApplianceError,
    DecoupledOnUnary,
    ErrorCode,
    IncompleteBytes,
    InferenceFailed,
    InvalidInput,
    QueueFull,
    ServerUnavailable,
)
from appliance.common.limits import NO_LIMITS, RequestLimits
from appliance.common.types import Array, InferRequest, InferResponse, RequestedOutput, Tensor
from appliance.ops.trace import TracedTensor, Tracer
from appliance.runtime.models import ModelRuntime
from appliance.runtime.registry import Mirror, ServedVersion
from appliance.scheduling.batcher import QueueTimeout
from appliance.scheduling.contract import ModelScheduler
from appliance.scheduling.ensemble import (
    EnsembleStep,
    StepEmit,
    StepRequest,
    StepTensor,
    step_arrays,
)
from appliance.scheduling.instances import Job
from appliance.scheduling.outcome import client_error
from appliance.scheduling.stats import ModelStats
from appliance.services.cache import ResponseCache, cache_key
from appliance.services.host import BlockingHost, ModelControl
from appliance.services.plain import PlainLane
from appliance.services.validation import validate
from edge_backends.api import InferenceHost
from edge_backends.datatypes import from_numpy

# The signatures a served version's plain lane learns at most (services/plain.py): a caller
# with a few request shapes has each in the lane; the rest take the general path.
PLAIN_SIGNATURES = 4


class Admission:
    """A request its front end admitted before reading its body (`InferenceService.admit`).

    Until it is released (its job submitted, or the request failed first), its model's
    scheduler counts it as arriving, so that the requests admitted while their bodies are still
    being read cannot together overrun the queue-wait bound. `arrival_ns` is the monotonic time
    the front end first saw the request: the bound covers the whole wait from there. Use it as
    a context manager around reading, decoding and `infer`; releasing twice is harmless.
    """

    __slots__ = ("_scheduler", "_stats", "arrival_ns")

    def __init__(
        self, scheduler: ModelScheduler | None, arrival_ns: int, stats: ModelStats | None = None
    ) -> None:
        self._scheduler = scheduler
        self._stats = stats
        self.arrival_ns = arrival_ns

    def release(self) -> None:
        scheduler, self._scheduler = self._scheduler, None
        if scheduler is not None:
            scheduler.arrived()

    def __enter__(self) -> Admission:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.release()
        stats, self._stats = self._stats, None
        if stats is not None and isinstance(exc, IncompleteBytes):  # as tritonserver counts it
            stats.record_failure("BACKEND", time.monotonic_ns() - self.arrival_ns)


class Prepared(NamedTuple):
    """A validated request not run yet (`InferenceService.infer_here`): its version, the
    request, its job and the monotonic ns its handling started. No version and no job: its
    model is to load on demand first (--model-load-on-demand), then the request is checked."""

    served: ServedVersion | None
    request: InferRequest
    job: Job | None
    start: int


class InferenceService:
    """Validates requests against the model config once, for every protocol."""

    def __init__(
        self,
        runtime: ModelRuntime,
        cache: ResponseCache | None = None,
        tracer: Tracer | None = None,
        limits: RequestLimits | None = None,
        max_waiting_responses: int = 0,
    ) -> None:
        self.runtime = runtime
        self.cache = cache
        # A decoupled request's responses not yet taken by its reader, at most (0: the
        # default, DECOUPLED_MAX_RESPONSES; --grpc-max-response-pool-size).
        self.max_waiting_responses = max_waiting_responses or DECOUPLED_MAX_RESPONSES
        self.tracer = tracer or Tracer()
        # Front ends pass these to their decoders too, to refuse before allocating.
        self.limits = limits or RequestLimits()
        self.accepting = True
        # The tracer's sampling counts, as front ends' threads and the loop both sample.
        self._trace_lock = threading.Lock()
        self._mirrors: set[asyncio.Future[None]] = set()  # requests mirrored to a shadow
        runtime.run_step = self.run_step  # ensembles' steps are ordinary requests
        self._on_demand = runtime.residency.on_demand  # read on every request

    def admit(self, model: str, version: str = "", unary: bool = True) -> Admission:
        """Admission before the request is read: raises QueueFull (or ServerUnavailable while
        shutting down) at once, so that a refusal costs no body read, decode or validation.

        Front ends call it as soon as they know the model (HTTP: from the URL, before reading
        the body; gRPC: before decoding) and pass the admission to `infer`. An unknown model,
        version or one not ready is refused here too (`lookup`), before any error of the
        request's own inputs, as tritonserver looks the model up before it reads them; so is a
        decoupled model on a `unary` call (HTTP infer, gRPC ModelInfer), as tritonserver checks
        the model's transaction policy first.
        """
        arrival_ns = time.monotonic_ns()
        if not self.accepting:
            raise ServerUnavailable("server is shutting down; not accepting new requests")
        served = self.lookup(model, version)
        if served is None:
            return Admission(None, arrival_ns)
        if unary and served.decoupled:
            raise _decoupled_on_unary(served)
        served.scheduler.admit()
        return Admission(served.scheduler, arrival_ns, served.stats)

    def lookup(self, model: str, version: str = "") -> ServedVersion | None:
        """The version a request for `model` will run on, looked up before its inputs are
        decoded: raises the lookup's error (unknown model, unknown version, none ready, an
        ambiguous name), as tritonserver creates its request from the model before it parses
        the inputs (HTTP and gRPC alike). None where --model-load-on-demand may load the model
        for this request (runtime/on_demand.py): it is looked up again once loaded."""
        try:
            return self.runtime.get(model, version)
        except ApplianceError:
            if self._on_demand and self.runtime.residency.loads_on_request(model):
                return None
            raise

    async def infer(
        self, request: InferRequest, admission: Admission | None = None
    ) -> InferResponse:
        """A client's request: checked against the input limits. `admission`: the one the
        front end took before reading the request (see `admit`)."""
        return await self._infer(request, self.limits, admission)

    async def _infer(
        self,
        request: InferRequest,
        limits: RequestLimits,
        admission: Admission | None = None,
        compute_ns: list[int] | None = None,
    ) -> InferResponse:
        if self._on_demand and not self.runtime.is_ready(request.model_name, request.model_version):
            await self._loaded(request.model_name, request.parameters)
        return await self.infer_prepared(self._prepare(request, limits, admission), compute_ns)

    async def _loaded(self, model: str, parameters: Mapping[str, Any] | None) -> None:
        """--model-load-on-demand: a model not loaded is loaded (and waited for, at most the
        request's own timeout) before its request goes on; runtime/on_demand.py."""
        timeout_us = (parameters or {}).get("timeout")
        wait_s = timeout_us / 1e6 if isinstance(timeout_us, int) and timeout_us > 0 else None
        await self.runtime.residency.ensure(model, wait_s)

    def _prepare(
        self,
        request: InferRequest,
        limits: RequestLimits,
        admission: Admission | None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> Prepared:
        """A request's checks and validated job, its admission released; a failure counted."""
        if not self.accepting:
            raise ServerUnavailable("server is shutting down; not accepting new requests")
        served = self.runtime.get(request.model_name, request.model_version)
        served.last_used_ns = start = time.monotonic_ns()
        if served.decoupled:
            raise _decoupled_on_unary(served)
        # A request its checks refuse is not counted as a failure: tritonserver refuses it
        # before its scheduler, and its statistics and nv_inference_request_failure never see it
        job = validate(served, request, limits, loop)
        if admission is not None:  # its job is about to be queued: no longer arriving
            job.arrival_ns = admission.arrival_ns
            admission.release()
        return Prepared(served, request, job, start)

    def _answered(
        self,
        served: ServedVersion,
        request: InferRequest,
        job: Job,
        start: int,
        response: InferResponse,
    ) -> InferResponse:
        """A request's success: counted, and traced when sampled."""
        served.last_used_ns = end = time.monotonic_ns()  # idle from its answer on
        served.stats.record_success(end - start)
        if self.tracer.active:  # one attribute when nothing is traced: the common case
            with self._trace_lock:
                trace_id = self.tracer.sample(served.name)
            if trace_id:
                self._trace(trace_id, served, request, job, start, end, response)
        return response

    def infer_here(
        self,
        request: InferRequest,
        admission: Admission | None,
        loop: asyncio.AbstractEventLoop,
        active: Callable[[], bool],
        inline: bool = False,
        learn: bool = False,
        limits: RequestLimits | None = None,
    ) -> InferResponse | Prepared:
        """`infer` on a front end's own thread (not `loop`'s): the response when the model's
        scheduler ran the request here at once (its thread lane, `DynamicScheduler.run_here`: an
        idle instance, nothing queued), else the validated request to finish on the loop
        with `infer_prepared`. The same checks, statistics, failure reasons and traces as
        `infer`; `active()` false after the run (the client went) counts it CANCELED and
        raises CancelledError. Not taken for the response cache, probation, sequences,
        ensembles and decoupled models. `inline`: called on the loop's own thread, where only
        a model cheap enough to run inline is run (`DynamicScheduler.run_here`). `learn`: a
        plain request that passed its checks becomes a signature of its version's plain lane
        (`infer_plain`), up to PLAIN_SIGNATURES of them. `limits`: the server's own
        (NO_LIMITS for its own requests) instead of a client's.
        """
        if self._on_demand and not self.runtime.is_ready(request.model_name, request.model_version):
            if admission is not None:
                admission.release()
            return Prepared(None, request, None, time.monotonic_ns())  # loads first, on the loop
        prepared = self._prepare(request, limits or self.limits, admission, loop)
        served, _, job, start = prepared
        if served is None or job is None:
            return prepared
        if learn and len(served.plain) < PLAIN_SIGNATURES and PlainLane.learnable(served, request):
            served.plain = (*served.plain, PlainLane(served, request, job))  # validated
        if not self._lane_open(served):
            return prepared
        if not inline:  # a front end's thread-safe check; a long execution's cancel check asks it
            job.active = active
        outputs = self._run_lane(served, job, start, active, inline)
        if outputs is None:
            return prepared
        try:
            response = self._response(served, request, outputs)
        except ApplianceError as exc:
            _count_failure(served, exc, start)
            raise
        return self._answered(served, request, job, start, response)

    def infer_plain(
        self,
        served: ServedVersion,
        model: str,
        version: str,
        inputs: Mapping[str, Array],
        request_id: str,
        loop: asyncio.AbstractEventLoop,
        active: Callable[[], bool],
    ) -> InferResponse | Prepared | None:
        """`infer_here` for inputs (name -> numpy array, no parameters, every output) that
        match a signature of `served`'s plain lane (services/plain.py): known valid, so not
        validated again; the same run, statistics and response. None when they do not match
        or the lane is closed to them (tracing, on-demand loading, what `_lane_open` says, a
        stop): the caller takes the general path (`infer_here`), which checks them."""
        if not self.accepting or self._on_demand or self.tracer.active:
            return None
        lane: PlainLane
        for lane in served.plain:
            if lane.matches(inputs):
                break
        else:
            return None
        if not self._lane_open(served):
            return None
        served.last_used_ns = start = time.monotonic_ns()
        job = lane.job(inputs, request_id, loop)
        job.active = active
        outputs = self._run_lane(served, job, start, active, False)
        if outputs is None:  # an instance was not free here: queued on the loop
            return Prepared(served, lane.request(inputs, model, version, request_id), job, start)
        response = lane.response(served.name, request_id, outputs)
        # `_answered` with nothing traced (the lane is closed while the tracer is active)
        served.last_used_ns = end = time.monotonic_ns()
        served.stats.record_success(end - start)
        return response

    def _lane_open(self, served: ServedVersion) -> bool:
        """Whether a request of `served` may run in the thread lane: not for the response
        cache, probation's watcher, or a shadow's mirror (those run on the loop)."""
        return not (
            (served.cache_enabled and self.cache is not None)
            or served.stats.watcher
            or served.mirror is not None  # mirrored on the loop (infer_prepared)
        )

    def _run_lane(
        self,
        served: ServedVersion,
        job: Job,
        start: int,
        active: Callable[[], bool],
        inline: bool,
    ) -> dict[str, Array] | None:
        """The job run in its scheduler's thread lane: its outputs, or None when not taken;
        a failure counted and raised."""
        try:
            outcome = served.scheduler.run_here(job, inline)
            if outcome is None:
                return None
            if isinstance(outcome, BaseException):
                raise outcome
            if not active():
                raise asyncio.CancelledError()
        except (ApplianceError, asyncio.CancelledError) as exc:
            _count_failure(served, exc, start)
            raise
        return outcome

    async def infer_prepared(
        self, prepared: Prepared, compute_ns: list[int] | None = None
    ) -> InferResponse:
        """The rest of `infer` for a request `_prepare` (or `infer_here`) validated: on the
        loop, queued for an instance (or answered from the response cache). `compute_ns`:
        see `infer_arrays`."""
        served, request, job, start = prepared
        if served is None or job is None:  # its model loads on demand first
            return await self._infer(request, self.limits, compute_ns=compute_ns)
        try:
            if served.cache_enabled and self.cache is not None and not served.sequence:
                outputs = await self._cached(served, job, start)
            else:
                outputs = await served.scheduler.submit(job)
            response = self._response(served, request, outputs)
        except (ApplianceError, asyncio.CancelledError) as exc:
            _count_failure(served, exc, start)
            raise
        if served.mirror is not None:
            self._mirror(served.mirror, job, outputs, start)
        if compute_ns is not None and job.compute_ns:
            c0, c1, c2, c3 = job.compute_ns
            compute_ns[0] += c1 - c0
            compute_ns[1] += c2 - c1
            compute_ns[2] += c3 - c2
        return self._answered(served, request, job, start, response)

    def _mirror(self, trial: Mirror, job: Job, outputs: dict[str, Array], start: int) -> None:
        """A served request's copy for the version on shadow probation beside it, when the
        trial takes this one (its share); the client's answer is not held up by it."""
        if not trial.take():
            return
        served_ns = time.monotonic_ns() - start
        # Copied: the inputs are views over the request's received bytes, which the front end
        # may reuse once it answered.
        inputs = {name: np.array(array, copy=True) for name, array in job.inputs.items()}
        task = asyncio.ensure_future(self._run_mirror(trial, job, inputs, outputs, served_ns))
        self._mirrors.add(task)
        task.add_done_callback(self._mirrors.discard)

    async def _run_mirror(
        self,
        trial: Mirror,
        job: Job,
        inputs: dict[str, Array],
        outputs: dict[str, Array],
        served_ns: int,
    ) -> None:
        mirrored = Job(
            inputs=inputs,
            batch_size=job.batch_size,
            shape_key=job.shape_key,
            output_names=job.output_names,
            future=asyncio.get_running_loop().create_future(),
            nbytes=job.nbytes,
            arrival_ns=time.monotonic_ns(),
        )
        begin = time.monotonic_ns()
        try:
            result = await trial.shadow.scheduler.submit(mirrored)
        except ApplianceError as exc:
            if exc.code is ErrorCode.UNAVAILABLE:  # refused for load, not the version's fault
                trial.skip()
                return
            trial.observe(served_ns, outputs, time.monotonic_ns() - begin, None, exc.message)
            return
        trial.observe(served_ns, outputs, time.monotonic_ns() - begin, result)

    def is_decoupled(self, model: str, version: str = "") -> bool:
        try:
            return self.runtime.get(model, version).decoupled
        except ApplianceError:
            return False  # the request itself will report the error

    async def infer_stream(self, request: InferRequest) -> AsyncIterator[InferResponse]:
        """Responses as they come: any number for decoupled models, else exactly one."""
        if not self.accepting:
            raise ServerUnavailable("server is shutting down; not accepting new requests")
        if self._on_demand and not self.runtime.is_ready(request.model_name, request.model_version):
            await self._loaded(request.model_name, request.parameters)
        served = self.runtime.get(request.model_name, request.model_version)
        served.last_used_ns = time.monotonic_ns()
        if not served.decoupled:
            yield await self.infer(request)
            return
        start = time.monotonic_ns()
        loop = asyncio.get_running_loop()
        # Each response with its size; _EXECUTED once the execution ended (after every
        # response the model sent before its final flag: they are posted first).
        responses: asyncio.Queue[tuple[dict[str, Array], int] | object] = asyncio.Queue()
        room = _ResponseRoom(threading.get_ident(), self.max_waiting_responses)
        job = validate(served, request, self.limits)

        def emit(outputs: dict[str, Array]) -> None:  # called from the instance's thread
            size = room.wait_for_room(outputs)
            if size >= 0:
                loop.call_soon_threadsafe(responses.put_nowait, (outputs, size))

        job.emit = emit
        execution = asyncio.ensure_future(_decoupled(served, job))
        execution.add_done_callback(lambda _: responses.put_nowait(_EXECUTED))
        room.on_stall = functools.partial(_cancel_soon, loop, execution)
        try:
            # One queue read a response, not a task and an asyncio.wait each: a stream of
            # many small responses spent more on those than on the responses.
            while (item := await responses.get()) is not _EXECUTED:
                outputs, size = cast(tuple[dict[str, Array], int], item)
                room.taken(size)
                yield self._response(served, request, outputs)
            if room.stalled:  # the model was cancelled, after what it had made was yielded
                raise ResponsesNotRead(
                    f"model '{served.name}' version {served.version}: the stream's client read "
                    f"none of this request's responses for {DECOUPLED_READER_WAIT_S:g} s while "
                    f"the model waited to send more ({room.stalled} waiting); the request is "
                    "cancelled"
                )
            while not responses.empty():  # posted before the execution finished
                item = responses.get_nowait()
                if item is _EXECUTED:
                    continue
                outputs, size = cast(tuple[dict[str, Array], int], item)
                room.taken(size)
                yield self._response(served, request, outputs)
            await execution  # raises the model's error, if any
        except ApplianceError as exc:
            _count_failure(served, exc, start)
            raise
        finally:
            room.close()  # a model held back in emit goes on (its responses are dropped)
            execution.cancel()
        served.stats.record_success(time.monotonic_ns() - start)

    def _trace(
        self,
        trace_id: int,
        served: ServedVersion,
        request: InferRequest,
        job: Job,
        start: int,
        end: int,
        response: InferResponse,
    ) -> None:
        c0, c1, c2, c3 = job.compute_ns or (0, 0, 0, 0)
        tensors: list[TracedTensor] = []
        if self.tracer.tensors(served.name):  # level TENSORS: the request's tensors too
            tensors = [
                ("TENSOR_QUEUE_INPUT", t.name, t.datatype, t.shape, t.data) for t in request.inputs
            ] + [
                ("TENSOR_BACKEND_OUTPUT", t.name, t.datatype, t.shape, t.data)
                for t in response.outputs
            ]
        self.tracer.record(
            trace_id,
            served.name,
            str(served.version),
            request.id,
            [
                ("REQUEST_START", start),
                ("QUEUE_START", job.enqueue_ns),
                ("COMPUTE_START", c0),
                ("COMPUTE_INPUT_END", c1),
                ("COMPUTE_OUTPUT_START", c2),
                ("COMPUTE_END", c3),
                ("REQUEST_END", end),
            ],
            tensors,
        )

    async def run_step(
        self,
        step: EnsembleStep,
        inputs: dict[str, StepTensor],
        request: StepRequest,
        each: StepEmit | None = None,
    ) -> dict[str, StepTensor]:
        """One ensemble step: an ordinary request to the step's model, with the ensemble
        request's id and parameters, its inputs given or stripped a batch dimension of 1 where
        the step batches differently from the model that made them (ensemble.step_arrays).
        A decoupled step's responses go to `each`."""
        if self._on_demand and not self.runtime.is_ready(step.model_name, step.model_version):
            await self._loaded(step.model_name, request.parameters)  # a step loads on demand
        model = self.runtime.step_model(step) if step.namespace else step.model_name
        served = self.runtime.get(model, step.model_version)
        dims = {name: rule.dims for name, rule in served.inputs.items()}
        arrays, batch = step_arrays(inputs, dims, served.max_batch_size > 0)
        call = (model, step.model_version, arrays, list(step.outputs))
        parameters, request_id = dict(request.parameters), request.request_id
        if each is not None:
            async for made in self.stream_arrays(*call, parameters, request_id):
                await each({name: StepTensor(array, batch) for name, array in made.items()})
            return {}
        outputs = await self.infer_arrays(*call, parameters, request_id, request.compute_ns)
        return {name: StepTensor(array, batch) for name, array in outputs.items()}

    async def infer_arrays(
        self,
        model: str,
        version: str,
        inputs: dict[str, Array],
        outputs: list[str],
        parameters: dict[str, Any] | None = None,
        request_id: str = "",
        compute_ns: list[int] | None = None,
    ) -> dict[str, Array]:
        """A request made inside the server (ensemble steps, BLS): arrays in, arrays out;
        `parameters` as a client's request carries them (sequence_id, priority, ...). An
        ensemble step's `compute_ns` (input, infer, output) gets its compute durations added."""
        if self._on_demand and not self.runtime.is_ready(model, version):
            await self._loaded(model, parameters)
        request = self._arrays_request(model, version, inputs, outputs, parameters, request_id)
        # The server's own tensors (ensemble steps, BLS): not a client's, so not limited.
        response = await self._infer(request, NO_LIMITS, compute_ns=compute_ns)
        return response.arrays()

    def infer_arrays_here(
        self,
        loop: asyncio.AbstractEventLoop,
        model: str,
        version: str,
        inputs: dict[str, Array],
        outputs: list[str],
        parameters: dict[str, Any] | None = None,
        request_id: str = "",
    ) -> dict[str, Array] | Prepared | None:
        """`infer_arrays` on a backend's own thread (not `loop`'s: a BLS call): the outputs
        when the model's thread lane ran it here at once (`infer_here`: an idle instance,
        nothing queued; no hop to the loop and back), else the validated request to finish
        on the loop with `infer_prepared`; None: a model still to load on demand
        (`infer_arrays` loads it)."""
        if self._on_demand and not self.runtime.is_ready(model, version):
            return None
        request = self._arrays_request(model, version, inputs, outputs, parameters, request_id)
        outcome = self.infer_here(request, None, loop, _still_there, limits=NO_LIMITS)
        if isinstance(outcome, Prepared):
            return outcome
        return outcome.arrays()

    async def stream_arrays(
        self,
        model: str,
        version: str,
        inputs: dict[str, Array],
        outputs: list[str],
        parameters: dict[str, Any] | None = None,
        request_id: str = "",
    ) -> AsyncIterator[dict[str, Array]]:
        """`infer_arrays` for a decoupled model (BLS): each response's outputs as it comes."""
        if self._on_demand and not self.runtime.is_ready(model, version):
            await self._loaded(model, parameters)
        request = self._arrays_request(model, version, inputs, outputs, parameters, request_id)
        async for response in self.infer_stream(request):
            yield response.arrays()

    def _arrays_request(
        self,
        model: str,
        version: str,
        inputs: dict[str, Array],
        outputs: list[str],
        parameters: dict[str, Any] | None,
        request_id: str,
    ) -> InferRequest:
        served = self.runtime.get(model, version)
        tensors = []
        for name, array in inputs.items():
            rule = served.inputs.get(name)
            datatype = rule.datatype if rule is not None else from_numpy(array.dtype).triton
            tensors.append(Tensor(name, datatype, tuple(array.shape), array))
        return InferRequest(
            model_name=model,
            model_version=version,
            id=request_id,
            inputs=tensors,
            outputs=[RequestedOutput(name) for name in outputs] if outputs else None,
            parameters=dict(parameters or {}),
        )

    def blocking_host(
        self, loop: asyncio.AbstractEventLoop, control: ModelControl | None = None
    ) -> InferenceHost:
        """This service for backend threads (Python models' BLS calls, and with `control` their
        model loading API); never on the loop."""
        return BlockingHost(self, loop, control)

    async def _cached(self, served: ServedVersion, job: Job, start: int) -> dict[str, Array]:
        """Answer from the response cache, or run and remember the answer."""
        assert self.cache is not None
        key = cache_key(served.name, served.version, job.inputs.items())
        outputs = self.cache.get(key)
        if outputs is not None:
            served.stats.cache_hit.add(time.monotonic_ns() - start)
            return outputs
        job.output_names = served.all_outputs  # cache whole responses: any subset is then a hit
        lookup_ns = time.monotonic_ns() - start
        outputs = await served.scheduler.submit(job)
        insert_start = time.monotonic_ns()
        self.cache.put(key, outputs)
        served.stats.cache_miss.add(lookup_ns + time.monotonic_ns() - insert_start)
        return outputs

    # ---- response ----------------------------------------------------------------------------

    def _labels(self, served: ServedVersion, output: str) -> list[str] | None:
        """An output's class labels: its own label_filename's, or for an ensemble output
        without one, those of the step output that makes it (as Triton completes an ensemble's
        labels from its composing models)."""
        labels = served.labels.get(output)
        plan = served.ensemble
        if labels is not None or plan is None:
            return labels
        made_by = plan.producer(output)
        if made_by is None:
            return None
        step, step_output = made_by
        try:
            composing = self.runtime.get(step.model_name, step.model_version)
        except ApplianceError:
            return None
        return self._labels(composing, step_output)

    def _response(
        self, served: ServedVersion, request: InferRequest, outputs: dict[str, Array]
    ) -> InferResponse:
        batching = served.max_batch_size > 0
        wanted = request.outputs
        if wanted is None:
            requested: list[tuple[str, int]] = [(name, 0) for name in served.outputs]
        else:
            requested = [(o.name, o.class_count) for o in wanted]
        tensors = []
        for out_name, k in requested:
            rule = served.outputs[out_name]
            array = outputs.get(out_name)
            if array is None:  # not produced (an optional output): left out, as Triton does
                continue
            if rule.model_dims is not None and rule.dims.count(-1) <= 1:  # to the config's dims
                lead = (array.shape[0],) if batching else ()
                array = array.reshape(lead + rule.dims)
            if k:
                array = classify(array, k, self._labels(served, out_name), batching)
                tensors.append(Tensor(out_name, "BYTES", array.shape, array))
            else:
                tensors.append(Tensor(out_name, rule.datatype, array.shape, array))
        response = InferResponse(
            model_name=served.name,
            model_version=str(served.version),
            id=request.id,
            outputs=tensors,
        )
        if served.ensemble is not None:
            # tritonserver's ensemble responses carry the request's sequence parameters
            params = request.parameters
            response.parameters = {
                "sequence_id": params.get("sequence_id", 0),
                "sequence_start": bool(params.get("sequence_start", False)),
                "sequence_end": bool(params.get("sequence_end", False)),
            }
        return response


# A decoupled request's responses the model has made and its reader has not taken yet: past
# either bound, the model's next response waits in its sender until the reader takes one (the
# reader: a ModelStreamInfer stream, held back in turn by its client's reading). Triton's
# --grpc-max-response-pool-size holds a model back the same way, and sets the count here
# (Triton's default is no bound; a device's memory needs one). One response is let through
# whatever its size, so a response larger than the byte bound still goes out.
DECOUPLED_MAX_RESPONSES = 16
DECOUPLED_MAX_BYTES = 32 << 20
# How long a model waits so for a reader that takes nothing; then the request fails with
# ResponsesNotRead and is cancelled. A model held in its sender longer would hold its instance
# for a client that may never read, and count as stuck for the systemd watchdog
# (appliance/ops/notify.py: every instance in one execution longer than WatchdogSec, 30 s in the
# shipped unit), which would restart the server for one client.
DECOUPLED_READER_WAIT_S = 10.0


class ResponsesNotRead(ApplianceError):
    """A decoupled request's reader took none of its responses for DECOUPLED_READER_WAIT_S."""

    code = ErrorCode.RESOURCE_EXHAUSTED


class _ResponseRoom:
    """The bounds on one decoupled request's responses waiting for its reader.

    `wait_for_room` runs in the model's thread (for a Python model, the thread reading its
    process's messages, so its process blocks in send() once the pipe is full). On the event
    loop's own thread (a decoupled ensemble step's responses) it never waits, which would
    stop the loop: the loop's reader takes them as they come. `on_stall` runs (in the model's
    thread) when the reader took nothing for DECOUPLED_READER_WAIT_S; `stalled` then says what
    was waiting.
    """

    __slots__ = (
        "_bytes",
        "_closed",
        "_cond",
        "_count",
        "_loop_thread",
        "_max_count",
        "_taken_at",
        "on_stall",
        "stalled",
    )

    def __init__(self, loop_thread: int, max_count: int = DECOUPLED_MAX_RESPONSES) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._max_count = max_count
        self._count = 0
        self._bytes = 0
        self._closed = False
        self._loop_thread = loop_thread
        self._taken_at = 0.0
        self.stalled = ""  # what was waiting when the reader stalled
        self.on_stall: Callable[[], None] | None = None

    def wait_for_room(self, outputs: dict[str, Array]) -> int:
        """Wait until the response fits, and count it; its size, or -1 when the reader is
        gone or stalled (the response is dropped)."""
        size = sum(int(getattr(array, "nbytes", 0)) for array in outputs.values())
        stalled = False
        with self._cond:
            if threading.get_ident() != self._loop_thread:
                started = time.monotonic()
                while not self._closed and self._full(size):
                    since = max(started, self._taken_at)
                    left = since + DECOUPLED_READER_WAIT_S - time.monotonic()
                    if left <= 0:
                        self.stalled = f"{self._count} responses, {self._bytes / 2**20:.1f} MiB"
                        stalled = self._closed = True
                        break
                    self._cond.wait(left)
            if self._closed:
                size = -1
            else:
                self._count += 1
                self._bytes += size
        if stalled and self.on_stall is not None:
            self.on_stall()
        return size

    def _full(self, size: int) -> bool:
        if not self._count:
            return False
        return self._count >= self._max_count or self._bytes + size > DECOUPLED_MAX_BYTES

    def taken(self, size: int) -> None:
        with self._cond:
            self._count -= 1
            self._bytes -= size
            self._taken_at = time.monotonic()
            self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()


async def _decoupled(served: ServedVersion, job: Job) -> None:
    """A decoupled request: its execution, then, when the model handed the instance back
    before its last response, the rest of its responses (cancelled with the stream)."""
    try:
        await served.scheduler.submit(job)
    except asyncio.CancelledError:
        # Cancelled as its execution ended (the outputs were in, not yet read here): the
        # rest of the request must hear of it too. Cancelled earlier, the scheduler tells it
        # when the execution ends (`Job.abandoned`).
        job.abandoned()
        raise
    if job.completion is not None:
        try:
            await asyncio.wrap_future(job.completion)
        except ApplianceError:
            raise
        except Exception as exc:  # the model's error, as the scheduler would map it
            raise client_error(served.label, exc) from exc


def _cancel_soon(loop: asyncio.AbstractEventLoop, task: asyncio.Future[None]) -> None:
    """Cancel `task` from another thread (nothing when the loop is closed)."""
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(task.cancel)


_EXECUTED = object()  # infer_stream: the decoupled execution ended


def _still_there() -> bool:
    """A request made inside the server: its caller is there until it is answered."""
    return True


def _count_failure(
    served: ServedVersion, exc: ApplianceError | asyncio.CancelledError, start: int
) -> None:
    """A request that failed, in the statistics as tritonserver counts it: a model's own error
    response as a success, a sequence request refused before its queue not at all, any other
    failure with its reason."""
    ns = time.monotonic_ns() - start
    if isinstance(exc, asyncio.CancelledError):
        served.stats.record_failure("CANCELED", ns)
    elif exc.model_response:
        served.stats.record_success(ns, model_failed=isinstance(exc, InferenceFailed))
    elif not exc.uncounted:
        served.stats.record_failure(_failure_reason(exc), ns)


def _failure_reason(exc: ApplianceError | asyncio.CancelledError) -> str:
    """Triton's reason label on nv_inference_request_failure."""
    if isinstance(exc, asyncio.CancelledError):
        return "CANCELED"
    if isinstance(exc, QueueFull | QueueTimeout):
        return "REJECTED"
    if isinstance(exc, InferenceFailed):
        return "BACKEND"
    return "OTHER"


# Triton refuses a classification of an output larger than this (elements).
_CLASSIFY_MAX_ELEMENTS = 1_000_000


def classify(array: Array, k: int, labels: list[str] | None, batching: bool) -> Array:
    """Triton's classification extension: top-k 'value:index[:label]' strings per batch item."""
    if array.dtype.kind not in "iuf" or (array.dtype.kind == "f" and array.dtype.itemsize < 4):
        name = from_numpy(array.dtype).triton
        raise InvalidInput(
            f"class result not available for output due to unsupported type '{name}'"
        )
    if array.size > _CLASSIFY_MAX_ELEMENTS:  # Triton's bound on the sort's work
        raise InvalidInput("classification output tensor too large")
    rows = array.reshape(array.shape[0], -1) if batching else array.reshape(1, -1)
    k = min(k, rows.shape[1])
    result = np.empty((rows.shape[0], k), dtype=np.object_)
    integer = array.dtype.kind in "iu"  # written as std::to_string writes them: 16, 0.500000
    for r, row in enumerate(rows):
        top = np.argsort(-row.astype(np.float64), kind="stable")[:k]
        for c, index in enumerate(top):
            value = row[index]
            text = f"{int(value) if integer else f'{float(value):f}'}:{int(index)}"
            if labels is not None and index < len(labels):
                text += f":{labels[index]}"
            result[r, c] = text.encode()
    return result if batching else result.reshape(k)


def _decoupled_on_unary(served: ServedVersion) -> DecoupledOnUnary:
    return DecoupledOnUnary(
        f"model '{served.name}' is decoupled (zero or more responses per request); "
        "call it over a gRPC ModelStreamInfer stream"
    )
