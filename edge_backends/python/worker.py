"""The process that hosts one instance of a Python model.

It imports `model.py` with `triton_python_backend_utils` importable, calls `initialize(args)`,
then its main thread serves `execute` messages from the server's link until told to finalize.
Inputs arrive in the server's shared memory arena, outputs go back through this process's own
arena; the main thread's BLS and metric calls during execute() go over the link, everything
else (decoupled responses, other threads' calls, model loading) over the pipe (channel.py).
`async def execute` runs on one asyncio loop per process, on its own thread, as in Triton: a
coroutine of a model that is not decoupled is awaited before the next request; a decoupled
model's coroutine runs in the background until its final response. A decoupled
request is handed back to the server once execute() returns ("returned"); its responses,
final flag or failure follow tagged with it, from whichever thread sends them.
"""

from __future__ import annotations

import importlib.util
import logging
import sys
import threading
import traceback
from collections.abc import Coroutine
from concurrent.futures import Future
from multiprocessing.connection import Connection
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import numpy as np

from edge_backends.api import ERROR_CODES, RequestInfo
from edge_backends.python import pb_logging
from edge_backends.python import triton_python_backend_utils as pb_utils
from edge_backends.python.channel import Channel, Link
from edge_backends.python.model_config import ModelConfig
from edge_backends.python.shm import Arena, Reader, pack

if TYPE_CHECKING:
    import asyncio  # imported on a coroutine's first use: 6 MiB a synchronous model skips

# How long a request may wait for its final response after execute() returned.
FINAL_RESPONSE_TIMEOUT_S = 300.0
_POLL_S = 0.05


class Reported(Exception):
    """A failure whose message goes to the client as it is (a model's TritonError), with the
    error's code by name (the server maps it to the client's status as Triton does)."""

    def __init__(self, error: pb_utils.TritonError) -> None:
        super().__init__(error.message())
        self.code = _CODE_NAMES.get(error.code(), "INTERNAL")


_CODE_NAMES = {getattr(pb_utils.TritonError, name): name for name in ERROR_CODES}


def _load_model(model_file: Path) -> Any:
    sys.path.insert(0, str(model_file.parent))  # the folder's own helper modules import
    spec = importlib.util.spec_from_file_location("model", model_file)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {model_file}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.TritonPythonModel()


def _outputs(response: pb_utils.InferenceResponse) -> dict[str, np.ndarray[Any, Any]]:
    return {t.name(): np.asarray(t.as_numpy()) for t in response.output_tensors()}


class _Flag:
    """A decoupled request's own cancel flag (request.is_cancelled() reads `value`)."""

    value = 0


def _split(
    inputs: dict[str, np.ndarray[Any, Any]], infos: list[RequestInfo]
) -> list[dict[str, np.ndarray[Any, Any]]]:
    """Each request's rows of a batch's inputs (a ragged input's elements, in its shape)."""
    if len(infos) <= 1:
        return [inputs]
    cuts = np.cumsum([info.batch_size for info in infos])[:-1]
    parts: list[dict[str, np.ndarray[Any, Any]]] = [{} for _ in infos]
    ragged = infos[0].ragged_shapes
    for name, array in inputs.items():
        if name in ragged:
            taken = 0
            for part, info in zip(parts, infos, strict=True):
                shape = info.ragged_shapes[name]
                count = int(np.prod(shape, dtype=np.int64))
                part[name] = array[taken : taken + count].reshape(shape)
                taken += count
            continue
        for part, rows in zip(parts, np.split(array, cuts), strict=True):
            part[name] = rows
    return parts


class _Answers:
    """What a model that is not decoupled sends through its requests' response senders (from
    any thread), and the wait for their final flags (made at once, used when asked for)."""

    __slots__ = ("_answered", "_finished", "_sent")

    def __init__(self, count: int, answered: threading.Condition) -> None:
        self._sent: list[pb_utils.InferenceResponse | None] = [None] * count
        self._finished = [False] * count  # set under `answered` (a sender on any thread)
        self._answered = answered

    def deliver(self, index: int, response: pb_utils.InferenceResponse | None, final: bool) -> None:
        if response is not None:
            if self._sent[index] is not None:
                raise pb_utils.TritonModelException(
                    "a model that is not decoupled sends exactly one response per request"
                )
            self._sent[index] = response
        if final:
            with self._answered:
                self._finished[index] = True
                self._answered.notify_all()

    def wait(self) -> list[pb_utils.InferenceResponse]:
        """execute() returned None: each request's response, once every final flag came."""
        finished = self._finished
        with self._answered:
            self._answered.wait_for(lambda: all(finished), FINAL_RESPONSE_TIMEOUT_S)
        responses = []
        for done, response in zip(finished, self._sent, strict=True):
            if not done or response is None:
                raise pb_utils.TritonModelException(
                    "execute() returned None but sent no response with "
                    "TRITONSERVER_RESPONSE_COMPLETE_FINAL through the response sender"
                )
            responses.append(response)
        return responses


