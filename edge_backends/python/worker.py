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
            try:
                message = connection.recv()
            except (EOFError, OSError):
                return  # the server is gone (killed or restarted): nothing to answer
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


class AutoCompleteConfig:
    """The object Triton hands to `TritonPythonModel.auto_complete_config`."""

    def __init__(self, config: dict[str, Any]) -> None:
        self._config = config

    def as_dict(self) -> dict[str, Any]:
        return self._config

    def _add(self, kind: str, tensor: dict[str, Any]) -> None:
        entries = self._config.setdefault(kind, [])
        existing = next((e for e in entries if e.get("name") == tensor.get("name")), None)
        if existing is None:
            entries.append(dict(tensor))
        else:
            for key, value in tensor.items():
                existing.setdefault(key, value)

    def add_input(self, tensor: dict[str, Any]) -> None:
        self._add("input", tensor)

    def add_output(self, tensor: dict[str, Any]) -> None:
        self._add("output", tensor)

    def set_max_batch_size(self, size: int) -> None:
        self._config["max_batch_size"] = int(size)

    def set_dynamic_batching(self) -> None:
        self._config.setdefault("dynamic_batching", {})

    def set_model_transaction_policy(self, policy: dict[str, Any]) -> None:
        self._config["model_transaction_policy"] = dict(policy)


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
        result = hook(AutoCompleteConfig(config)).as_dict() if hook else config
        connection.send(("ok", result))
    except BaseException as exc:  # user code
        connection.send(("error", f"{type(exc).__name__}: {exc}"))
