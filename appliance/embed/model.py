"""`Model`, requests and responses: `Model.infer` calls the inference service directly."""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Generator, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from appliance.common.errors import ApplianceError
from appliance.common.types import InferRequest, InferResponse, RequestedOutput
from appliance.common.types import Tensor as RequestTensor
from appliance.embed.errors import InvalidArgumentError, TritonError, triton_error
from appliance.embed.tensor import DataType, Tensor, input_array
from appliance.frontends.http import convert
from appliance.services.inference import Prepared

if TYPE_CHECKING:
    from appliance.embed.server import Server, _Running
    from appliance.runtime.loader import TensorRule


def _always() -> bool:
    return True


# DataType by name: a dict lookup per output, not the enum's own.
_DATATYPES: dict[str, DataType] = {member.name: member for member in DataType}


class Model:
    """A model of a started server (Triton's `tritonserver.Model`); version -1: the one its
    version policy serves."""

    def __init__(
        self,
        server: Server,
        name: str,
        version: int = -1,
        state: str | None = None,
        reason: str | None = None,
    ) -> None:
        server._require()  # "Server not started", as Triton's
        self._server = server
        self.name = name
        self.version = version
        self.state = state
        self.reason = reason

    @property
    def _version(self) -> str:
        return "" if self.version < 0 else str(self.version)

    def _running(self) -> _Running:
        return self._server._require()

    # ---- inference ---------------------------------------------------------------------------

    def create_request(self, **kwargs: Any) -> InferenceRequest:
        kwargs.pop("model", None)
        return InferenceRequest(model=self, **kwargs)

    def infer(
        self,
        inference_request: InferenceRequest | None = None,
        raise_on_error: bool = True,
        **kwargs: Any,
    ) -> ResponseIterator:
        """Run a request; an iterator of its responses (one, or a decoupled model's many,
        then an empty final one). Called from any thread but the server's own."""
        request = inference_request or InferenceRequest(model=self, **kwargs)
        running = self._running()
        appliance = running.appliance
        try:
            served = appliance.runtime.get(self.name, self._version)
        except ApplianceError as exc:
            made = [InferenceResponse._failed(self, request, exc)]
            return ResponseIterator(self, _eager(made, request), raise_on_error)
        loop = running.loop
        assert loop is not None
        inference = appliance.inference
        outcome: InferResponse | Prepared | None = None
        if served.plain and request._plain():  # like a request already validated: no checks
            try:
                outcome = inference.infer_plain(
                    served,
                    self.name,
                    self._version,
                    request.inputs,
                    request.request_id or "",
                    loop,
                    _always,
                )
            except (ApplianceError, TritonError) as exc:
                made = [InferenceResponse._failed(self, request, exc)]
                return ResponseIterator(self, _eager(made, request), raise_on_error)
        if outcome is None:
            core = request._core(served.inputs)  # a bad input or parameter raises here, as Triton's
            if served.decoupled:
                responses: Generator[InferenceResponse, None, None] = _stream_sync(self, core)
                if request.response_queue is not None:  # filled as they come, read or not
                    responses = _fetched(_queued(responses, request))
                return ResponseIterator(self, responses, raise_on_error)
        try:
            if outcome is None:
                outcome = inference.infer_here(core, None, loop, _always, learn=True)
            if isinstance(outcome, Prepared):  # queued work, batching, the cache: on the loop
                outcome = running.call(inference.infer_prepared(outcome))
            made = [InferenceResponse._made(self, outcome, final=True)]
        except (ApplianceError, TritonError) as exc:
            made = [InferenceResponse._failed(self, request, exc)]
        return ResponseIterator(self, _eager(made, request), raise_on_error)

    def async_infer(
        self,
        inference_request: InferenceRequest | None = None,
        raise_on_error: bool = True,
        **kwargs: Any,
    ) -> AsyncResponseIterator:
        """`infer` for asyncio code: an async iterator of the responses (on the caller's loop;
        the request runs on the server's)."""
        request = inference_request or InferenceRequest(model=self, **kwargs)
        responses: AsyncGenerator[InferenceResponse, None] = _stream_async(self, request)
        if request.response_queue is not None:
            responses = _fetched_async(responses, request.response_queue)
        return AsyncResponseIterator(self, responses, raise_on_error)

    # ---- metadata ----------------------------------------------------------------------------

    def ready(self) -> bool:
        return self._running().appliance.control.model_ready(self.name, self._version)

    def metadata(self) -> dict[str, Any]:
        control = self._running().appliance.control
        try:
            return convert.model_metadata(control.model_metadata(self.name, self._version))
        except ApplianceError as exc:
            raise triton_error(exc) from exc

    def config(self, config_version: int = 1) -> dict[str, Any]:
        control = self._running().appliance.control
        try:
            return convert.model_config(control.model_config(self.name, self._version))
        except ApplianceError as exc:
            raise triton_error(exc) from exc

    def statistics(self) -> dict[str, Any]:
        control = self._running().appliance.control
        try:
            return convert.statistics(control.statistics(self.name, self._version))
        except ApplianceError as exc:
            raise triton_error(exc) from exc

    def __repr__(self) -> str:
        return str({"name": self.name, "version": self.version, "state": self.state})


