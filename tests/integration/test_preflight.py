"""Settings that cannot work fail before any model loads (issue 37, item 4): one line naming the
flag and the fault, no "shutting down... draining" lines, and an exit status systemd's unit
does not restart in a loop for a configuration error (78, EX_CONFIG: RestartPreventExitStatus=).
Before: every model loaded first, then the listener failed, the shutdown lines followed, and
the exit status 1 had systemd load everything again every 5 s."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import onnx

from tests.integration.models import _add_constant_model
from tests.serverproc import ROOT, ServerProcess

START_S = 60  # a start on a loaded 2-core machine, with margin


def _repository(tmp_path: Path) -> Path:
    """One real model, so that "before any model load" is something the log can show."""
    models = tmp_path / "models"
    (models / "m" / "1").mkdir(parents=True)
    (models / "m" / "config.pbtxt").write_text(
        'name: "m"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 4\n'
    )
    onnx.save(_add_constant_model(1), str(models / "m" / "1" / "model.onnx"))
    return models


def _refused(start_server, tmp_path: Path, *flags: str) -> tuple[int, str]:  # type: ignore[no-untyped-def]
    proc: ServerProcess = start_server(_repository(tmp_path), *flags, wait=False)
    try:
        status = proc.proc.wait(START_S)
    except subprocess.TimeoutExpired:
        proc.stop()
        raise AssertionError(f"the server started with {flags}:\n{proc.log()}") from None
    return status, proc.log()


def _errors(log: str) -> list[str]:
    return [line for line in log.splitlines() if "ERROR" in line or "Traceback" in line]


def test_a_port_in_use_fails_before_any_model_loads(start_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        status, log = _refused(start_server, tmp_path, f"--metrics-port={port}")
    assert "loading model" not in log, log
    assert "shutting down" not in log, log
    assert "draining" not in log, log
    errors = _errors(log)
    assert len(errors) == 1, log
    assert f"cannot start: --metrics-port {port}: 127.0.0.1:{port} is already in use" in errors[0]
    # The machine's state, which may change: systemd tries again (now without a load first).
    assert status == 1


def test_one_port_for_two_listeners_fails_before_any_model_loads(
    start_server, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # ServerProcess passes its own --metrics-port first; the later flag wins.
    status, log = _refused(start_server, tmp_path, f"--http-port={port}", f"--metrics-port={port}")
    assert "loading model" not in log, log
    assert "is already in use" in log, log
    assert f"--metrics-port {port}" in log, log
    assert status == 1


def test_a_missing_tls_file_fails_before_any_model_loads_with_exit_78(
    start_server, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    missing = tmp_path / "no-such.crt"
    status, log = _refused(
        start_server,
        tmp_path,
        f"--http-ssl-cert={missing}",
        f"--http-ssl-key={tmp_path / 'no-such.key'}",
    )
    assert "loading model" not in log, log
    assert "shutting down" not in log, log
    errors = _errors(log)
    assert len(errors) == 1, log
    assert f"cannot start: --http-ssl-cert '{missing}': cannot read it" in errors[0]
    assert status == 78


def test_an_unwritable_store_folder_fails_before_any_model_loads(
    start_server, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    blocker = tmp_path / "a-file"
    blocker.write_text("the store folder's parent is a file")
    status, log = _refused(
        start_server,
        tmp_path,
        "--model-repository=s3://127.0.0.1:9/bucket/models",
        f"--model-store-dir={blocker / 'store'}",
    )
    assert "loading model" not in log, log
    errors = _errors(log)
    assert len(errors) == 1, log
    assert f"cannot start: --model-store-dir '{blocker / 'store'}': cannot write there" in errors[0]
    assert status == 78


def test_the_unit_does_not_restart_a_configuration_error() -> None:
    unit = (ROOT / "systemd" / "edge-appliance.service").read_text()
    prevent = [line for line in unit.splitlines() if line.startswith("RestartPreventExitStatus=")]
    assert prevent, "no RestartPreventExitStatus= in the unit"
    assert {"2", "78"} <= set(prevent[0].partition("=")[2].split())
