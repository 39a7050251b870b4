"""The built binary itself (build/build.sh): serves the example repository over HTTP and gRPC,
and drains and exits 0 on SIGTERM. Skipped until a binary is built; CI builds one first."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.serverproc import ROOT, free_port

BINARY = Path(os.environ.get("EDGE_BINARY", ROOT / "dist" / "edge-appliance" / "edge-appliance"))

pytestmark = pytest.mark.skipif(
    not BINARY.is_file(),
    reason=f"no built binary at {BINARY} (run build/build.sh, or set EDGE_BINARY)",
)


def _repository(tmp_path: Path) -> Path:
    from configs.generate import write_repository

    repo = tmp_path / "models"
    write_repository(repo)
    return repo


def test_binary_reports_its_build() -> None:
    out = subprocess.run([str(BINARY), "version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip()


def _verify(binary: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(binary), "version", "--verify"], capture_output=True, text=True, timeout=120
    )


def test_binary_verifies_its_signed_record_and_sbom(tmp_path: Path) -> None:
    """build.sh signs SHA256SUMS of every file of the build (the SBOM among them): `version
    --verify` passes on the build, and fails on a copy with its SBOM changed or a file added."""
    out = _verify(BINARY)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.startswith("PASS: ")
    assert "CycloneDX" in out.stdout
    # A copy of hard links (no 140 MB copied); a tampered file is written anew, not in place.
    copy = tmp_path / "edge-appliance"
    shutil.copytree(BINARY.parent, copy, copy_function=os.link)
    sbom = copy / "sbom.cdx.json"
    text = sbom.read_text()
    sbom.unlink()
    sbom.write_text(text.replace('"numpy"', '"numpy-not"'))
    out = _verify(copy / BINARY.name)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "FAIL: " in out.stdout
    assert "'sbom.cdx.json' does not match" in out.stdout
    sbom.unlink()
    sbom.write_text(text)
    (copy / "_internal" / "planted.so").write_bytes(b"not from the build")
    out = _verify(copy / BINARY.name)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "files not in the signed SHA256SUMS: _internal/planted.so" in out.stdout


def test_binary_serves_http_and_grpc_and_drains_on_sigterm(tmp_path: Path) -> None:
    repo = _repository(tmp_path)
    http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    log = (tmp_path / "server.log").open("wb")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    proc = subprocess.Popen(
        [
            str(BINARY),
            "--model-repository",
            str(repo),
            "--http-port",
            str(http_port),
            "--grpc-port",
            str(grpc_port),
            "--metrics-port",
            str(metrics_port),
            "--model-store-dir",
            str(tmp_path / "store"),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=tmp_path,  # not the checkout: the binary must not import the source tree
    )
    try:
        started = time.monotonic()
        while True:
            assert proc.poll() is None, (tmp_path / "server.log").read_text()
            try:
                url = f"http://127.0.0.1:{http_port}/v2/health/ready"
                with urllib.request.urlopen(url, timeout=1) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() - started < 60, (tmp_path / "server.log").read_text()
            time.sleep(0.05)
        a = np.arange(16, dtype=np.int32).reshape(1, 16)
        b = np.ones((1, 16), dtype=np.int32)

        http = httpclient.InferenceServerClient(f"127.0.0.1:{http_port}")
        inputs = [
            httpclient.InferInput("INPUT0", [1, 16], "INT32"),
            httpclient.InferInput("INPUT1", [1, 16], "INT32"),
        ]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(b, binary_data=True)
        result = http.infer("simple", inputs)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)

        grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        ginputs = [
            grpcclient.InferInput("INPUT0", [1, 16], "INT32"),
            grpcclient.InferInput("INPUT1", [1, 16], "INT32"),
        ]
        ginputs[0].set_data_from_numpy(a)
        ginputs[1].set_data_from_numpy(b)
        result = grpc.infer("simple", ginputs)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
        # A Python model runs in a spawned process of the frozen binary.
        assert http.is_model_ready("densenet_preprocess")

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        text = (tmp_path / "server.log").read_text()
        assert "shutting down" in text
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
