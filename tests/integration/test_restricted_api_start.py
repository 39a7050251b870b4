"""The server refuses to start with a restricted-API key or value that protects nothing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.serverproc import ROOT


@pytest.mark.parametrize("flag", ["--http-restricted-api", "--grpc-restricted-protocol"])
def test_the_server_does_not_start_with_an_empty_key(flag: str, tmp_path: Path) -> None:
    """The real command line: it exits at once, saying which flag and why."""
    proc = subprocess.run(
        [sys.executable, "-m", "appliance", "serve", "--model-repository", str(tmp_path),
         "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0",
         f"{flag}=logging:admin-key="],
        capture_output=True, text=True, timeout=60, cwd=ROOT, check=False,
    )
    assert proc.returncode != 0
    assert f"{flag} 'logging:admin-key=': the value of header 'admin-key' is empty" in (
        proc.stderr
    ), proc.stderr[-2000:]
