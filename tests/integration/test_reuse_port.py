"""--reuse-http-port / --reuse-grpc-port (SO_REUSEPORT): a new server starts on the ports an old
one holds and serves them once the old one stops: a binary swapped without a moment in which
the device refuses connections. Without the flags the second server cannot start."""

from __future__ import annotations

import time
from pathlib import Path

import onnx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.integration.models import _add_constant_model
from tests.serverproc import ServerProcess

REUSE = ("--reuse-http-port=true", "--reuse-grpc-port=true")


@pytest.fixture
def model_repository(tmp_path: Path) -> Path:
    (tmp_path / "repo" / "add" / "1").mkdir(parents=True)
    onnx.save(_add_constant_model(1), str(tmp_path / "repo" / "add" / "1" / "model.onnx"))
    return tmp_path / "repo"


def _wait_started(proc: ServerProcess) -> str:
    """The log of a server started on another's ports (its own URLs are not its ports)."""
    deadline = time.monotonic() + 60
    while "server is ready" not in proc.log():
        assert proc.proc.poll() is None, proc.log()
        assert time.monotonic() < deadline, proc.log()
        time.sleep(0.05)
    return proc.log()


def _on_ports_of(old: ServerProcess, *flags: str) -> list[str]:
    return [f"--http-port={old.http_port}", f"--grpc-port={old.grpc_port}", *flags]


def _metadata_names(proc: ServerProcess) -> tuple[str, str]:
    http = httpclient.InferenceServerClient(proc.http_url).get_server_metadata()["name"]
    grpc = grpcclient.InferenceServerClient(proc.grpc_url).get_server_metadata(as_json=True)
    return http, grpc["name"]


def test_a_new_server_takes_over_the_ports_before_the_old_one_stops(
    model_repository: Path, tmp_path: Path
) -> None:
    with ServerProcess(model_repository, *REUSE, "--id=old", log_path=tmp_path / "old.log") as old:
        new = ServerProcess(
            model_repository,
            *_on_ports_of(old, *REUSE, "--id=new"),
            log_path=tmp_path / "new.log",
        )
        try:
            log = _wait_started(new)
            assert f"Started HTTPService at 127.0.0.1:{old.http_port}" in log
            assert f"Started GRPCInferenceService at 127.0.0.1:{old.grpc_port}" in log
            old.stop()
            # The ports are the new server's now (fresh connections: the old ones closed).
            assert _metadata_names(old) == ("new", "new")
        finally:
            new.stop()


def test_without_the_flags_a_second_server_cannot_take_the_ports(
    model_repository: Path, tmp_path: Path
) -> None:
    with ServerProcess(model_repository, log_path=tmp_path / "old.log") as old:
        second = ServerProcess(
            model_repository, *_on_ports_of(old), log_path=tmp_path / "second.log"
        )
        try:
            assert second.proc.wait(timeout=60) != 0
            # Checked before any model loads (server/preflight.py), the first port first.
            assert (
                f"--http-port {old.http_port}: 127.0.0.1:{old.http_port} is already in use"
                in second.log()
            )
            assert "loading model" not in second.log()
        finally:
            second.stop()
        assert _metadata_names(old) == ("triton", "triton")