class _Stream:
    """A decoupled request's way back after execute() returned: its final flag or its
    failure is sent once; a model that never sends the final flag fails it in time."""

    def __init__(self, channel: Channel, tag: int, ended: Any) -> None:
        self._channel = channel
        self._tag = tag
        self._lock = threading.Lock()
        self._ended = ended  # called once the request is over
        self.over = False
        self._timer = threading.Timer(FINAL_RESPONSE_TIMEOUT_S, self._late)
        self._timer.daemon = True
        self._timer.start()

    def _end(self) -> bool:
        with self._lock:
            if self.over:
                return False
            self.over = True
        self._timer.cancel()
        self._ended()
        return True

    def done(self) -> None:
        if self._end():
            self._channel.send("stream_done", self._tag)

    def fail(self, message: str, code: str | None = None) -> None:
        if self._end():
            self._channel.send("stream_failed", self._tag, message, code)

    def drop(self) -> None:
        """execute() raised: its failure answers the request."""
        self._end()

    def _late(self) -> None:
        self.fail(
            "no response with TRITONSERVER_RESPONSE_COMPLETE_FINAL within "
            f"{FINAL_RESPONSE_TIMEOUT_S:.0f} s"
        )


class Runner:
    """Runs the model's execute() for one request at a time, sync or async."""

    def __init__(self, model: Any, name: str, channel: Channel, cancelled: Any) -> None:
        self._model = model
        self._name = name
        self._channel = channel
        self._cancelled = cancelled
        self._loop: asyncio.AbstractEventLoop | None = None
        self._flags: dict[int, _Flag] = {}  # decoupled requests going on, by tag
        # Wakes execute() waiting for the final flags of responses sent from other threads
        # (one for the runner: a request's own would cost an Event each).
        self._answered = threading.Condition()

    def loop(self) -> asyncio.AbstractEventLoop:
        """The process's asyncio loop for coroutine models, started on first use."""
        if self._loop is None:
            import asyncio

            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="model-asyncio", daemon=True).start()
            self._loop = loop
        return self._loop

    def _run(self, coroutine: Coroutine[Any, Any, Any]) -> Future[Any]:
        """Run a coroutine on the process's asyncio loop."""
        import asyncio

        return asyncio.run_coroutine_threadsafe(coroutine, self.loop())

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)

    def cancel(self, tag: int) -> None:
        """The client of decoupled request `tag` went away (from the channel's reader)."""
        flag = self._flags.get(tag)
        if flag is not None:
            flag.value = 1

    def execute(
        self,
        inputs: dict[str, np.ndarray[Any, Any]],
        outputs: list[str],
        fields: list[tuple[Any, ...]],
    ) -> list[pb_utils.InferenceResponse]:
        """A model that answers once per request: from execute()'s list, or its response
        senders. The requests of a batch (`fields`: each one's RequestInfo fields, as the link
        carries them) come as a list, each with its rows; each response (its outputs, or its
        error) goes back on its own."""
        if not fields:
            fields = [("", 0, 0, None, 0, tuple(outputs))]
        if len(fields) == 1:
            parts = [inputs]
        else:
            parts = _split(inputs, [RequestInfo(*each) for each in fields])
        answers = _Answers(len(fields), self._answered)
        cancelled = self._cancelled
        requests = [
            pb_utils.InferenceRequest._received(
                each,
                [pb_utils._input(name, array) for name, array in part.items()],
                outputs,
                cancelled,
                answers,
                index,
            )
            for index, (part, each) in enumerate(zip(parts, fields, strict=True))
        ]
        result = self._model.execute(requests)
        if type(result) is not list:
            if isinstance(result, Coroutine):
                result = self._run(result).result()
            if result is None:  # answered through the response sender (Triton 24.06 and later)
                return answers.wait()
            if not isinstance(result, list):
                raise pb_utils.TritonModelException(
                    f"Expected a list in the execute return, found type '{type(result)}'."
                )
        if len(result) != len(requests):
            raise pb_utils.TritonModelException(
                "Number of InferenceResponse objects do not match the number of "
                f"InferenceRequest objects. InferenceRequest(s) size is:{len(requests)}, "
                f"and InferenceResponse(s) size is:{len(result)}"
            )
        return result

    def execute_decoupled(
        self,
        inputs: dict[str, np.ndarray[Any, Any]],
        outputs: list[str],
        info: RequestInfo,
        tag: int,
    ) -> None:
        """A decoupled model: responses go to the server as they are sent, tagged; returns
        once execute() returned ("returned"), the request going on until its final flag."""
        flag = _Flag()
        self._flags[tag] = flag
        stream = _Stream(self._channel, tag, lambda: self._flags.pop(tag, None))

        def deliver(index: int, response: pb_utils.InferenceResponse | None, final: bool) -> None:
            if stream.over:
                return  # the request already failed: nothing more reaches the client
            if response is not None:
                error = response.error()
                if error is not None:
                    failure = Reported(error)
                    stream.fail(str(failure), failure.code)
                    return
                self._channel.send("stream_response", tag, pack(_outputs(response)))
            if final:
                stream.done()

        fields = (info.request_id, info.correlation_id, info.flags, info.parameters,
                  info.timeout_us, info.output_names)  # fmt: skip
        tensors = [pb_utils._input(name, array) for name, array in inputs.items()]
        request = pb_utils.InferenceRequest._received(
            fields, tensors, outputs, flag, SimpleNamespace(deliver=deliver), 0
        )
        try:
            result = self._model.execute([request])
            if isinstance(result, Coroutine):
                background = self._run(result)
                background.add_done_callback(lambda done: self._background_done(done, stream))
            elif result is not None:
                raise pb_utils.TritonModelException(self._must_return_none())
        except BaseException:
            stream.drop()
            raise
        self._channel.finish("returned", tag)

    def _background_done(self, done: Future[Any], stream: _Stream) -> None:
        """A decoupled model's coroutine ended: a failure, or a value, fails its request."""
        if done.cancelled():
            stream.fail("the model's coroutine was cancelled")
        elif done.exception() is not None:
            error = done.exception()
            if isinstance(error, Reported):
                stream.fail(str(error), error.code)
            else:
                stream.fail(f"{type(error).__name__}: {error}")
        elif done.result() is not None:
            stream.fail(self._must_return_none())

    def answer_is_ready(self, call_id: int) -> None:
        """The server asks the model's is_ready() (from the channel's reader): it runs on a
        thread of its own, so a slow one holds neither the reader nor execute(); the server
        stops waiting at its timeout and counts the model not ready."""

        def ask() -> None:
            try:
                result = self._model.is_ready()
                if isinstance(result, Coroutine):
                    result = self._run(result).result()
                if not isinstance(result, bool):
                    raise TypeError(
                        f"is_ready() must return a boolean value, got {type(result).__name__}"
                    )
                self._channel.send("readiness", call_id, result, None)
            except BaseException as exc:  # user code: not ready, and why
                self._channel.send("readiness", call_id, False, f"{type(exc).__name__}: {exc}")

        threading.Thread(target=ask, name="model-is-ready", daemon=True).start()

    def _must_return_none(self) -> str:
        return (
            f"Python model '{self._name}' is using the decoupled mode and the execute "
            "function must return None."
        )


