"""The process that hosts one instance of a Python model.

It imports `model.py` with `triton_python_backend_utils` importable, calls `initialize(args)`,
then serves `execute` messages from the server until told to finalize. Inputs arrive in the
server's shared memory arena, outputs go back through this process's own arena; everything
else (decoupled responses, BLS, metrics, model loading) travels over the pipe as messages
(channel.py). `async def execute` runs on one asyncio loop per process, on its own thread, as
in Triton: a coroutine of a model that is not decoupled is awaited before the next request;
a decoupled model's coroutine runs in the background until its final response.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import sys
import threading
import time
import traceback
from concurrent.futures import Future
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np

from edge_backends.api import ERROR_CODES
from edge_backends.python import triton_python_backend_utils as pb_utils
from edge_backends.python.channel import Channel
from edge_backends.python.model_config import ModelConfig
from edge_backends.python.shm import Arena, Reader

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


class Runner:
    """Runs the model's execute() for one request at a time, sync or async."""

    def __init__(self, model: Any, name: str, channel: Channel, cancelled: Any) -> None:
        self._model = model
        self._name = name
        self._channel = channel
        self._cancelled = cancelled
        self._loop: asyncio.AbstractEventLoop | None = None

    def loop(self) -> asyncio.AbstractEventLoop:
        """The process's asyncio loop for coroutine models, started on first use."""
        if self._loop is None:
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="model-asyncio", daemon=True).start()
            self._loop = loop
        return self._loop

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)

    def _request(
        self, inputs: dict[str, np.ndarray[Any, Any]], outputs: list[str], deliver: Any
    ) -> pb_utils.InferenceRequest:
        request = pb_utils.InferenceRequest(
            inputs=[pb_utils.Tensor(name, array) for name, array in inputs.items()],
            requested_output_names=outputs,
        )
        request._cancel_flag = self._cancelled
        request._sender = pb_utils.InferenceResponseSender(deliver, request.is_cancelled)
        return request

    def execute(
        self, inputs: dict[str, np.ndarray[Any, Any]], outputs: list[str]
    ) -> dict[str, np.ndarray[Any, Any]]:
        """A model that answers once: from execute()'s list, or its response sender."""
        sent: list[pb_utils.InferenceResponse] = []
        finished = threading.Event()

        def deliver(response: pb_utils.InferenceResponse | None, final: bool) -> None:
            if response is not None:
                if sent:
                    raise pb_utils.TritonModelException(
                        "a model that is not decoupled sends exactly one response per request"
                    )
                sent.append(response)
            if final:
                finished.set()

        request = self._request(inputs, outputs, deliver)
        result = self._model.execute([request])
        if asyncio.iscoroutine(result):
            result = asyncio.run_coroutine_threadsafe(result, self.loop()).result()
        if result is None:  # answered through the response sender (Triton 24.06 and later)
            if not finished.wait(FINAL_RESPONSE_TIMEOUT_S) or not sent:
                raise pb_utils.TritonModelException(
                    "execute() returned None but sent no response with "
                    "TRITONSERVER_RESPONSE_COMPLETE_FINAL through the response sender"
                )
            response = sent[0]
        else:
            if not isinstance(result, list):
                raise pb_utils.TritonModelException(
                    f"Expected a list in the execute return, found type '{type(result)}'."
                )
            if len(result) != 1:
                raise pb_utils.TritonModelException(
                    "Number of InferenceResponse objects do not match the number of "
                    "InferenceRequest objects. InferenceRequest(s) size is:1, and "
                    f"InferenceResponse(s) size is:{len(result)}"
                )
            response = result[0]
            if not isinstance(response, pb_utils.InferenceResponse):
                raise pb_utils.TritonModelException(
                    "Expected an 'InferenceResponse' object in the execute function return "
                    f"list, found type '{type(response)}'."
                )
        error = response.error()
        if error is not None:
            raise Reported(error)
        return _outputs(response)

    def execute_decoupled(
        self, inputs: dict[str, np.ndarray[Any, Any]], outputs: list[str]
    ) -> None:
        """A decoupled model: responses go to the server as they are sent; returns once the
        final flag is sent (execute() may have returned long before)."""
        finished = threading.Event()
        failure: list[pb_utils.TritonError] = []

        def deliver(response: pb_utils.InferenceResponse | None, final: bool) -> None:
            if failure:
                return  # the request already failed: nothing more reaches the client
            if response is not None:
                error = response.error()
                if error is not None:
                    failure.append(error)
                    finished.set()
                    return
                self._channel.send("response", _outputs(response))
            if final:
                finished.set()

        request = self._request(inputs, outputs, deliver)
        result = self._model.execute([request])
        background: Future[Any] | None = None
        if asyncio.iscoroutine(result):
            background = asyncio.run_coroutine_threadsafe(result, self.loop())
        elif result is not None:
            raise pb_utils.TritonModelException(self._must_return_none())
        deadline = time.monotonic() + FINAL_RESPONSE_TIMEOUT_S
        while not finished.wait(_POLL_S):
            if background is not None and background.done():
                if background.exception() is not None:
                    raise background.exception()  # type: ignore[misc]  # checked not None
                if background.result() is not None:
                    raise pb_utils.TritonModelException(self._must_return_none())
                background = None  # a thread it started may still send the final flag
            if time.monotonic() > deadline:
                raise pb_utils.TritonModelException(
                    "no response with TRITONSERVER_RESPONSE_COMPLETE_FINAL within "
                    f"{FINAL_RESPONSE_TIMEOUT_S:.0f} s"
                )
        if failure:
            raise Reported(failure[0])

    def _must_return_none(self) -> str:
        return (
            f"Python model '{self._name}' is using the decoupled mode and the execute "
            "function must return None."
        )


def main(
    connection: Connection, model_file: str, args: dict[str, str], name: str, cancelled: Any
) -> None:
    """Entry point of the worker process."""
    logging.basicConfig(
        level=logging.INFO, format=f"%(levelname)s python model '{name}': %(message)s"
    )
    channel = Channel(connection)
    pb_utils._install(channel, str(Path(model_file).parent))
    try:
        model = _load_model(Path(model_file))
        if hasattr(model, "initialize"):
            model.initialize(args)
    except BaseException as exc:  # report any failure of user code to the server
        channel.send("error", f"{type(exc).__name__}: {exc}")
        return
    channel.send("ready", None)
    runner = Runner(model, name, channel, cancelled)
    arena = Arena("out")
    reader = Reader()
    try:
        while True:
            message = channel.commands.get()
            if message is None:
                return  # the server is gone (killed or restarted): nothing to answer
            if message[0] == "finalize":
                break
            _, in_arena, metas, outputs, decoupled = message
            try:
                inputs = reader.read(in_arena, metas, copy=False)
                if decoupled:
                    runner.execute_decoupled(inputs, outputs)
                    channel.send("done", None)
                    continue
                produced = runner.execute(inputs, outputs)
                out_metas = arena.write(produced)
                channel.send("result", arena.name, out_metas)
            except Reported as exc:
                channel.send("failed", str(exc), exc.code)
            except BaseException as exc:  # user code: report, keep serving
                detail = traceback.format_exc(limit=3)
                logging.getLogger("python_model").error("execute failed: %s", detail)
                channel.send("failed", f"{type(exc).__name__}: {exc}")
        runner.stop()
        if hasattr(model, "finalize"):
            model.finalize()
    finally:
        reader.close()
        arena.close()


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