@dataclass
class InferenceRequest:
    """A request to a model (Triton's `tritonserver.InferenceRequest`): inputs are numpy
    arrays (used as they are, no copy), lists, or anything with `__dlpack__` on the host."""

    model: Model
    request_id: str | None = None
    flags: int = 0
    correlation_id: int | str | None = None
    priority: int = 0
    timeout: int = 0
    inputs: dict[str, Any] = field(default_factory=dict)
    parameters: dict[str, str | int | bool | float] = field(default_factory=dict)
    output_memory_type: Any = None
    # Each response is put here too as it is made (queue.SimpleQueue for infer, asyncio.Queue
    # for async_infer), whether or not the iterator is read.
    response_queue: Any = None
    output_names: list[str] | None = None  # this server's: only these outputs (None: all)

    def _plain(self) -> bool:
        """No parameter, flag, output selection or response queue: a request the inference
        service's plain lane may take (`InferenceService.infer_plain`)."""
        return not (
            self.parameters
            or self.flags
            or self.priority
            or self.timeout
            or self.correlation_id is not None
            or self.output_names is not None
            or self.response_queue is not None
            or self.output_memory_type not in (None, "cpu")
        )

    def _core(self, rules: Mapping[str, TensorRule]) -> InferRequest:
        """The inference service's request; each tensor a view of the caller's array."""
        if self.output_memory_type not in (None, "cpu"):
            raise InvalidArgumentError("outputs are in CPU memory only (output_memory_type)")
        model = self.model
        tensors = []
        for name, value in self.inputs.items():
            rule = rules.get(name)
            datatype, array = input_array(name, value, rule.datatype if rule else None)
            tensors.append(RequestTensor(name, datatype, tuple(array.shape), array))
        parameters: dict[str, Any] = {}
        for key, value in self.parameters.items():
            if not isinstance(value, str | int | float | bool):
                raise InvalidArgumentError(
                    f"request parameter '{key}': a str, int, float or bool, got {value!r}"
                )
            parameters[key] = value
        if self.correlation_id is not None:
            parameters["sequence_id"] = self.correlation_id
        if self.flags & 1:
            parameters["sequence_start"] = True
        if self.flags & 2:
            parameters["sequence_end"] = True
        if self.priority:
            parameters["priority"] = self.priority
        if self.timeout:
            parameters["timeout"] = self.timeout
        outputs = None
        if self.output_names is not None:
            outputs = [RequestedOutput(name) for name in self.output_names]
        return InferRequest(
            model_name=model.name,
            model_version=model._version,
            id=self.request_id or "",
            inputs=tensors,
            outputs=outputs,
            parameters=parameters,
        )


@dataclass
class InferenceResponse:
    """One response (Triton's `tritonserver.InferenceResponse`): `outputs` by name, `error`
    when it failed, `final` on a request's last response."""

    model: Model
    request_id: str | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
    outputs: dict[str, Tensor] = field(default_factory=dict)
    error: TritonError | None = None
    classification_label: str | None = None
    final: bool = False

    @staticmethod
    def _made(model: Model, response: InferResponse, final: bool) -> InferenceResponse:
        types = _DATATYPES
        outputs = {t.name: Tensor(types[t.datatype], t.shape, t.data) for t in response.outputs}
        return InferenceResponse(
            model, response.id or None, dict(response.parameters), outputs, final=final
        )

    @staticmethod
    def _failed(model: Model, request: InferenceRequest, exc: BaseException) -> InferenceResponse:
        return InferenceResponse(model, request.request_id, error=triton_error(exc), final=True)


class ResponseIterator:
    """The responses of one `Model.infer` call."""

    def __init__(
        self,
        model: Model,
        responses: Iterator[InferenceResponse],
        raise_on_error: bool,
    ) -> None:
        self._model = model
        self._responses = responses  # a generator (cancel closes it), or responses made
        self._raise_on_error = raise_on_error

    def __iter__(self) -> ResponseIterator:
        return self

    def __next__(self) -> InferenceResponse:
        response = next(self._responses)
        if response.error is not None and self._raise_on_error:
            raise response.error
        return response

    def cancel(self) -> None:
        if isinstance(self._responses, Generator):  # else all made already: nothing to stop
            self._responses.close()


class AsyncResponseIterator:
    """The responses of one `Model.async_infer` call."""

    def __init__(
        self,
        model: Model,
        responses: AsyncGenerator[InferenceResponse, None],
        raise_on_error: bool,
    ) -> None:
        self._model = model
        self._responses = responses
        self._raise_on_error = raise_on_error
        self._closing: asyncio.Future[None] | None = None

    def __aiter__(self) -> AsyncResponseIterator:
        return self

    async def __anext__(self) -> InferenceResponse:
        response = await self._responses.__anext__()
        if response.error is not None and self._raise_on_error:
            raise response.error
        return response

    def cancel(self) -> None:
        self._closing = asyncio.ensure_future(self._responses.aclose())


