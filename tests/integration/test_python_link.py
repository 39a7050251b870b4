"""A Python model's process killed mid-request under the request link (channel.Link).

The server writes the request to the model process's link and reads the answer itself: over
HTTP the event loop (the answer comes on a pipe of the loop's own, whose reader stays
registered; BLS calls go to the instance's call threads), over gRPC a thread of the
scheduler's lane, which answers the model's BLS calls inline. Killed at any point, the
request fails with a clear error, the process restarts, and the next request is served: the
model killed in its execute(), killed between requests, the callee of a BLS call killed while
the call is answered, the caller killed while its call runs. A client that goes away is seen
by the model's request.is_cancelled() on either path.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.serverproc import ServerProcess

# Input 13: writes its pid beside model.py, then holds until killed (at most 60 s); input 7:
# writes its pid and answers.
HOLD = """\
import os, time
from pathlib import Path
import triton_python_backend_utils as pb_utils

HERE = Path(__file__).parent


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            if x.flat[0] in (7, 13):
                (HERE / "pid.tmp").write_text(str(os.getpid()))
                (HERE / "pid.tmp").rename(HERE / "pid")
            if x.flat[0] == 13:
                time.sleep(60)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x * 2)]))
        return out
"""

# Calls py_hold with its input; on input 13 writes its own pid first.
BLS = """\
import os
from pathlib import Path
import triton_python_backend_utils as pb_utils

HERE = Path(__file__).parent


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            if x.as_numpy().flat[0] == 13:
                (HERE / "pid.tmp").write_text(str(os.getpid()))
                (HERE / "pid.tmp").rename(HERE / "pid")
            answer = pb_utils.InferenceRequest(
                model_name="py_hold", requested_output_names=["OUTPUT0"], inputs=[x]
            ).exec()
            if answer.has_error():
                raise pb_utils.TritonModelException("BLS failed: " + answer.error().message())
            out.append(pb_utils.InferenceResponse(
                [pb_utils.get_output_tensor_by_name(answer, "OUTPUT0")]))
        return out