def main(
    connection: Connection,
    link_ends: tuple[Connection, Connection, Connection],
    model_file: str,
    args: dict[str, str],
    name: str,
    cancelled: Any,
) -> None:
    """Entry point of the worker process."""
    # Requests in; answers out to the server's waiting thread, or to its event loop.
    link = Link(*link_ends)
    channel = Channel(connection, link)
    pb_logging.forward_to(channel)  # the server logs them, in its own format
    pb_utils._install(channel, str(Path(model_file).parent))
    try:
        model = _load_model(Path(model_file))
        if hasattr(model, "initialize"):
            model.initialize(args)
    except BaseException as exc:  # report any failure of user code to the server
        channel.send("error", f"{type(exc).__name__}: {exc}")
        return
    runner = Runner(model, name, channel, cancelled)
    channel.on_cancel = runner.cancel
    channel.on_is_ready = runner.answer_is_ready
    # Whether the model has is_ready(): without one the server asks nothing (Triton's rule).
    channel.send("ready", hasattr(model, "is_ready"))
    serving = Serving(runner, channel, link)
    try:
        while True:
            try:
                message = link.recv()
            except (EOFError, OSError):
                return  # the server is gone (killed or restarted): nothing to answer
            if message[0] == "finalize":
                break
            serving.serve(message)
        runner.stop()
        if hasattr(model, "finalize"):
            model.finalize()
    finally:
        serving.close()


