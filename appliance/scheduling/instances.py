"""Model instances on worker threads: one thread per instance, fed by a queue.

A dedicated thread fed through a SimpleQueue costs less per request than run_in_executor, and
keeps model code off the event loop. Results come back with call_soon_threadsafe.

The thread also closes its instance, after the last batch: an instance is never closed while
it executes, even when `stop` gives up waiting for a stuck execution.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from appliance.common.host_policy import HostPolicy
from appliance.common.types import Array
from appliance.ops import affinity
from appliance.scheduling.ragged import BatchShaping, gather, scatter
from edge_backends.api import (
    BackendError,
    ExecuteRaised,
    InputRejected,
    ModelInstance,
    Pending,
    RequestInfo,
    ResponseError,
)

log = logging.getLogger(__name__)

# The thread's CPU time per batch (the scheduler's cost model) is read for the first
# CPU_WARMUP_RUNS batches of an instance, then for one batch in CPU_SAMPLE_EVERY.
CPU_WARMUP_RUNS = 32
CPU_SAMPLE_EVERY = 8

# After `interrupt()` succeeds, how long `stop` waits for the execution to fail and the thread
# to close the instance (a killed Python model's process is reaped in milliseconds).
INTERRUPT_GRACE_S = 5.0


@dataclass(slots=True)
class Job:
    """One validated request waiting for, or in, a batch."""

    inputs: dict[str, Array]  # model-shaped (reshape applied), batch dimension first if batching
    batch_size: int  # items this request contributes (1 for models that do not batch)
    shape_key: tuple[Any, ...]  # non-batch input shapes: requests batch only with equals
    output_names: tuple[str, ...]
    future: asyncio.Future[dict[str, Array]]
    nbytes: int = 0  # input bytes: the inline-execution cost model's measure of size
    priority: int = 0  # the request's priority parameter (0: the model's default level)
    timeout_us: int = 0  # the request's timeout parameter (0: the queue policy's)
    arrival_ns: int = 0  # monotonic ns its front end first saw it (0: unknown); admission uses it
    enqueue_ns: int = 0
    dispatch_ns: int = 0
    # Set by the RequestQueue:
    level: int = 1
    deadline_ns: int = 0
    queued: bool = False
    delayed: bool = False
    # An ensemble's request: the client's request id and parameters, which every step carries.
    request_id: str = ""
    parameters: Mapping[str, Any] | None = None
    # Sequence batching (the sequence_id / sequence_start / sequence_end parameters):
    sequence_id: int | str = 0
    sequence_start: bool = False
    sequence_end: bool = False
    # Monotonic ns of compute start, input end, output start, compute end (for traces).
    compute_ns: tuple[int, int, int, int] | None = None
    # Decoupled models: called (from the instance's thread) with each response's outputs.
    emit: Callable[[dict[str, Array]], None] | None = None
    # A decoupled request its model goes on answering after the instance was handed back.
    completion: Pending | None = None
    # Run in the thread lane: whether its client is still there (the loop's future is not
    # cancelled when it goes); None on the loop's path.
    active: Callable[[], bool] | None = None

    def abandoned(self) -> None:
        """Its execution ended after its caller went (its future was done first): a decoupled
        request its model goes on answering (`completion`) is cancelled too, so that the model
        hears of it (request.is_cancelled()). The caller may go between the model handing the
        instance back and the loop reading that, when nothing else would tell it."""
        if self.completion is not None:
            self.completion.cancel()


# Request parameters that are fields of RequestInfo (or the front ends'), not the model's own.
_RESERVED_PARAMETERS = frozenset(
    {"sequence_id", "sequence_start", "sequence_end", "priority", "timeout", "binary_data_output"}
)


def request_info(job: Job, ragged: frozenset[str] = frozenset()) -> RequestInfo:
    """What the backend may show the model of a job's request besides its tensors."""
    parameters = job.parameters or {}
    sequence_id = job.sequence_id or parameters.get("sequence_id", 0)
    start = job.sequence_start or parameters.get("sequence_start") is True
    end = job.sequence_end or parameters.get("sequence_end") is True
    return RequestInfo(
        request_id=job.request_id,
        correlation_id=sequence_id if isinstance(sequence_id, int | str) else 0,
        flags=(1 if start else 0) | (2 if end else 0),
        parameters={k: v for k, v in parameters.items() if k not in _RESERVED_PARAMETERS},
        timeout_us=job.timeout_us,
        output_names=job.output_names,
        batch_size=job.batch_size,
        ragged_shapes={
            name: tuple(job.inputs[name].shape) for name in ragged if name in job.inputs
        },
    )


