"""The backend contract: what a backend is given, and what it must provide.

A backend turns a model file into runnable *instances*. It sees numpy arrays, tensor names and
plain settings; it never sees a request object, a protocol, a status code or JSON.

`Backend` and `ModelInstance` list every member the server uses. Subclass `BackendBase` and
`InstanceBase`: they give the optional members their defaults, so a backend writes only what it
does differently. Example, the smallest backend::

    class EchoBackend(BackendBase):
        name = "echo"

        def inspect(self, model_path: Path) -> ModelSignature:
            return ModelSignature(inputs=(TensorSpec("x", "FP32", (-1, 4)),),
                                  outputs=(TensorSpec("y", "FP32", (-1, 4)),))

        def create_instance(self, spec: InstanceSpec) -> ModelInstance:
            return EchoInstance()

    class EchoInstance(InstanceBase):
        def execute(self, inputs: Arrays, output_names: Sequence[str]) -> Outputs:
            return {"y": inputs["x"]}

        def close(self) -> None:
            pass

What the bases give, and who overrides it here:

- `Backend.auto_complete`: nothing to add to config.pbtxt (Python, TensorRT and FIL fill it in).
- `Backend.gpu_problem`: "this backend has no GPU support" (those that can use a GPU say when).
- `ModelInstance.runs_inline`: True, a short execution may run on the event loop (False for
  Python models, which wait on their own process).
- `ModelInstance.placement`: None, the instance runs where its spec asked (ONNX Runtime says
  when a GPU session fell back to CPU).
- `ModelInstance.wants_requests`: False, the server calls `execute` with the batch's tensors
  (True for Python models, which hand each request, with its id, sequence id, flags,
  parameters and timeout, to the model: the server calls `execute_requests`).
- `ModelInstance.execute_requests`: `execute`, its outputs split into each request's rows.
- `ModelInstance.execute_decoupled`: raises BackendError (Python models can stream).
- `ModelInstance.starts_on_loop` / `start_requests`: False / not started, the server runs
  every execution on the instance's thread (a Python model's is started from the event loop,
  which reads its answer: no thread hand-off).
- `ModelInstance.set_cancel_check`: ignored (Python models show it as request.is_cancelled()).
- `ModelInstance.interrupt`: cannot (a Python model's process can be killed).
- `ModelInstance.custom_metrics`: none (Python models define them with `pb_utils.MetricFamily`).
- `ModelInstance.asks_readiness` / `ready`: False / True, a loaded instance is ready (a Python
  model with `is_ready()` is asked, within its `is_ready_timeout_s`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeAlias

import numpy as np

Arrays = Mapping[str, np.ndarray[Any, Any]]
Outputs = dict[str, np.ndarray[Any, Any]]
# A decoupled model's way out: called with each response's outputs, from the instance's thread.
Emit: TypeAlias = Callable[[Outputs], None]
# Whether every caller of the execution in hand has gone away.
CancelCheck: TypeAlias = Callable[[], bool]
# A decoupled request still answering after its instance was handed back: done (or failed
# with the request's error) after its last response; the server cancels it when the client
# goes away.
Pending: TypeAlias = "Future[None]"
# `start_requests`' way back, on the event loop: each request's outputs or error, or the
# exception that failed the whole batch.
Done: TypeAlias = "Callable[[Sequence[Outputs | BackendError] | BaseException], None]"


@dataclass(frozen=True)
class RequestInfo:
    """What a request says besides its tensors, for backends that show it to the model (a
    Python model's `request.request_id()`, `correlation_id()`, `flags()`, `parameters()`,
    `timeout()`, `requested_output_names()`)."""

    request_id: str = ""
    correlation_id: int | str = 0  # the sequence id; 0 when none
    flags: int = 0  # 1: sequence start, 2: sequence end (Triton's request flags)
    # The request's own parameters (not sequence_*, priority, timeout: those are fields).
    parameters: Mapping[str, Any] = field(default_factory=dict)
    timeout_us: int = 0
    output_names: tuple[str, ...] = ()
    batch_size: int = 1  # this request's rows of the batch (1 for models that do not batch)
    # Ragged inputs (`allow_ragged_batch`) of a batch of several requests: the batch's tensor
    # is every request's elements one after the other (1-D), and this request's shape of each.
    ragged_shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class HostRequest:
    """A request a model makes to another model of the server (BLS)."""

    model_name: str
    inputs: Arrays
    output_names: Sequence[str] = ()  # empty: every output
    model_version: str = ""  # '' for the one the version policy serves
    request_id: str = ""
    # The request's parameters as a client would send them: sequence_id, sequence_start,
    # sequence_end, priority, timeout (µs) and the model's own.
    parameters: Mapping[str, Any] = field(default_factory=dict)


class InferenceHost(Protocol):
    """The server's blocking entry for models that call other models (BLS) or load and unload
    them (Triton's model loading API). Called from an instance's thread or a backend's own
    threads, never from the event loop; failures raise an exception whose message is the one
    a client would get."""

    def infer(self, request: HostRequest) -> Outputs:
        """One request to a model that answers once; its outputs by name."""
        ...

    def infer_stream(self, request: HostRequest, emit: Emit) -> None:
        """One request to a decoupled model: `emit` gets each response's outputs, in order,
        on the calling thread; returns after the last one."""
        ...

    def load_model(
        self, name: str, config: str = "", files: Mapping[str, bytes] | None = None
    ) -> None:
        """Load or reload a model (explicit model control mode), optionally with a config
        override (JSON) and override files ('file:<path>' -> content), as a client's
        repository load request does."""
        ...

    def unload_model(self, name: str, unload_dependents: bool = False) -> None:
        """Unload a model (explicit model control mode)."""
        ...

    def is_model_ready(self, name: str, version: str = "") -> bool:
        """Whether the model (the version, when given) is ready for requests."""
        ...


@dataclass(frozen=True)
class MetricSample:
    """One labelled value of a custom metric family, as it is now."""

    labels: tuple[tuple[str, str], ...]  # sorted by name
    value: float = 0.0  # counter, gauge
    # Histogram: (upper bound, observations <= bound), bounds ascending, without +Inf.
    buckets: tuple[tuple[float, int], ...] = ()
    sum: float = 0.0  # histogram: sum of observations
    count: int = 0  # histogram: number of observations


@dataclass(frozen=True)
class CustomMetricFamily:
    """A metric family a model defined (Triton's custom metrics), exposed with the server's."""

    name: str
    description: str
    kind: str  # "counter" | "gauge" | "histogram"
    samples: tuple[MetricSample, ...] = ()


# Triton's error codes (TRITONSERVER_Error_Code), by name, that a backend may give an error.
ERROR_CODES = frozenset(
    {
        "UNKNOWN",
        "INTERNAL",
        "NOT_FOUND",
        "INVALID_ARG",
        "UNAVAILABLE",
        "UNSUPPORTED",
        "ALREADY_EXISTS",
        "CANCELLED",
    }
)


class BackendError(Exception):
    """Base of errors raised by backends; the message is shown to users as it is.

    `code` is Triton's error code name for what the client should get: "INTERNAL" (the model
    failed) unless the backend knows better, e.g. a Python model's response with
    `TritonError(..., TritonError.INVALID_ARG)` is "INVALID_ARG" (400 / INVALID_ARGUMENT).
    One of ERROR_CODES."""

    code: str = "INTERNAL"

    def __init__(self, *args: object, code: str | None = None) -> None:
        super().__init__(*args)
        if code is not None:
            self.code = code if code in ERROR_CODES else "INTERNAL"


class ResponseError(BackendError):
    """A model's own error response for one request (a Python model's
    `InferenceResponse(error=...)`): the client gets its message as it is, as from tritonserver."""


class ModelLoadError(BackendError):
    """The model file cannot be loaded (missing, corrupt, unsupported)."""


class ExecutionError(BackendError):
    """The model failed while running a batch."""


class ExecuteRaised(ExecutionError):
    """A Python model's execute() ran and raised. tritonserver's Python backend reports the
    execution's batch statistics whatever execute() did, so the server counts it as an
    execution (each request a failure); other backends' failed executions are not counted."""