"""

# Waits (at most 20 s) until its request is cancelled, and says so in the log.
WAIT_CANCEL = """\
import time
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        deadline = time.monotonic() + 20
        while not requests[0].is_cancelled() and time.monotonic() < deadline:
            time.sleep(0.01)
        if requests[0].is_cancelled():
            pb_utils.Logger.log_warn("link test: request cancelled")
        x = pb_utils.get_input_tensor_by_name(requests[0], "INPUT0").as_numpy()
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)])]
"""

CONFIG = """\
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 4 ] }} ]
"""


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Path]]:
    root = tmp_path_factory.mktemp("link")
    for name, code in (("py_hold", HOLD), ("py_bls_hold", BLS), ("py_link_cancel", WAIT_CANCEL)):
        (root / "models" / name / "1").mkdir(parents=True)
        (root / "models" / name / "1" / "model.py").write_text(code)
        (root / "models" / name / "config.pbtxt").write_text(CONFIG.format(name=name))
    with ServerProcess(root / "models", log_path=root / "server.log") as server:
        yield server, root / "models"


def _inputs(module: Any, first: float) -> list[Any]:
    tensor = module.InferInput("INPUT0", [4], "FP32")
    tensor.set_data_from_numpy(np.array([first, 1, 2, 3], dtype=np.float32))
    return [tensor]


def _pid(version: Path) -> int:
    """The pid a model wrote on input 13, once written (removed when read)."""
    deadline = time.monotonic() + 60
    while not (version / "pid").exists():
        assert time.monotonic() < deadline, f"no pid from {version}"
        time.sleep(0.02)
    pid = int((version / "pid").read_text())
    (version / "pid").unlink()
    return pid


def _in_flight(module: Any, url: str, model: str) -> tuple[threading.Thread, list[Any]]:
    """An infer of input 13 on its own thread; the list gets its error or result."""
    got: list[Any] = []

    def call() -> None:
        options = {"network_timeout": 120.0} if module is httpclient else {}
        client = module.InferenceServerClient(url, **options)
        try:
            got.append(client.infer(model, _inputs(module, 13)))
        except InferenceServerException as exc:
            got.append(exc)

    thread = threading.Thread(target=call)
    thread.start()
    return thread, got


def _works(module: Any, url: str, model: str) -> None:
    client = module.InferenceServerClient(url)
    result = client.infer(model, _inputs(module, 1))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), [2, 2, 4, 6])


@pytest.mark.parametrize("module", [httpclient, grpcclient])
def test_model_killed_in_execute(served: tuple[ServerProcess, Path], module: Any) -> None:
    server, models = served
    url = server.http_url if module is httpclient else server.grpc_url
    for _ in range(20):  # over gRPC, the lane takes it once its cost is learned (16 runs)
        _works(module, url, "py_hold")
    thread, got = _in_flight(module, url, "py_hold")
    pid = _pid(models / "py_hold" / "1")
    os.kill(pid, signal.SIGKILL)
    thread.join(60)
    (error,) = got
    assert isinstance(error, InferenceServerException)
    assert "the Python model's process exited while executing (exit code -9)" in str(error)
    assert "it was restarted" in str(error)
    _works(module, url, "py_hold")  # a fresh process
    assert server.proc.poll() is None


def test_callee_killed_during_a_bls_call(served: tuple[ServerProcess, Path]) -> None:
    server, models = served
    _works(grpcclient, server.grpc_url, "py_bls_hold")
    thread, got = _in_flight(grpcclient, server.grpc_url, "py_bls_hold")
    _pid(models / "py_bls_hold" / "1")
    os.kill(_pid(models / "py_hold" / "1"), signal.SIGKILL)
    thread.join(60)
    (error,) = got
    assert isinstance(error, InferenceServerException)
    assert "BLS failed: " in str(error)
    assert "process exited while executing" in str(error)
    _works(grpcclient, server.grpc_url, "py_bls_hold")


def test_caller_killed_while_its_bls_call_runs(served: tuple[ServerProcess, Path]) -> None:
    server, models = served
    _works(httpclient, server.http_url, "py_bls_hold")
    thread, got = _in_flight(httpclient, server.http_url, "py_bls_hold")
    caller = _pid(models / "py_bls_hold" / "1")
    callee = _pid(models / "py_hold" / "1")
    os.kill(caller, signal.SIGKILL)  # its call is being answered by the server
    os.kill(callee, signal.SIGKILL)  # ends the call; its reply finds the caller gone
    thread.join(60)
    (error,) = got
    assert isinstance(error, InferenceServerException)
    assert "the Python model's process exited while executing (exit code -9)" in str(error)
    _works(httpclient, server.http_url, "py_bls_hold")
    _works(httpclient, server.http_url, "py_hold")


def test_model_killed_between_requests(served: tuple[ServerProcess, Path]) -> None:
    """The process dies while idle (the loop sees its pipe close): the next request says the
    process exited and was restarted, the one after is served."""
    server, models = served
    client = httpclient.InferenceServerClient(server.http_url)
    client.infer("py_hold", _inputs(httpclient, 7))  # answers at once, its pid written
    os.kill(_pid(models / "py_hold" / "1"), signal.SIGKILL)
    time.sleep(0.5)  # the loop reads the end of its pipe
    with pytest.raises(InferenceServerException, match="it was restarted"):
        client.infer("py_hold", _inputs(httpclient, 1))
    _works(httpclient, server.http_url, "py_hold")
    assert server.proc.poll() is None


@pytest.mark.parametrize("module", [httpclient, grpcclient])
def test_client_gone_is_seen_by_the_model(served: tuple[ServerProcess, Path], module: Any) -> None:
    server, _ = served
    url = server.http_url if module is httpclient else server.grpc_url
    before = server.log().count("link test: request cancelled")
    started = time.monotonic()
    if module is httpclient:
        client = httpclient.InferenceServerClient(url, network_timeout=0.3)
        with pytest.raises(TimeoutError):  # the client's own (socket.timeout)
            client.infer("py_link_cancel", _inputs(httpclient, 1))
        client.close()
    else:
        with pytest.raises(InferenceServerException, match="Deadline"):
            grpcclient.InferenceServerClient(url).infer(
                "py_link_cancel", _inputs(grpcclient, 1), client_timeout=0.3
            )
    deadline = time.monotonic() + 10
    while server.log().count("link test: request cancelled") == before:
        assert time.monotonic() < deadline, "the model never saw request.is_cancelled()"
        time.sleep(0.05)
    assert time.monotonic() - started < 10  # well before the model's own 20 s limit
