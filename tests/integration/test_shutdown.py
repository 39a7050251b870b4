"""Shutdown of the real server process: one deadline (--exit-timeout-secs) over HTTP, gRPC and
every model version, what is left cancelled and named in the log, a second SIGTERM exits at
once, and no model process outlives the server."""

from __future__ import annotations

import functools
import signal
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.serverproc import ServerProcess

EXIT_TIMEOUT_S = 4.0
TAG_VAR = "EDGE_SHUTDOWN_TEST"  # in the server's environment, inherited by its children
STUCK = ("stuck_a", "stuck_b", "stuck_c")

# execute() never returns: only the server's shutdown can end it.
STUCK_MODEL = """\
import os
import threading
from pathlib import Path


class TritonPythonModel:
    def initialize(self, args):
        self.started = Path(args["model_repository"]) / f"started-{os.getpid()}"

    def execute(self, requests):
        self.started.touch()
        threading.Event().wait()
"""

# One execution takes 1.5 s: it finishes during a drain.
SLOW_MODEL = """\
import os
import time
from pathlib import Path

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.started = Path(args["model_repository"]) / f"started-{os.getpid()}"

    def execute(self, requests):
        self.started.touch()
        time.sleep(1.5)
        inputs = [pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() for r in requests]
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]) for x in inputs]
"""

CONFIG = """\
name: "{name}"
backend: "python"
max_batch_size: 4
input [ {{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 4 ] }} ]
instance_group [ {{ kind: KIND_CPU, count: {count} }} ]
"""


def _model(root: Path, name: str, source: str, count: int = 1) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "1" / "model.py").write_text(source)
    (root / name / "config.pbtxt").write_text(CONFIG.format(name=name, count=count))


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    """A fresh repository per test: the models leave `started-*` marks in their folders."""
    root = tmp_path / "models"
    for name in STUCK:
        _model(root, name, STUCK_MODEL)
    _model(root, "slow", SLOW_MODEL, count=2)
    return root


def _wait_for(what: str, check: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"not within {timeout_s} s: {what}")
        time.sleep(0.02)


def _started(repository: Path, name: str) -> int:
    return len(list((repository / name).glob("started-*")))


def _executing(repository: Path, name: str) -> bool:
    return _started(repository, name) == 1


