"""A Python model's process is lean, and its tensors' shared memory never outlives it.

The server starts as the console script does (`from appliance.face.cli import main` in a script
that is `__main__`), the case where plain multiprocessing spawn re-imports the whole server into
every model process. No resource tracker process may start, and no arena may stay in /dev/shm
once both sides mapped it, after an unload, a killed model process or the server's exit.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.serverproc import ServerProcess

CONFIG = """\
name: "py_double"
backend: "python"
max_batch_size: 4
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
"""

MODEL = """\
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0")
                                 .as_numpy() * 2)]
            )
            for r in requests
        ]
"""

# What `edge-appliance serve` runs: a script importing the server, here fed the test's flags.
SCRIPT = """\
import sys

from appliance.face.cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[sys.argv.index("appliance") + 1 :]))
"""

# Modules of the server that a model process has no use for (their extension modules).
SERVER_ONLY = ("/aiohttp/", "/grpc/", "/onnxruntime/", "/uvloop/", "/httptools/")


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return found


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _arenas(pids: set[int]) -> list[str]:
    """Tensor arenas in /dev/shm created by any of `pids` (named edge-py-<side>-<pid>-...)."""
    return [p.name for p in Path("/dev/shm").glob("edge-py-*") if int(p.name.split("-")[3]) in pids]


def _infer(server: ServerProcess, rows: int) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    x = np.arange(rows * 20000, dtype=np.float32).reshape(rows, 20000)  # over 64 KiB
    tensor = httpclient.InferInput("INPUT0", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    result = client.infer("py_double", [tensor])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x * 2)


def _model_process(server: ServerProcess, old: int | None = None) -> int:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = [p for p in _children(server.proc.pid) if p != old]
        if found:
            return found[0]
        time.sleep(0.05)
    raise AssertionError(f"no model process; children: {_children(server.proc.pid)}")


def test_model_processes_are_lean_and_leave_no_shared_memory(tmp_path: Path) -> None:
    (tmp_path / "models" / "py_double" / "1").mkdir(parents=True)
    (tmp_path / "models" / "py_double" / "config.pbtxt").write_text(CONFIG)
    (tmp_path / "models" / "py_double" / "1" / "model.py").write_text(MODEL)
    (tmp_path / "serve.py").write_text(SCRIPT)
    server = ServerProcess(
        tmp_path / "models",
        "--model-control-mode=explicit",
        "--load-model=py_double",
        log_path=tmp_path / "server.log",
        launcher=[sys.executable, str(tmp_path / "serve.py")],
    )
    with server:
        pids = {server.proc.pid}
        children = _children(server.proc.pid)
        assert [_cmdline(c) for c in children if "resource_tracker" in _cmdline(c)] == []
        (child,) = children  # the model's process
        maps = Path(f"/proc/{child}/maps").read_text()
        assert not [m for m in SERVER_ONLY if m in maps], "server modules in the model process"
        pids.add(child)

        _infer(server, 1)
        _infer(server, 4)  # the arenas grow: both sides replace theirs
        assert _arenas(pids) == [], "an arena both sides mapped is still named in /dev/shm"

        os.kill(child, signal.SIGKILL)  # the next request fails and restarts it
        with pytest.raises(InferenceServerException, match="exited"):
            _infer(server, 2)
        _infer(server, 2)  # fresh arenas on both sides
        child = _model_process(server, old=child)
        pids.add(child)
        assert _arenas(pids) == []
        assert [p for p in _children(server.proc.pid) if "resource_tracker" in _cmdline(p)] == []

        httpclient.InferenceServerClient(server.http_url).unload_model("py_double")
        deadline = time.monotonic() + 30
        while _children(server.proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _children(server.proc.pid) == [], "the model process outlived its unload"
        assert _arenas(pids) == []
    assert _arenas(pids) == []
