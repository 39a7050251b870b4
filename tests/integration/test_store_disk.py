"""The disk reserve scales with the store's file system: on a 150 MB partition the default
reserve is 15 MiB (10%), not a flat 256 MiB that refused every download; a download refused
for space is visible, with the numbers, on the readiness answer and in the repository index.

The store is a real 150 MB tmpfs, mounted in a mount namespace of the server's own (unshare:
as root, or in an unprivileged user namespace where the kernel allows one; skipped otherwise).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_s3_repository import (
    Bucket,
    _added,
    _index,
    _manifest,
    _model_bytes,
    _wait_for,
)
from tests.s3servers import S3Server, moto_server
from tests.serverproc import ServerProcess

MiB = 1024 * 1024
TMPFS_MB = 150
CONFIG = 'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 4\n'


def _launcher(store: Path) -> list[str]:
    """Run the server with a TMPFS_MB tmpfs mounted on `store`, seen by it alone."""
    mount = f'mount -t tmpfs -o size={TMPFS_MB}m tmpfs "$0" && exec "$@"'
    return ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", mount, str(store)]


def _can_mount(tmp_path: Path) -> str:
    """'' when the launcher works here, else why not."""
    if shutil.which("unshare") is None:
        return "no unshare(1)"
    probe = tmp_path / "probe"
    probe.mkdir()
    try:
        run = subprocess.run(
            [*_launcher(probe), "true"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    return "" if run.returncode == 0 else f"unshare + mount refused: {run.stderr.strip()}"


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with moto_server() as server:
        yield server


def _readiness(proc: ServerProcess) -> tuple[int, dict[str, Any]]:
    url = f"http://{proc.http_url}/v2/health/ready?verbose=true"
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


@pytest.mark.parametrize("strict", [False, True])
def test_a_small_store_partition_takes_models_and_says_what_does_not_fit(
    s3: S3Server, tmp_path: Path, strict: bool
) -> None:
    why_not = _can_mount(tmp_path)
    if why_not:
        pytest.skip(f"cannot give the server a {TMPFS_MB} MB file system: {why_not}")
    bucket = Bucket(s3)
    # Synced in name order: 20 MiB first (fits), then 120 MiB (would leave 10 MiB, under 15).
    for name, value, padding in (("a", 1, 20 * MiB), ("big", 2, 120 * MiB)):
        files = {"model.onnx": _model_bytes(value, padding=padding)}
        bucket.put(f"{name}/config.pbtxt", CONFIG.format(name=name).encode())
        bucket.put(f"{name}/1/model.onnx", files["model.onnx"])
        bucket.put(f"{name}/1/SHA256SUMS", _manifest(files))
    store = tmp_path / "store"
    store.mkdir()
    flags = ["--repository-sync-wait-secs=60", "--model-control-mode=poll"]
    proc = ServerProcess(
        bucket.url,
        f"--model-store-dir={store}",
        *flags,
        *(["--strict-readiness"] if strict else []),
        log_path=tmp_path / "server.log",
        env=s3.env(),
        launcher=_launcher(store),
    )
    try:
        # Before, the flat 256 MiB reserve refused both downloads on this partition.
        proc.wait_ready(path="/v2/health/live")
        if not strict:
            proc.wait_ready()
        _wait_for(lambda: _added(proc.http_url, "a") == 1.0, timeout_s=60)

        def big() -> dict[str, Any]:
            return next((e for e in _index(proc.http_url) if e["name"] == "big"), {"reason": ""})

        _wait_for(lambda: "not enough disk" in big().get("reason", ""))  # strict: not ready
        rows = {e["name"]: e for e in _index(proc.http_url)}
        reason = rows["big"]["reason"]
        assert rows["big"]["state"] == "UNAVAILABLE"
        assert reason.startswith("not fetched: not enough disk for model 'big' version 1: needs 12")
        assert "MiB free in" in reason
        assert "15.0 MiB must stay free" in reason
        assert "10% of the 150 MiB file system" in reason
        status, body = _readiness(proc)
        assert status == (400 if strict else 200)
        assert body["ready"] is (not strict)
        assert any(reason in problem for problem in body["problems"]), body
        url = f"http://{proc.http_url}/status.json"  # the status page's data says so too
        with urllib.request.urlopen(url, timeout=10) as resp:
            status = json.loads(resp.read())
        assert any(reason in problem for problem in status["server"]["problems"])
        (model,) = [m for m in status["models"] if m["name"] == "big"]
        assert [v["reason"] for v in model["versions"]] == [reason]
    finally:
        proc.stop()
