"""TLS mistakes refused at start with the flag, the file and what is wrong with it (issue 17,
item 10). Before: a bad gRPC key exited with "Failed to bind to address" (a port conflict, it
seemed), an HTTP one with "PEM lib" naming no file, and gRPC certificate flags without
--grpc-use-ssl served plain gRPC."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

pytest.importorskip("cryptography")

from tests.pki import encrypted_copy, self_signed
from tests.serverproc import ServerProcess

START_S = 60  # the server's start-up on a loaded 2-core machine, with margin


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, Path]:
    cert, key = self_signed(tmp_path, "server")
    _, other_key = self_signed(tmp_path, "other")
    return {"cert": cert, "key": key, "other_key": other_key}


def _refused(start_server, tmp_path: Path, *flags: str) -> tuple[int, str]:  # type: ignore[no-untyped-def]
    """Start on an empty repository; the exit status and the log once it exited."""
    (tmp_path / "models").mkdir(exist_ok=True)
    proc: ServerProcess = start_server(tmp_path / "models", *flags, wait=False)
    try:
        status = proc.proc.wait(START_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the server started with {flags}:\n{proc.log()}")
    return status, proc.log()


def test_a_grpc_key_that_is_not_the_certificates(start_server, tmp_path: Path, pki) -> None:  # type: ignore[no-untyped-def]
    status, log = _refused(
        start_server,
        tmp_path,
        "--grpc-use-ssl=true",
        f"--grpc-server-cert={pki['cert']}",
        f"--grpc-server-key={pki['other_key']}",
    )
    assert status == 78  # EX_CONFIG: the unit does not restart it (issue 37)
    assert (
        f"cannot start: --grpc-server-key '{pki['other_key']}' is not the private key of the "
        f"certificate in --grpc-server-cert '{pki['cert']}'"
    ) in log
    assert "Failed to bind" not in log


def test_an_encrypted_grpc_key(start_server, tmp_path: Path, pki) -> None:  # type: ignore[no-untyped-def]
    locked = encrypted_copy(pki["key"], tmp_path / "locked.key")
    status, log = _refused(
        start_server,
        tmp_path,
        "--grpc-use-ssl-mutual=true",
        f"--grpc-server-cert={pki['cert']}",
        f"--grpc-server-key={locked}",
        f"--grpc-root-cert={pki['cert']}",
    )
    assert status == 78  # EX_CONFIG: the unit does not restart it (issue 37)
    assert f"--grpc-server-key '{locked}': the private key is encrypted with a passphrase" in log


def test_a_missing_grpc_root_certificate(start_server, tmp_path: Path, pki) -> None:  # type: ignore[no-untyped-def]
    missing = tmp_path / "ca.pem"
    status, log = _refused(
        start_server,
        tmp_path,
        "--grpc-use-ssl-mutual=true",
        f"--grpc-server-cert={pki['cert']}",
        f"--grpc-server-key={pki['key']}",
        f"--grpc-root-cert={missing}",
    )
    assert status == 78  # EX_CONFIG: the unit does not restart it (issue 37)
    assert f"--grpc-root-cert '{missing}': cannot read it: No such file or directory" in log


def test_an_http_key_flag_given_the_certificate(start_server, tmp_path: Path, pki) -> None:  # type: ignore[no-untyped-def]
    status, log = _refused(
        start_server,
        tmp_path,
        "--allow-grpc=false",
        f"--http-ssl-cert={pki['cert']}",
        f"--http-ssl-key={pki['cert']}",
    )
    assert status == 78  # EX_CONFIG: the unit does not restart it (issue 37)
    assert f"--http-ssl-key '{pki['cert']}': no private key in it (it holds a CERTIFICATE)" in log
    assert "PEM lib" not in log


def test_grpc_certificate_flags_without_grpc_tls(start_server, tmp_path: Path, pki) -> None:  # type: ignore[no-untyped-def]
    status, log = _refused(
        start_server,
        tmp_path,
        f"--grpc-server-cert={pki['cert']}",
        f"--grpc-server-key={pki['key']}",
    )
    assert status != 0
    assert (
        "--grpc-server-cert and --grpc-server-key without --grpc-use-ssl (or "
        "--grpc-use-ssl-mutual) would serve plain gRPC"
    ) in log
