"""The server's entry for models that call other models (BLS) or load and unload them.

Backends call it from their own threads (a Python model's instance thread, its call pool);
each call is a request made inside the server and blocks the calling thread until it is
answered: a model `infer` calls runs on that thread when its scheduler's thread lane takes it
(an idle instance, nothing queued: `InferenceService.infer_arrays_here`), everything else on
the event loop. Never call it from the event loop.
"""

from __future__ import annotations

import asyncio
import queue
from collections.abc import Coroutine, Mapping
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from appliance.common.errors import Unsupported
from edge_backends.api import Emit, HostRequest, InferenceHost, Outputs

if TYPE_CHECKING:
    from appliance.services.inference import InferenceService

T = TypeVar("T")
_END = object()
# Responses of a BLS stream (a model calling a decoupled model) handed to the calling thread
# and not yet passed on: the stream is read no further until it takes one.
STREAM_WINDOW = 16


class ModelControl(Protocol):
    """What the model loading API needs of the control service."""

    async def load_model(self, name: str, parameters: dict[str, Any]) -> None: ...

    async def unload_model(self, name: str, unload_dependents: bool = False) -> None: ...

    def model_ready(self, name: str, version: str = "") -> bool: ...


class BlockingHost(InferenceHost):
    """`InferenceHost` over the inference service (and the control service, for loading)."""

    def __init__(
        self,
        service: InferenceService,
        loop: asyncio.AbstractEventLoop,
        control: ModelControl | None = None,
    ) -> None:
        self._service = service
        self._loop = loop
        self._control = control

    def _run(self, work: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(work, self._loop).result()

    def infer(self, request: HostRequest) -> Outputs:
        """On this thread when the model's thread lane takes it (an idle instance, nothing
        queued), else on the loop."""
        service = self._service
        arguments = _arguments(request)
        outcome = service.infer_arrays_here(self._loop, *arguments)
        if outcome is None:  # to load on demand first
            return self._run(service.infer_arrays(*arguments))
        if isinstance(outcome, dict):
            return outcome
        return self._run(service.infer_prepared(outcome)).arrays()

    def infer_stream(self, request: HostRequest, emit: Emit) -> None:
        """The responses are handed over to this thread, so `emit` never runs on the loop;
        if `emit` raises, the request is cancelled and the exception raised here."""
        responses: queue.SimpleQueue[Any] = queue.SimpleQueue()
        # At most STREAM_WINDOW responses wait for this thread: while `emit` is held (the
        # calling model reads slowly), the stream is not read further, the called model is
        # held in turn, and a stream nobody reads is cancelled as a client's would be.
        room = asyncio.Semaphore(STREAM_WINDOW)

        async def consume() -> None:
            try:
                async for outputs in self._service.stream_arrays(*_arguments(request)):
                    await room.acquire()
                    responses.put(outputs)
            finally:
                responses.put(_END)

        future = asyncio.run_coroutine_threadsafe(consume(), self._loop)
        try:
            while (item := responses.get()) is not _END:
                self._loop.call_soon_threadsafe(room.release)
                emit(item)
        except BaseException:
            future.cancel()
            raise
        future.result()  # the request's error, if any

    def _controller(self) -> ModelControl:
        if self._control is None:
            raise Unsupported("this server offers models no model loading API")
        return self._control

    def load_model(
        self, name: str, config: str = "", files: Mapping[str, bytes] | None = None
    ) -> None:
        parameters: dict[str, Any] = dict(files or {})
        if config:
            parameters["config"] = config
        self._run(self._controller().load_model(name, parameters))

    def unload_model(self, name: str, unload_dependents: bool = False) -> None:
        self._run(self._controller().unload_model(name, unload_dependents))

    def is_model_ready(self, name: str, version: str = "") -> bool:
        control = self._controller()

        async def ready() -> bool:
            return control.model_ready(name, version)

        return self._run(ready())


def _arguments(
    request: HostRequest,
) -> tuple[str, str, dict[str, Any], list[str], dict[str, Any], str]:
    """A backend's request as the inference service's `*_arrays` calls take it."""
    return (
        request.model_name,
        request.model_version,
        dict(request.inputs),
        list(request.output_names),
        dict(request.parameters),
        request.request_id,
    )
