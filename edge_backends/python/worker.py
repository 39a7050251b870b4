"""The process that hosts one instance of a Python model.

It imports `model.py` with `triton_python_backend_utils` importable, calls `initialize(args)`,
then serves `execute` messages from the server until told to finalize. Inputs arrive in the
server's shared memory arena, outputs go back through this process's own arena.
"""

from __future__ import annotations

import importlib.util
import logging
import sys
import threading
import traceback
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np

from edge_backends.python import triton_python_backend_utils as pb_utils
from edge_backends.python.shm import Arena, Reader

_connection: Connection | None = None  # for BLS calls made from execute()
_cancelled: Any = None  # a shared byte the server sets when the callers went away
DECOUPLED_FINAL_TIMEOUT_S = 300.0


def bls_call(request: pb_utils.InferenceRequest) -> pb_utils.InferenceResponse:
    """Send a model's InferenceRequest to the server and wait for the answer."""
    assert _connection is not None
    inputs = {t.name(): np.asarray(t.as_numpy()) for t in request.inputs()}
    _connection.send(
        (
            "bls",
            request._model_name,
            request._model_version,
            inputs,
            request.requested_output_names(),
        )
    )
    kind, payload = _connection.recv()
    if kind == "bls_error":
        return pb_utils.InferenceResponse(error=pb_utils.TritonError(str(payload)))
    return pb_utils.InferenceResponse(
        output_tensors=[pb_utils.Tensor(name, array) for name, array in payload.items()]
    )


def _load_model(model_file: Path) -> Any:
    sys.path.insert(0, str(model_file.parent))  # the folder's own helper modules import
    spec = importlib.util.spec_from_file_location("model", model_file)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {model_file}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.TritonPythonModel()


class ResponseSender:
    """Decoupled responses go to the server as they are sent (pickled: they are small)."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        self.finished = threading.Event()

    def send(self, response: pb_utils.InferenceResponse | None = None, flags: int = 0) -> None:
        if self.finished.is_set():
            raise pb_utils.TritonModelException("the final response was already sent")
        if response is not None:
            error = response.error()
            if error is not None:
                self._connection.send(("failed", error.message()))
                self.finished.set()
                return
            outputs = {t.name(): np.asarray(t.as_numpy()) for t in response.output_tensors()}
            self._connection.send(("response", outputs))
        if flags & pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL:
            self._connection.send(("done", None))
            self.finished.set()


def _execute_decoupled(
    model: Any, inputs: dict[str, np.ndarray], outputs: list[str], connection: Connection
) -> None:
    request = _request(inputs, outputs)
    sender = ResponseSender(connection)
    request._sender = sender
    model.execute([request])
    if not sender.finished.wait(DECOUPLED_FINAL_TIMEOUT_S):
        raise RuntimeError(
            f"no response with TRITONSERVER_RESPONSE_COMPLETE_FINAL within "
            f"{DECOUPLED_FINAL_TIMEOUT_S:.0f} s"
        )


def _request(inputs: dict[str, np.ndarray], outputs: list[str]) -> pb_utils.InferenceRequest:
    request = pb_utils.InferenceRequest(
        inputs=[pb_utils.Tensor(name, array) for name, array in inputs.items()],
        requested_output_names=outputs,
    )
    if _cancelled is not None:
        request._cancel_flag = _cancelled
    return request


def _execute(model: Any, inputs: dict[str, np.ndarray], outputs: list[str]) -> dict[str, Any]:
    request = _request(inputs, outputs)
    responses = model.execute([request])
    if not responses or len(responses) != 1:
        raise RuntimeError(f"execute() returned {len(responses or [])} responses for 1 request")
    response = responses[0]
    error = response.error()
    if error is not None:
        raise RuntimeError(error.message())
    return {t.name(): np.asarray(t.as_numpy()) for t in response.output_tensors()}


def main(
    connection: Connection, model_file: str, args: dict[str, str], name: str, cancelled: Any
) -> None:
    """Entry point of the worker process."""
    global _connection, _cancelled
    _connection = connection
    _cancelled = cancelled
    logging.basicConfig(
        level=logging.INFO, format=f"%(levelname)s python model '{name}': %(message)s"
    )
    pb_utils._install()
    try:
        model = _load_model(Path(model_file))
        if hasattr(model, "initialize"):
            model.initialize(args)
    except BaseException as exc:  # report any failure of user code to the server
        connection.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    connection.send(("ready", None))
    arena = Arena("out")
    reader = Reader()
    try:
        while True:
            message = connection.recv()
            if message[0] == "finalize":
                break
            _, in_arena, metas, outputs, decoupled = message
            try:
                inputs = reader.read(in_arena, metas, copy=False)
                if decoupled:
                    _execute_decoupled(model, inputs, outputs, connection)
                    continue
                produced = _execute(model, inputs, outputs)
                out_metas = arena.write(produced)
                connection.send(("result", arena.name, out_metas))
            except BaseException as exc:  # user code: report, keep serving
                detail = traceback.format_exc(limit=3)
                logging.getLogger("python_model").error("execute failed: %s", detail)
                connection.send(("failed", f"{type(exc).__name__}: {exc}"))
        if hasattr(model, "finalize"):
            model.finalize()
    finally:
        reader.close()
        arena.close()