class InputRejected(BackendError):
    code = "INVALID_ARG"

    """An input's contents cannot be given to this backend (e.g. non-UTF-8 text for ONNX
    strings): the request is at fault, not the model. A batch that fails with it is re-run
    request by request, so only the offending request fails."""

    code = "INVALID_ARG"


@dataclass(frozen=True)
class TensorSpec:
    """A tensor as the model file declares it: -1 marks a dynamic dimension."""

    name: str
    datatype: str  # Triton name, e.g. "FP32"
    shape: tuple[int, ...]


@dataclass(frozen=True)
class ModelSignature:
    """What a model file says about itself; used to auto-complete and validate config.pbtxt."""

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]


@dataclass(frozen=True)
class InstanceSpec:
    """Everything a backend needs to create one model instance."""

    model_name: str
    model_version: int
    model_path: Path
    instance_name: str
    kind: str = "KIND_CPU"  # KIND_CPU | KIND_GPU | KIND_AUTO
    device_id: int = 0
    # Config `parameters` (string values), named as Triton's backend for this format names them.
    parameters: Mapping[str, str] = field(default_factory=dict)
    # The graph optimisation level from `optimization { graph { level } }`, None when unset.
    graph_optimization_level: int | None = None
    # How many instances of this model run at once; backends size their thread pools with it.
    instance_count: int = 1
    # The model's configuration as JSON-ready data (Python models receive it in `args`).
    model_config: Mapping[str, Any] | None = None
    # The instance group's `profile` list (TensorRT optimization profiles; empty: all).
    profiles: tuple[str, ...] = ()
    # `optimization { execution_accelerators { gpu_execution_accelerator [...] } }`:
    # (name, parameters) pairs in the config's order, e.g. ("tensorrt", {"precision_mode": "FP16"}).
    gpu_accelerators: tuple[tuple[str, Mapping[str, str]], ...] = ()
    # A folder this model version may keep derived files in (built engines, converted models),
    # under the server's state directory; None when the server has none.
    cache_dir: Path | None = None
    # The server's inference entry for models that call other models (BLS); None when the
    # server offers none.
    host: InferenceHost | None = None