class Serving:
    """The main thread's side of the link: one execute message in, its answer out."""

    def __init__(self, runner: Runner, channel: Channel, link: Link) -> None:
        self._runner = runner
        self._channel = channel
        self._link = link
        link.memo = ("execute",)  # `serve` only reads the messages it is given
        self._arena = Arena("out")
        self._reader = Reader()
        self._ident = threading.get_ident()  # the main thread's, which serves
        # The last answer written, by its metas (the arena gives the same list for a layout
        # it wrote before): a request like the last one is answered with the same bytes.
        self._sent_metas: list[Any] | None = None
        self._sent_frame = b""

    def serve(self, message: tuple[Any, ...]) -> None:
        """Run one ("execute", ...) message and answer it on the link."""
        channel = self._channel
        _, in_arena, metas, outputs, tag, fields, on_loop = message
        self._link.route(1 if on_loop else 0)
        channel.link_owner = self._ident
        try:
            inputs = self._reader.read(in_arena, metas, copy=False)
            if tag is not None:  # decoupled
                # The server's arena is reused by the next request: keep this one's.
                inputs = {k: np.array(v, copy=True) for k, v in inputs.items()}
                self._runner.execute_decoupled(inputs, outputs, RequestInfo(*fields[0]), tag)
                return
            merged: dict[str, np.ndarray[Any, Any]] = {}
            errors = []
            for index, response in enumerate(self._runner.execute(inputs, outputs, fields)):
                if type(response) is not pb_utils.InferenceResponse and not isinstance(
                    response, pb_utils.InferenceResponse
                ):
                    raise pb_utils.TritonModelException(
                        "Expected an 'InferenceResponse' object in the execute function "
                        f"return list, found type '{type(response)}'."
                    )
                error = response.error()
                if error is not None:
                    failure = Reported(error)
                    errors.append((index, str(failure), failure.code))
                    continue
                for tensor in response.output_tensors():
                    if type(tensor) is pb_utils.Tensor:
                        merged[f"{index}:{tensor._name}"] = tensor._array
                    else:
                        merged[f"{index}:{tensor.name()}"] = np.asarray(tensor.as_numpy())
            arena = self._arena
            out_metas = arena.write(merged)
            if out_metas is self._sent_metas and not errors:
                channel.finish_frame(self._sent_frame)  # the answer of the last request
                return
            frame = Link.frame("result", arena.name, out_metas, errors)
            channel.finish_frame(frame)
            if not errors:
                self._sent_metas, self._sent_frame = out_metas, frame
        except Reported as exc:
            channel.finish("failed", str(exc), exc.code)
        except BaseException as exc:  # user code: report, keep serving
            detail = traceback.format_exc(limit=3)
            logging.getLogger("python_model").error("execute failed: %s", detail)
            channel.finish("failed", f"{type(exc).__name__}: {exc}")

    def close(self) -> None:
        self._reader.close()
        self._arena.close()


def auto_complete(connection: Connection, model_file: str, config: dict[str, Any]) -> None:
    """Process entry: run the model's auto_complete_config and send back the config."""
    pb_utils._install()
    try:
        sys.path.insert(0, str(Path(model_file).parent))
        spec = importlib.util.spec_from_file_location("model", model_file)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot import {model_file}")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        hook = getattr(module.TritonPythonModel, "auto_complete_config", None)
        result = hook(ModelConfig(config)).as_dict() if hook else config
        connection.send(("ok", result))
    except BaseException as exc:  # user code
        connection.send(("error", f"{type(exc).__name__}: {exc}"))
