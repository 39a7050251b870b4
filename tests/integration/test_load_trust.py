"""What decides what runs, and what a load may trust (issue 31): a version whose load kills the
server process is not loaded again at the next start; damage at rest in the model store is
found at load and the version below serves; config fields naming files stay inside the model.
The real server, started the way a supervisor (systemd) starts it again and again."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.integration.models import PY_FP32_CONFIG
from tests.integration.test_fleet import release_keys
from tests.integration.test_s3_repository import CONFIG, _added, _index, _model_bytes
from tests.serverproc import ROOT, ServerProcess

EXPLICIT = "--model-control-mode=explicit"

_ADDING_MODEL = """\
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        {initialize}

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            out = pb_utils.Tensor("OUTPUT0", (x + {value}).astype(x.dtype))
            responses.append(pb_utils.InferenceResponse([out]))
        return responses
"""
# What the kernel's OOM killer does to the server when a version is too big for memory: the
# server process (the biggest; ONNX Runtime loads in it) gets SIGKILL in the middle of the
# load. The model's process is the server's child, so its parent is the server.
_KILL_THE_SERVER = "import os, signal; os.kill(os.getppid(), signal.SIGKILL)"


def _python_version(model_dir: Path, version: int, value: int, initialize: str = "pass") -> None:
    folder = model_dir / str(version)
    folder.mkdir(parents=True)
    source = _ADDING_MODEL.format(initialize=initialize, value=value)
    (folder / "model.py").write_text(source)


def test_a_version_that_kills_the_server_at_load_is_held_back_at_the_next_start(
    tmp_path: Path,
) -> None:
    # Issue 31 item 11.
    repo = tmp_path / "repo"
    model = repo / "m"
    model.mkdir(parents=True)
    (model / "config.pbtxt").write_text(PY_FP32_CONFIG.replace("{name}", "m"))
    _python_version(model, 1, 1)
    with ServerProcess(repo, log_path=tmp_path / "first.log") as proc:
        assert _added(proc.http_url) == 1.0  # version 1 served well: the last good one
    _python_version(model, 2, 2, _KILL_THE_SERVER)

    killed = ServerProcess(repo, log_path=tmp_path / "killed.log")
    assert killed.proc.wait(120) == -signal.SIGKILL
    killed.stop()
    for start in ("second", "third"):  # restarted as a supervisor would
        with ServerProcess(repo, log_path=tmp_path / f"{start}.log") as proc:
            assert _added(proc.http_url) == 1.0
            rows = {row["version"]: row for row in _index(proc.http_url) if row["name"] == "m"}
            assert rows["1"]["state"] == "READY"
            assert "the server process died while loading version 2" in rows["2"]["reason"]
            log = proc.log()
        assert ("died while loading version 2" in log) is (start == "second")


def _onnx_model(repo: Path, config: str = CONFIG) -> Path:
    model = repo / "m"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(config)
    (model / "1" / "model.onnx").write_bytes(_model_bytes(1))
    return model


def _load_error(proc: ServerProcess) -> str:
    with pytest.raises(InferenceServerException) as caught:
        httpclient.InferenceServerClient(proc.http_url).load_model("m")
    return str(caught.value)


def test_a_config_naming_a_file_outside_the_version_folder_is_refused(
    start_server, tmp_path: Path
) -> None:
    # Issue 31 item 1: `default_model_filename: "../x"` loaded a file beside the (signed)
    # version folder; every config field naming a file is a plain name now, signed or not.
    model = _onnx_model(tmp_path / "repo", CONFIG + 'default_model_filename: "../evil.onnx"\n')
    (model / "evil.onnx").write_bytes(_model_bytes(9))
    proc = start_server(tmp_path / "repo", EXPLICIT)
    why = _load_error(proc)
    assert "default_model_filename must be a plain file name" in why
    assert "'../evil.onnx'" in why
    labels = CONFIG + 'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] '
    (model / "config.pbtxt").write_text(labels + 'label_filename: "/etc/passwd" } ]\n')
    assert "label_filename must be a plain file name" in _load_error(proc)


def test_signed_mode_refuses_unsigned_model_level_files(start_server, tmp_path: Path) -> None:
    # Issue 31 item 1: with --manifest-public-key only the version folder was signed; the
    # config (which decides what runs) and every other model-level file are signed now.
    private, public = release_keys(tmp_path)
    model = _onnx_model(tmp_path / "repo")

    def sign(folder: Path) -> None:
        subprocess.run(
            [sys.executable, "-m", "appliance", "manifest", "--sign-key", str(private), folder],
            check=True,
            cwd=ROOT,
            capture_output=True,
        )

    sign(model / "1")  # the version alone, as before
    proc = start_server(tmp_path / "repo", EXPLICIT, f"--manifest-public-key={public}")
    assert "no model-level SHA256SUMS beside the version folders" in _load_error(proc)
    sign(model)  # the model folder: its model-level manifest and each version's
    client = httpclient.InferenceServerClient(proc.http_url)
    client.load_model("m")
    assert _added(proc.http_url) == 1.0
    (model / "labels.txt").write_text("cat\n")  # an unsigned model-level file
    assert "model-level files not in the signed SHA256SUMS: labels.txt" in _load_error(proc)
    (model / "labels.txt").unlink()
    (model / "config.pbtxt").write_text(CONFIG.replace("4", "2"))  # changed, unsigned
    assert "'config.pbtxt' does not match its sha256 in the model-level" in _load_error(proc)
    assert _added(proc.http_url) == 1.0  # what served keeps serving


def test_a_shutdown_during_a_load_does_not_blame_the_version(tmp_path: Path) -> None:
    # SIGTERM (a systemd stop) while a version loads leaves no marker behind: the start-up
    # load ends (its marker cleared), then the server stops; the runtime's stop clears any
    # marker still set. Only a process that dies leaves one.
    repo = tmp_path / "repo"
    model = repo / "m"
    model.mkdir(parents=True)
    (model / "config.pbtxt").write_text(PY_FP32_CONFIG.replace("{name}", "m"))
    _python_version(model, 1, 1)
    with ServerProcess(repo, log_path=tmp_path / "first.log") as proc:
        assert _added(proc.http_url) == 1.0
    _python_version(model, 2, 2, "import time; time.sleep(3)")
    stopped = ServerProcess(repo, log_path=tmp_path / "stopped.log")
    deadline = time.monotonic() + 60
    while "loading model 'm'" not in stopped.log():
        assert time.monotonic() < deadline, stopped.log()
        time.sleep(0.05)
    stopped.stop()
    with ServerProcess(repo, log_path=tmp_path / "again.log") as proc:
        assert _added(proc.http_url) == 2.0
        assert "died while loading" not in proc.log()