@dataclass(frozen=True)
class Placement:
    """Where an instance really runs, when that is not what its spec asked."""

    kind: str  # KIND_CPU | KIND_GPU
    note: str = ""  # why it differs from the spec, e.g. "the GPU session failed (...)"


class ModelInstance(Protocol):
    """One loaded copy of a model.

    The server calls `execute` or `execute_decoupled` from one thread at a time, and `close`
    once, after the last execution has returned (never while one runs). Only `interrupt` and
    `ready` are called while an execution may be running, from another thread."""

    @property
    def runs_inline(self) -> bool:
        """Whether a short execution may run on the server's event loop instead of the
        instance's thread; False for instances that wait on something else (another process)."""
        ...

    @property
    def placement(self) -> Placement | None:
        """Where this instance really runs, with the reason when it is not where its spec
        asked; None: where the spec asked."""
        ...

    @property
    def wants_requests(self) -> bool:
        """Whether the server should call `execute_requests` (the batch's requests described)
        instead of `execute` (its tensors only)."""
        ...

    def execute(self, inputs: Arrays, output_names: Sequence[str]) -> Outputs:
        """Run one batch: inputs by name, return the named outputs."""
        ...

    def execute_requests(
        self, inputs: Arrays, output_names: Sequence[str], requests: Sequence[RequestInfo]
    ) -> Sequence[Outputs | BackendError]:
        """Run one batch told which requests make it (in order, each `batch_size` rows of
        every input): each request's outputs, or the error its own response carries (the
        other requests still succeed). Raise when the whole batch failed."""
        ...

    def execute_decoupled(
        self,
        inputs: Arrays,
        output_names: Sequence[str],
        emit: Emit,
        request: RequestInfo | None = None,
    ) -> Pending | None:
        """Run one request of a decoupled model (`model_transaction_policy { decoupled: true }`):
        call `emit` with each response's outputs as it is ready. Return None after the last
        one; or, when the model hands the request back to the instance before its last
        response (Triton's decoupled models answer from threads or coroutines), return a
        Pending at once, so that the instance takes the next request while this one goes on."""
        ...

    @property
    def starts_on_loop(self) -> bool:
        """Whether the server may call `start_requests` from its event loop instead of
        `execute_requests` on the instance's thread."""
        ...

    def start_requests(
        self,
        loop: Any,
        inputs: Arrays,
        output_names: Sequence[str],
        requests: Sequence[RequestInfo],
        done: Done,
    ) -> bool:
        """`execute_requests` without blocking, called on the thread of the asyncio event loop
        `loop`: start the batch and return True at once; `done` is called later, on that
        loop's thread, with what `execute_requests` would have returned or raised (exactly
        once). False: not started, the server calls `execute_requests` as usual. The same
        rule holds: one execution at a time, `close` after the last one ended."""
        ...

    def set_cancel_check(self, check: CancelCheck) -> None:
        """Called once, before the first execution: during an execution, `check()` says
        whether every caller waiting for it has gone away (cancelled, timed out), so a model
        may stop early."""
        ...

    def interrupt(self) -> bool:
        """Make a running execution end soon, with an error, if this backend can; say whether
        it could. Called from another thread when an execution outlives the server's stop
        deadline; `close` still follows once the execution has returned."""
        ...

    def close(self) -> None:
        """Release the instance's resources."""
        ...

    def custom_metrics(self) -> Sequence[CustomMetricFamily]:
        """The metric families this instance's model defined, as they are now, read when the
        server's metrics are scraped (from any thread). Families shared by several instances
        (same name) are the same family: the server lists each name once."""
        ...

    @property
    def asks_readiness(self) -> bool:
        """Whether `ready` asks the model (a round trip the backend bounds in time, e.g. a
        Python model's is_ready()), so the server calls it off its event loop; False: `ready`
        answers at once."""
        ...

    def ready(self) -> bool:
        """Whether the instance can serve now (Triton's TRITONBACKEND_ModelInstanceReady),
        called whenever the model's readiness is asked (model ready, strict server readiness),
        from any thread. It must return within a bounded time: a check that fails or takes
        too long answers False (and says why in the log), never raises or hangs."""
        ...