def _tagged(tag: str) -> list[int]:
    """Processes alive (not zombies) whose environment carries the test's tag: the server and
    everything it started, even the ones that lost their parent."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if f"{TAG_VAR}={tag}".encode() in environ.split(b"\0") and state != "Z":
            found.append(int(entry.name))
    return found


def _assert_nothing_left(tag: str) -> None:
    """No process the server started is left (the resource tracker ends a moment after the
    server, when its pipe closes)."""
    _wait_for(f"no process left of the server: {_tagged(tag)}", lambda: not _tagged(tag), 5)


def _request(module, url: str, model: str, results: list[object]) -> threading.Thread:  # type: ignore[no-untyped-def]
    def run() -> None:
        client = module.InferenceServerClient(url)
        inp = module.InferInput("INPUT0", [1, 4], "FP32")
        inp.set_data_from_numpy(np.arange(4, dtype=np.float32).reshape(1, 4))
        try:
            results.append(client.infer(model, [inp]).as_numpy("OUTPUT0"))
        except Exception as exc:
            results.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.fixture
def tag() -> str:
    return uuid.uuid4().hex


@pytest.fixture
def serve(
    start_server: Callable[..., ServerProcess], repository: Path, tag: str
) -> Callable[[float], ServerProcess]:
    """Start a server on the repository with an exit timeout, tagged for _tagged()."""

    def start(exit_timeout_s: float) -> ServerProcess:
        flag = f"--exit-timeout-secs={exit_timeout_s:g}"
        proc = start_server(repository, flag, env={TAG_VAR: tag})
        assert proc.proc.pid in _tagged(tag)
        return proc

    return start


@pytest.fixture
def stuck_server(
    serve: Callable[[float], ServerProcess], repository: Path
) -> tuple[ServerProcess, list[object], list[threading.Thread]]:
    """A server whose three stuck models each hold one request (two over HTTP, one gRPC)."""
    proc = serve(EXIT_TIMEOUT_S)
    results: list[object] = []
    threads = [
        _request(httpclient, proc.http_url, "stuck_a", results),
        _request(httpclient, proc.http_url, "stuck_b", results),
        _request(grpcclient, proc.grpc_url, "stuck_c", results),
    ]
    for name in STUCK:
        _wait_for(f"{name} executing", functools.partial(_executing, repository, name))
    return proc, results, threads


def _sigterm_and_wait(proc: ServerProcess, timeout_s: float = 60) -> tuple[int, float]:
    """Send SIGTERM; the exit code and the seconds until the process ended."""
    started = time.monotonic()
    proc.proc.send_signal(signal.SIGTERM)
    code = proc.proc.wait(timeout_s)
    return code, time.monotonic() - started


def test_sigterm_with_stuck_models_exits_at_the_deadline_naming_what_was_cancelled(
    stuck_server: tuple[ServerProcess, list[object], list[threading.Thread]], tag: str
) -> None:
    proc, results, threads = stuck_server
    code, took = _sigterm_and_wait(proc)
    print(f"SIGTERM with 3 stuck models: exited {code} after {took:.2f} s")  # noqa: T201
    assert took <= EXIT_TIMEOUT_S + 2, (took, proc.log())
    assert took >= EXIT_TIMEOUT_S - 0.5, (took, proc.log())  # the deadline was waited for
    _assert_nothing_left(tag)
    log = proc.log()
    assert code == 0, log
    for name in STUCK:
        assert f"model '{name}' version 1: 1 request(s) cancelled" in log, log
    assert "cancelled work left at the 4 s deadline in 3 place(s)" in log, log
    assert "Traceback" not in log, log
    for thread in threads:
        thread.join(10)
    assert len(results) == 3
    for outcome in results:  # each caller was answered: the server is shutting down
        assert isinstance(outcome, Exception), outcome
        assert "shutting down" in str(outcome), outcome


def test_second_sigterm_during_the_drain_exits_at_once(
    stuck_server: tuple[ServerProcess, list[object], list[threading.Thread]], tag: str
) -> None:
    proc, _, _ = stuck_server
    proc.proc.send_signal(signal.SIGTERM)
    _wait_for("the drain to start", lambda: "shutting down: not ready" in proc.log(), 10)
    code, took = _sigterm_and_wait(proc)
    print(f"second SIGTERM: exited {code} after {took:.3f} s")  # noqa: T201
    assert took <= 1.0, (took, proc.log())
    _assert_nothing_left(tag)
    log = proc.log()
    assert code == 1, log
    assert "second signal (SIGTERM) during shutdown: exiting now" in log, log
    assert "Traceback" not in log, log
    assert "InvalidStateError" not in log, log


def test_sigterm_with_idle_models_exits_promptly_and_cleanly(
    serve: Callable[[float], ServerProcess], tag: str
) -> None:
    proc = serve(30)
    code, took = _sigterm_and_wait(proc)
    print(f"SIGTERM with idle models: exited {code} after {took:.2f} s")  # noqa: T201
    _assert_nothing_left(tag)
    log = proc.log()
    assert code == 0, log
    assert took < 10, (took, log)  # generous for a loaded machine; the deadline is 30 s
    assert "every in-flight request finished" in log, log
    assert "Traceback" not in log, log


def test_short_requests_in_flight_finish_during_the_drain(
    serve: Callable[[float], ServerProcess], repository: Path, tag: str
) -> None:
    proc = serve(20)
    results: list[object] = []
    threads = [
        _request(httpclient, proc.http_url, "slow", results),
        _request(grpcclient, proc.grpc_url, "slow", results),
    ]
    _wait_for("both slow requests executing", lambda: _started(repository, "slow") == 2)
    code, took = _sigterm_and_wait(proc)
    print(f"SIGTERM, two 1.5 s requests in flight: exited {code} after {took:.2f} s")  # noqa: T201
    for thread in threads:
        thread.join(10)
    _assert_nothing_left(tag)
    log = proc.log()
    assert code == 0, log
    assert len(results) == 2
    for outcome in results:
        assert isinstance(outcome, np.ndarray), outcome
        np.testing.assert_array_equal(outcome, np.arange(4, dtype=np.float32).reshape(1, 4))
    assert took < 15, (took, log)  # done when the work is, not at the 20 s deadline
    assert "every in-flight request finished" in log, log
    assert "Traceback" not in log, log