@dataclass(slots=True)
class BatchResult:
    """What a worker hands back to the loop for one batch."""

    jobs: list[Job]
    outcomes: list[dict[str, Array] | BaseException] = field(default_factory=list)  # per job
    input_ns: int = 0
    infer_ns: int = 0
    output_ns: int = 0
    cpu_ns: int = 0  # this thread's CPU time for the batch: wall time lies under GIL contention
    started_ns: int = 0
    batch_size: int = 0  # 0: not executed (or failed)
    # A Python model's execute() that raised (ExecuteRaised): its size, counted as an
    # execution as tritonserver's Python backend counts it; batch_size stays 0.
    raised_size: int = 0
    done: bool = field(default=False)

    @property
    def executed_size(self) -> int:
        """The size of the execution the statistics count (0: none)."""
        return self.batch_size or self.raised_size

    def stamp(self) -> None:
        """Give each job the batch's compute timestamps."""
        t0 = self.started_ns
        t1 = t0 + self.input_ns
        t2 = t1 + self.infer_ns
        times = (t0, t1, t2, t2 + self.output_ns)
        for job in self.jobs:
            job.compute_ns = times


def counted(result: BatchResult) -> tuple[int, list[int]]:
    """What tritonserver counts of an execution's requests that succeeded: their batch sizes
    (summed) and each one's time in the queue. A model's error response (a Python model's
    InferenceResponse(error=...)) is a success there, as Triton's Python backend reports it
    (the client still gets the error); a request that failed otherwise is not counted here."""
    inferences, queues = 0, []
    for job, outcome in zip(result.jobs, result.outcomes, strict=True):
        if isinstance(outcome, BaseException) and not isinstance(outcome, ResponseError):
            continue
        inferences += job.batch_size
        queues.append(max(0, job.dispatch_ns - job.enqueue_ns))
    return inferences, queues


def _gather_inputs(
    jobs: Sequence[Job], batching: bool, shaping: BatchShaping, per_request: bool
) -> dict[str, Array]:
    """The batch's tensors. `per_request`: the backend sees each request's own tensors (a
    Python model): no batch inputs, a single request's tensors as they are."""
    if len(jobs) == 1 and (per_request or not shaping):
        return jobs[0].inputs
    if len(jobs) > 1 and not batching:
        raise AssertionError("only batching models get multi-request batches")
    if shaping:
        return gather([j.inputs for j in jobs], shaping, batch_inputs=not per_request)
    return {name: np.concatenate([j.inputs[name] for j in jobs]) for name in jobs[0].inputs}


def _split_outputs(
    jobs: Sequence[Job],
    outputs: dict[str, Array],
    batching: bool,
    total: int,
    shaping: BatchShaping | None = None,
) -> list[dict[str, Array]]:
    scattered: dict[str, list[Array]] = {}  # batch outputs, cut by their source's shapes
    for spec in shaping.scatter if shaping else ():
        if spec.target in outputs:
            outputs = dict(outputs)
            try:
                scattered[spec.target] = scatter(
                    spec, outputs.pop(spec.target), [j.inputs for j in jobs]
                )
            except ValueError as exc:
                raise BackendError(str(exc)) from exc
    if len(jobs) == 1:
        return [{**outputs, **{name: cut[0] for name, cut in scattered.items()}}]
    for name, array in outputs.items():
        if array.ndim == 0 or array.shape[0] != total:
            raise BackendError(
                f"output '{name}' has shape {list(array.shape)}; expected a first (batch) "
                f"dimension of {total}"
            )
    parts: list[dict[str, Array]] = []
    start = 0
    for index, job in enumerate(jobs):
        end = start + job.batch_size
        part = {name: array[start:end] for name, array in outputs.items()}
        part.update({name: cut[index] for name, cut in scattered.items()})
        parts.append(part)
        start = end
    return parts