class InstanceBase(ModelInstance):
    """The defaults of an instance's optional members; subclasses write `execute` and `close`."""

    runs_inline: bool = True
    placement: Placement | None = None
    wants_requests: bool = False

    def execute_requests(
        self, inputs: Arrays, output_names: Sequence[str], requests: Sequence[RequestInfo]
    ) -> Sequence[Outputs | BackendError]:
        outputs = self.execute(inputs, output_names)
        if len(requests) <= 1:
            return [outputs]
        parts: list[Outputs | BackendError] = []
        start = 0
        for request in requests:
            end = start + request.batch_size
            parts.append({name: array[start:end] for name, array in outputs.items()})
            start = end
        return parts

    def execute_decoupled(
        self,
        inputs: Arrays,
        output_names: Sequence[str],
        emit: Emit,
        request: RequestInfo | None = None,
    ) -> Pending | None:
        raise BackendError("this backend cannot serve decoupled models")

    starts_on_loop: bool = False

    def start_requests(
        self,
        loop: Any,
        inputs: Arrays,
        output_names: Sequence[str],
        requests: Sequence[RequestInfo],
        done: Done,
    ) -> bool:
        return False  # the instance's thread runs execute_requests

    def set_cancel_check(self, check: CancelCheck) -> None:
        pass  # the execution cannot be told; it runs to the end

    def interrupt(self) -> bool:
        # An in-process runtime (ONNX Runtime, TensorRT, torch) cannot be stopped mid-run
        # safely: its thread is left to finish, and the instance is closed when it does.
        return False

    def custom_metrics(self) -> Sequence[CustomMetricFamily]:
        return ()

    asks_readiness: bool = False

    def ready(self) -> bool:
        return True  # loaded is ready: nothing to ask


class Backend(Protocol):
    """A model format's loader."""

    name: str

    def inspect(self, model_path: Path) -> ModelSignature:
        """Read the model file's inputs and outputs without serving it."""
        ...

    def create_instance(self, spec: InstanceSpec) -> ModelInstance:
        """Load one instance; raise ModelLoadError with the reason on failure."""
        ...

    def auto_complete(
        self, model_path: Path, config: dict[str, Any], default_max_batch_size: int
    ) -> dict[str, Any] | None:
        """Fill in what config.pbtxt leaves out (unless --strict-model-config): `config` is the
        model's configuration as JSON-ready data, field names as in the .proto; return it
        completed (it may be changed in place), or None when there is nothing to add. Raise
        BackendError with the reason when the file and the config disagree.
        `default_max_batch_size`: the max_batch_size a model that can batch gets when its
        config sets none (the server's, --backend-config [BACKEND,]default-max-batch-size;
        0: it does not batch; above 1 with the dynamic batcher)."""
        ...

    def gpu_problem(self) -> str:
        """Why this backend cannot run instances on a GPU here ('' when it can)."""
        ...


class BackendBase(Backend):
    """The defaults of a backend's optional members; subclasses write `name`, `inspect` and
    `create_instance`."""

    def auto_complete(
        self, model_path: Path, config: dict[str, Any], default_max_batch_size: int
    ) -> dict[str, Any] | None:
        return None

    def gpu_problem(self) -> str:
        return "this backend has no GPU support"