_END = object()


class _Failed:
    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


async def _produce(running: _Running, core: InferRequest, put: Callable[[object], None]) -> None:
    """On the server's loop: the request's responses (or its error) to `put`, then _END."""
    try:
        async for response in running.appliance.inference.infer_stream(core):
            put(response)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        put(_Failed(exc))
    finally:
        put(_END)


def _stream_sync(model: Model, core: InferRequest) -> Generator[InferenceResponse, None, None]:
    """A decoupled request's responses, run on the server's loop, read on this thread; after
    the last, an empty final response (as a decoupled model's final flag comes in Triton)."""
    running = model._running()
    assert running.loop is not None
    responses: queue.SimpleQueue[object] = queue.SimpleQueue()
    future = asyncio.run_coroutine_threadsafe(_produce(running, core, responses.put), running.loop)
    try:
        while (item := responses.get()) is not _END:
            if isinstance(item, _Failed):
                yield _error_response(model, core, item.exc)
                return
            assert isinstance(item, InferResponse)
            yield InferenceResponse._made(model, item, final=False)
        yield InferenceResponse(model, core.id or None, final=True)
    finally:
        future.cancel()  # the reader went before the end: the request is cancelled


async def _stream_async(
    model: Model, request: InferenceRequest
) -> AsyncGenerator[InferenceResponse, None]:
    """A request's responses on the caller's loop; the request runs on the server's."""
    running = model._running()
    try:
        served = running.appliance.runtime.get(model.name, model._version)
        core = request._core(served.inputs)
        decoupled = served.decoupled
    except (ApplianceError, TritonError) as exc:
        yield InferenceResponse._failed(model, request, exc)
        return
    caller = asyncio.get_running_loop()
    responses: asyncio.Queue[object] = asyncio.Queue()

    def put(item: object) -> None:  # on the server's loop
        with contextlib.suppress(RuntimeError):  # the caller's loop closed
            caller.call_soon_threadsafe(responses.put_nowait, item)

    assert running.loop is not None
    future = asyncio.run_coroutine_threadsafe(_produce(running, core, put), running.loop)
    try:
        while (item := await responses.get()) is not _END:
            if isinstance(item, _Failed):
                yield _error_response(model, core, item.exc)
                return
            assert isinstance(item, InferResponse)
            yield InferenceResponse._made(model, item, final=not decoupled)
        if decoupled:
            yield InferenceResponse(model, core.id or None, final=True)
    finally:
        future.cancel()


def _error_response(model: Model, core: InferRequest, exc: BaseException) -> InferenceResponse:
    return InferenceResponse(model, core.id or None, error=triton_error(exc), final=True)


def _eager(made: list[InferenceResponse], request: InferenceRequest) -> Iterator[InferenceResponse]:
    """Responses already made: put in the request's response queue now, if it has one."""
    if request.response_queue is not None:  # now, not when the iterator is read
        for response in made:
            request.response_queue.put_nowait(response)
    return iter(made)  # nothing to cancel: no generator to make and close


def _queued(
    responses: Iterator[InferenceResponse], request: InferenceRequest
) -> Generator[InferenceResponse, None, None]:
    """The responses, each also put in the request's response queue."""
    for response in responses:
        request.response_queue.put_nowait(response)
        yield response


def _fetched(responses: Iterator[InferenceResponse]) -> Generator[InferenceResponse, None, None]:
    """The responses read to their end on a thread of their own from now on (as they come),
    whether or not the caller reads them; the iterator yields what that thread read."""
    read: queue.SimpleQueue[object] = queue.SimpleQueue()

    def fetch() -> None:
        try:
            for response in responses:
                read.put(response)
        finally:
            read.put(_END)

    threading.Thread(target=fetch, name="tritonserver-responses", daemon=True).start()
    return _drained(read)


def _drained(read: queue.SimpleQueue[object]) -> Generator[InferenceResponse, None, None]:
    while (item := read.get()) is not _END:
        assert isinstance(item, InferenceResponse)
        yield item


def _fetched_async(
    responses: AsyncIterator[InferenceResponse], target: asyncio.Queue[InferenceResponse]
) -> AsyncGenerator[InferenceResponse, None]:
    """`_fetched` for async_infer: a task on the caller's loop, started now, puts them in
    `target` as they come."""
    read: asyncio.Queue[object] = asyncio.Queue()

    async def fetch() -> None:
        try:
            async for response in responses:
                target.put_nowait(response)
                read.put_nowait(response)
        finally:
            read.put_nowait(_END)

    return _drained_async(read, asyncio.ensure_future(fetch()))


async def _drained_async(
    read: asyncio.Queue[object], task: asyncio.Future[None]
) -> AsyncGenerator[InferenceResponse, None]:
    try:
        while (item := await read.get()) is not _END:
            assert isinstance(item, InferenceResponse)
            yield item
    finally:
        await task