class InstanceWorker:
    """Runs batches on one model instance in its own thread."""

    def __init__(
        self,
        name: str,
        instance: ModelInstance,
        batching: bool,
        resources: dict[str, int] | None = None,
        priority: int = 0,
        shaping: BatchShaping | None = None,
        host_policy: HostPolicy | None = None,
    ) -> None:
        self.name = name
        self.host_policy = host_policy  # the thread's cores and memory node (--host-policy)
        self._shaping = shaping or BatchShaping()  # ragged inputs and batch inputs
        self.resources = resources or {}  # rate_limiter resources held while a batch runs
        self.priority = priority
        # Instances that wait on another process must never run on the event loop, nor those
        # bound to cores or a memory node (the loop's thread is not).
        self.inline_ok = instance.runs_inline and host_policy is None
        self._wants_requests = instance.wants_requests  # else the batch's tensors only
        self._instance = instance
        self._running: Sequence[Job] = ()  # the batch in hand, for the cancel check
        self._runs = 0  # batches run, for sampling their CPU time
        self._distinct: tuple[str, ...] = ()  # output names last found free of repeats
        self._close_lock = threading.Lock()
        self._closed = False
        instance.set_cancel_check(self._callers_gone)
        self._batching = batching
        self._inbox: queue.SimpleQueue[
            tuple[list[Job], Callable[[InstanceWorker, BatchResult], None]] | None
        ] = queue.SimpleQueue()
        self._loop: asyncio.AbstractEventLoop | None = None
        # A batch the loop started (`start_on_loop`) is not running: set, as it is at first.
        self._loop_idle = threading.Event()
        self._loop_idle.set()
        self._starts_on_loop = (
            instance.starts_on_loop and instance.wants_requests and host_policy is None
        )
        self._thread = threading.Thread(target=self._serve, name=f"instance-{name}", daemon=True)
        # Monotonic ns the batch in hand started on the thread, or a decoupled model last sent
        # a response (0: idle): the watchdog's measure of a stuck instance.
        self.busy_since_ns = 0

    @property
    def instance(self) -> ModelInstance:
        return self._instance

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._thread.start()

    def submit(
        self, jobs: list[Job], on_done: Callable[[InstanceWorker, BatchResult], None]
    ) -> None:
        self._inbox.put((jobs, on_done))

    def stop(self, timeout_s: float | None = None) -> bool:
        """Finish the batch in hand, then close the instance; blocking: call from a thread.

        Waits at most `timeout_s` (None: as long as it takes) for the batch; past it, asks
        the instance to interrupt the execution (only some backends can) and waits
        INTERRUPT_GRACE_S more when it could. Returns whether the thread ended, the instance
        closed. When it did not, the daemon thread closes the instance if the execution ever
        returns: closing under a running execution is unsafe for in-process runtimes."""
        if not self._loop_idle.wait(timeout_s) and self._interrupt():
            self._loop_idle.wait(INTERRUPT_GRACE_S)
        self._inbox.put(None)
        if not self._thread.is_alive():
            if self._thread.ident is None:  # never started: nothing else will close it
                self._close()
            return True
        self._thread.join(timeout_s)
        if self._thread.is_alive() and self._interrupt():
            self._thread.join(INTERRUPT_GRACE_S)
        if self._thread.is_alive():
            log.warning(
                "instance %s did not finish its execution within %s s; leaving its thread to "
                "end on its own (the instance is closed when it does)",
                self.name,
                f"{timeout_s:g}" if timeout_s is not None else "the time allowed",
            )
            return False
        return True

    def start_on_loop(
        self, jobs: list[Job], on_done: Callable[[InstanceWorker, BatchResult], None]
    ) -> bool:
        """`submit` without the thread, on the loop: an instance that `starts_on_loop` (a model
        in another process) is handed the batch here and `on_done` called when the loop reads
        its answer. False: not started (a decoupled request, or the instance declined), and
        the caller submits it."""
        if not self._starts_on_loop or jobs[0].emit is not None:
            return False
        loop = self._loop
        assert loop is not None
        t0 = time.monotonic_ns()
        try:
            inputs = _gather_inputs(jobs, self._batching, self._shaping, True)
        except Exception:  # `run` fails the batch, or its requests one by one
            return False
        names: list[str] = []
        for job in jobs:
            names.extend(n for n in job.output_names if n not in names)
        infos = [request_info(job, self._ragged_of(jobs)) for job in jobs]
        t1 = time.monotonic_ns()
        self._running = jobs
        self.busy_since_ns = t0
        self._loop_idle.clear()

        def done(answers: Sequence[dict[str, Array] | BackendError] | BaseException) -> None:
            t2 = time.monotonic_ns()
            self._running = ()
            self.busy_since_ns = 0
            result = BatchResult(jobs=jobs, cpu_ns=-1)
            if isinstance(answers, InputRejected) and len(jobs) > 1:
                # One request's bad input must not fail the others: `run` tries them singly.
                self._inbox.put((jobs, on_done))
                self._loop_idle.set()
                return
            if isinstance(answers, BaseException):
                result.outcomes = [answers] * len(jobs)
                if isinstance(answers, ExecuteRaised):  # still an execution (see BatchResult)
                    result.started_ns, result.input_ns, result.infer_ns = t0, t1 - t0, t2 - t1
                    result.output_ns = time.monotonic_ns() - t2
                    result.raised_size = sum(j.batch_size for j in jobs)
            elif len(answers) != len(jobs):
                error = BackendError(
                    f"{len(answers)} responses for a batch of {len(jobs)} requests"
                )
                result.outcomes = [error] * len(jobs)
            else:
                result.outcomes = list(answers)
                result.input_ns, result.infer_ns = t1 - t0, t2 - t1
                result.output_ns = time.monotonic_ns() - t2  # as `run`'s (Triton's is never 0)
                result.started_ns = t0
                result.batch_size = sum(j.batch_size for j in jobs)
            self._loop_idle.set()
            on_done(self, result)

        try:
            started = self._instance.start_requests(loop, inputs, names, infos, done)
        except Exception as exc:  # answered on the next round: `_dispatch` is not re-entered
            log.exception("starting a batch on instance %s failed", self.name)
            started = True
            loop.call_soon(done, exc)
        if not started:
            self._running = ()
            self.busy_since_ns = 0
            self._loop_idle.set()
        return started

    def _interrupt(self) -> bool:
        try:
            return self._instance.interrupt()
        except Exception:
            log.exception("interrupting instance %s failed", self.name)
            return False

    def _close(self) -> None:
        """Close the instance once (the thread on its way out, or `stop` if it never ran)."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        try:
            self._instance.close()
        except Exception:
            log.exception("closing instance %s failed", self.name)

    def _callers_gone(self) -> bool:
        """The instance's cancel check: has every caller of the batch in hand gone away?"""
        jobs = self._running
        return bool(jobs) and all(
            j.future.done() or (j.active is not None and not j.active()) for j in jobs
        )

    def _serve(self) -> None:
        assert self._loop is not None
        try:
            try:
                affinity.apply(self.host_policy)
            except OSError as exc:  # the load applied it already: not expected to fail here
                log.error("instance %s: %s", self.name, exc)
            while True:
                item = self._inbox.get()
                if item is None:
                    return
                jobs, on_done = item
                self.busy_since_ns = time.monotonic_ns()
                result = self.run(jobs)
                self.busy_since_ns = 0
                try:
                    self._loop.call_soon_threadsafe(on_done, self, result)
                except RuntimeError:  # loop closed during shutdown
                    return
        finally:
            self._close()

    def _progress(
        self, emit: Callable[[dict[str, Array]], None]
    ) -> Callable[[dict[str, Array]], None]:
        """`emit`, also marking a decoupled model that keeps responding as not stuck."""

        def emitted(outputs: dict[str, Array]) -> None:
            if self.busy_since_ns:
                self.busy_since_ns = time.monotonic_ns()
            emit(outputs)

        return emitted

    def run(self, jobs: list[Job]) -> BatchResult:
        """Execute one batch; never raises: each job's outputs or error is in `outcomes`."""
        self._runs += 1
        # Reading the thread's CPU clock costs about 1 us twice: every batch while the
        # scheduler learns the model's cost, then one batch in CPU_SAMPLE_EVERY.
        timed = self._runs <= CPU_WARMUP_RUNS or not self._runs % CPU_SAMPLE_EVERY
        job = jobs[0]
        if len(jobs) == 1 and job.emit is None and not self._wants_requests and not self._shaping:
            return self._run_one(job, jobs, timed)
        result = BatchResult(jobs=jobs)
        cpu0 = time.thread_time_ns() if timed else 0
        t0 = t1 = t2 = 0
        try:
            t0 = time.monotonic_ns()
            inputs = _gather_inputs(jobs, self._batching, self._shaping, self._wants_requests)
            names: list[str] = []
            for job in jobs:
                names.extend(n for n in job.output_names if n not in names)
            t1 = time.monotonic_ns()
            self._running = jobs
            answers: list[dict[str, Array] | BaseException] | None = None  # one per job
            outputs: dict[str, Array] = {}
            try:
                if jobs[0].emit is not None:  # decoupled: one request, responses streamed out
                    emit = self._progress(jobs[0].emit)
                    info = request_info(jobs[0])
                    jobs[0].completion = self._instance.execute_decoupled(
                        inputs, names, emit, info
                    )
                elif self._wants_requests:  # each request answered on its own
                    infos = [request_info(job, self._ragged_of(jobs)) for job in jobs]
                    answers = list(self._instance.execute_requests(inputs, names, infos))
                    if len(answers) != len(jobs):
                        raise BackendError(
                            f"{len(answers)} responses for a batch of {len(jobs)} requests"
                        )
                else:
                    outputs = self._instance.execute(inputs, names)
            finally:
                self._running = ()
                t2 = time.monotonic_ns()
            total = sum(j.batch_size for j in jobs)
            if answers is None:
                answers = list(
                    _split_outputs(jobs, outputs, self._batching, total, self._shaping)
                )
            result.outcomes = answers
            t3 = time.monotonic_ns()
            result.input_ns, result.infer_ns, result.output_ns = t1 - t0, t2 - t1, t3 - t2
            result.started_ns = t0
            result.batch_size = total
            result.cpu_ns = time.thread_time_ns() - cpu0 if timed else -1
        except InputRejected as exc:
            if len(jobs) == 1:
                result.outcomes = [exc]
                return result
            # One request's bad input must not fail the others: run them one by one.
            singles = [self.run([job]) for job in jobs]
            result.outcomes = [s.outcomes[0] for s in singles]
            ok = [s for s in singles if s.batch_size]
            result.batch_size = sum(s.batch_size for s in ok)
            result.input_ns = sum(s.input_ns for s in ok)
            result.infer_ns = sum(s.infer_ns for s in ok)
            result.output_ns = sum(s.output_ns for s in ok)
        except Exception as exc:  # the whole batch failed: every request reports it
            result.outcomes = [exc] * len(jobs)
            if isinstance(exc, ExecuteRaised) and t2:  # still an execution, with its times
                result.started_ns, result.input_ns = t0, t1 - t0
                result.infer_ns, result.output_ns = t2 - t1, time.monotonic_ns() - t2
                result.raised_size = sum(j.batch_size for j in jobs)
        return result

    def _ragged_of(self, jobs: list[Job]) -> frozenset[str]:
        """The ragged inputs a batch's tensors hold as one 1-D tensor (several requests)."""
        return self._shaping.ragged if len(jobs) > 1 else frozenset()

    def _run_one(self, job: Job, jobs: list[Job], timed: bool) -> BatchResult:
        """`run` for a batch of one request to `execute` (the common case): its inputs as
        they are, its own output names, its outputs as they come; the same timestamps."""
        result = BatchResult(jobs=jobs)
        cpu0 = time.thread_time_ns() if timed else 0
        t0 = time.monotonic_ns()
        names = job.output_names
        if len(names) > 1 and names is not self._distinct:
            if len(set(names)) < len(names):
                names = tuple(dict.fromkeys(names))
            else:  # most requests ask for the same tuple (every output): checked once
                self._distinct = names
        t1 = time.monotonic_ns()
        self._running = jobs
        try:
            outputs = self._instance.execute(job.inputs, names)
        except Exception as exc:  # InputRejected included: the request's own error
            result.outcomes = [exc]
            if isinstance(exc, ExecuteRaised):  # still an execution (see BatchResult)
                t2 = time.monotonic_ns()
                result.started_ns, result.input_ns, result.infer_ns = t0, t1 - t0, t2 - t1
                result.output_ns = time.monotonic_ns() - t2
                result.raised_size = job.batch_size
            return result
        finally:
            self._running = ()
        t2 = time.monotonic_ns()
        result.outcomes = [outputs]
        t3 = time.monotonic_ns()
        result.input_ns, result.infer_ns, result.output_ns = t1 - t0, t2 - t1, t3 - t2
        result.started_ns = t0
        result.batch_size = job.batch_size
        result.cpu_ns = time.thread_time_ns() - cpu0 if timed else -1
        return result
