"""systemd's notify protocol against the real server process and a real AF_UNIX socket.

READY=1 only once the models are loaded and the listeners answer; WATCHDOG=1 keeps coming
while the server is healthy, stops while the process is frozen (SIGSTOP) or every instance of a
model is stuck in one execution, and resumes; STOPPING=1 on SIGTERM, before draining.
"""

from __future__ import annotations

import itertools
import os
import signal
import socket
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from configs.generate import SIMPLE_CONFIG, save, simple_model
from tests.serverproc import ServerProcess

WATCHDOG_USEC = 1_000_000


class NotifySocket:
    """What systemd does: receive notify datagrams, each stamped with its arrival time."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.messages: list[tuple[float, str]] = []
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.bind(str(path))
        self._sock.settimeout(0.1)
        self._changed = threading.Condition()
        self._open = True
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while self._open:
            try:
                data = self._sock.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            with self._changed:
                self.messages.append((time.monotonic(), data.decode()))
                self._changed.notify_all()

    def wait_for(
        self, found: Callable[[list[tuple[float, str]]], bool], timeout_s: float, what: str
    ) -> None:
        with self._changed:
            if not self._changed.wait_for(lambda: found(self.messages), timeout_s):
                raise AssertionError(f"{what} not received within {timeout_s}s: {self.messages}")

    def with_field(self, field: str) -> list[tuple[float, str]]:
        with self._changed:
            return [(t, m) for t, m in self.messages if field in m.split("\n")]

    def pings_after(self, since: float) -> list[float]:
        return [t for t, _ in self.with_field("WATCHDOG=1") if t > since]

    def close(self) -> None:
        self._open = False
        self._reader.join()
        self._sock.close()


@pytest.fixture
def notify_socket(tmp_path: Path) -> Iterator[NotifySocket]:
    sock = NotifySocket(tmp_path / "notify")
    yield sock
    sock.close()


def _env(sock: NotifySocket) -> dict[str, str]:
    return {"NOTIFY_SOCKET": str(sock.path), "WATCHDOG_USEC": str(WATCHDOG_USEC)}


def _simple_repo(root: Path) -> Path:
    save(simple_model(), root / "simple" / "1" / "model.onnx")
    (root / "simple" / "config.pbtxt").write_text(SIMPLE_CONFIG)
    return root


def _http_ready(proc: ServerProcess) -> bool:
    try:
        with urllib.request.urlopen(f"http://{proc.http_url}/v2/health/ready", timeout=2) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def test_ready_watchdog_freeze_and_stopping(
    start_server: Callable[..., ServerProcess], notify_socket: NotifySocket, tmp_path: Path
) -> None:
    proc = start_server(_simple_repo(tmp_path / "models"), wait=False, env=_env(notify_socket))
    notify_socket.wait_for(lambda ms: any("READY=1" in m.split("\n") for _, m in ms), 60, "READY=1")
    # READY went out after the model loaded and the listeners came up: both answer now.
    assert _http_ready(proc)
    log = proc.log()
    assert log.index("model 'simple' version 1 is READY") < log.index("server is ready")
    assert "Started HTTPService" in log
    (ready_at, ready), *more = notify_socket.with_field("READY=1")
    assert not more
    assert f"STATUS=serving 1 model (1 ready), 0 requests served; HTTP :{proc.http_port} " in (
        ready
    )
    assert next(m for _, m in notify_socket.messages) == "STATUS=loading models"

    # Pings every half interval while healthy.
    notify_socket.wait_for(
        lambda _: len(notify_socket.pings_after(ready_at)) >= 3, 5, "three WATCHDOG=1"
    )

    # Frozen: no pings; thawed: pings again. (The next test shows pings stopping while the
    # process runs, which a bare timer would not do.)
    os.kill(proc.proc.pid, signal.SIGSTOP)
    stopped_at = time.monotonic()
    try:
        time.sleep(2.5 * WATCHDOG_USEC / 1e6)  # asserting an absence takes waiting
        assert notify_socket.pings_after(stopped_at + 0.05) == []
    finally:
        os.kill(proc.proc.pid, signal.SIGCONT)
    resumed_at = time.monotonic()
    notify_socket.wait_for(
        lambda _: len(notify_socket.pings_after(resumed_at)) >= 2, 5, "pings after SIGCONT"
    )
    assert _http_ready(proc)

    assert proc.stop() == 0
    (_, stopping), *_ = notify_socket.with_field("STOPPING=1")
    assert "STATUS=stopping" in stopping
    assert "READY=1" not in stopping


SLEEPY_MODEL = """\
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            time.sleep(float(x[0]))
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
        return responses
"""

SLEEPY_CONFIG = """\
name: "{name}"
backend: "python"
input [ {{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 1 ] }} ]
instance_group [ {{ count: {count}, kind: KIND_CPU }} ]
"""


def _sleep_in(proc: ServerProcess, model: str, seconds: float) -> threading.Thread:
    def call() -> None:
        client = httpclient.InferenceServerClient(proc.http_url, network_timeout=60)
        inp = httpclient.InferInput("INPUT0", [1], "FP32")
        inp.set_data_from_numpy(np.array([seconds], np.float32))
        client.infer(model, [inp])

    thread = threading.Thread(target=call)
    thread.start()
    return thread


def _longest_gap(pings: list[float], start: float, end: float) -> float:
    times = [start, *[t for t in pings if start < t < end], end]
    return max(b - a for a, b in itertools.pairwise(times))


def test_watchdog_stops_only_when_every_instance_is_stuck(
    start_server: Callable[..., ServerProcess], notify_socket: NotifySocket, tmp_path: Path
) -> None:
    repo = tmp_path / "models"
    for name, count in (("sleepy_one", 1), ("sleepy_two", 2)):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.py").write_text(SLEEPY_MODEL)
        (repo / name / "config.pbtxt").write_text(SLEEPY_CONFIG.format(name=name, count=count))
    proc = start_server(repo, env=_env(notify_socket))
    interval = WATCHDOG_USEC / 1e6

    # One of two instances busy for 4 intervals: the model still serves, pings go on (every
    # half interval; the bound leaves room for a busy test machine).
    start = time.monotonic()
    _sleep_in(proc, "sleepy_two", 4 * interval).join()
    end = time.monotonic()
    assert _longest_gap(notify_socket.pings_after(start), start, end) < 1.5 * interval

    # The only instance stuck for 4 intervals: pings stop about one interval in.
    start = time.monotonic()
    _sleep_in(proc, "sleepy_one", 4 * interval).join()
    end = time.monotonic()
    assert _longest_gap(notify_socket.pings_after(start), start, end) > 2 * interval
    notify_socket.wait_for(
        lambda _: len(notify_socket.pings_after(end)) >= 2, 5, "pings once it finished"
    )
    reason = "STATUS=unhealthy: model 'sleepy_one' version 1: every instance (1) has been"
    assert any(m.startswith(reason) for _, m in notify_socket.messages)
    log = proc.log()
    assert "watchdog: not telling systemd we are alive: model 'sleepy_one'" in log
    assert "watchdog: healthy again" in log
    assert proc.stop() == 0
