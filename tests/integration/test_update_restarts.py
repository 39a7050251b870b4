"""Updates a restart cannot undo: each failure kind stays out of service after a SIGKILL and
after a clean stop, with the bucket up or down; a version deleted from the bucket leaves
service whatever the others' state. Real server processes, a real S3 server (moto).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.integration.s3device import Device
from tests.integration.test_poll_mode import _failing_model
from tests.integration.test_s3_repository import (
    CONFIG,
    _index,
    _manifest,
    _metric,
    _model_bytes,
    _wait_for,
)
from tests.s3servers import S3Server, moto_server

KEPT_OUT = "not loaded again until its content changes"


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with moto_server() as server:
        yield server


@pytest.fixture
def device(start_server: Any, s3: S3Server, tmp_path: Path) -> Iterator[Device]:
    made: list[Device] = []

    def make(*flags: str) -> Device:
        made.append(Device(start_server, s3, tmp_path, *flags))
        return made[-1]

    yield make  # type: ignore[misc]
    for one in made:
        one.link.stop()


def _restarts_keep_it_out(dev: Device, version: str, why: str) -> None:
    """SIGKILL, start with the bucket up; clean stop, start with the bucket down: each time
    version 1 serves at once and `version` is UNAVAILABLE with `why`."""
    dev.kill()
    for bucket_up in (True, False):
        if not bucket_up:
            dev.stop()
            dev.link.stop()
        proc = dev.start()
        assert dev.added() == 1.0
        row = dev.row(version)
        assert row["state"] == "UNAVAILABLE", row
        assert why in row["reason"]
        assert KEPT_OUT in row["reason"]
        assert f"model 'm' version {version} failed to load" not in proc.log()
    dev.link.start()


def test_a_corrupt_push_and_a_bad_checksum_stay_out_across_restarts(device: Any) -> None:
    dev: Device = device()
    dev.bucket.seed()
    dev.start(first=True)
    dev.bucket.put_version(2, None)  # a manifest that matches a file that is not a model
    _wait_for(lambda: dev.row("2").get("state") == "UNAVAILABLE")
    dev.put_files(3, {"model.onnx": _model_bytes(3)})
    dev.bucket.put("m/3/SHA256SUMS", _manifest({"model.onnx": b"other bytes"}))
    _wait_for(lambda: "does not match its sha256" in dev.row("3").get("reason", ""))
    assert dev.added() == 1.0

    dev.kill()
    proc = dev.start()
    assert dev.added() == 1.0  # not the 503 of a model whose newest version is corrupt
    row = dev.row("2")
    assert row["state"] == "UNAVAILABLE"
    assert "onnxruntime cannot load" in row["reason"]
    assert KEPT_OUT in row["reason"]
    assert "model 'm' version 2 failed to load" not in proc.log()
    _wait_for(lambda: "rejected: " in dev.row("3").get("reason", ""))
    assert _metric(proc, "edge_repository_download_bytes_total") == 0  # not fetched again
    _restarts_keep_it_out(dev, "2", "onnxruntime cannot load")

    dev.bucket.put_version(3, 3)  # a fixed release
    _wait_for(lambda: dev.added() == 3.0)
    dev.bucket.put_version(2, 2)  # new content for version 2: it is tried again
    _wait_for(lambda: dev.row("2").get("state") is None)  # not served (3 is newer), not failed


def test_a_rolled_back_version_stays_rolled_back_across_restarts(device: Any) -> None:
    dev: Device = device("--model-rollback-error-rate=0.5", "--model-rollback-window=10")
    dev.bucket.seed()
    proc = dev.start(first=True)
    dev.put_files(2, {"model.onnx": _failing_model().SerializeToString()})
    client = httpclient.InferenceServerClient(proc.http_url)
    _wait_for(lambda: client.is_model_ready("m", "2"))
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            if dev.added() == 1.0:
                break
        except InferenceServerException:
            pass
    assert "rolled back: " in dev.row("2")["reason"]
    # The verdict is written on a thread right after the switch back: a SIGKILL before it is
    # on disk would lose it (the log says when it is).
    _wait_for(lambda: "version 2 rolled back: kept in the ledger across restarts" in proc.log())
    # Before, a restart loaded version 2 again (the newest) and every request failed with 500.
    _restarts_keep_it_out(dev, "2", "rolled back: 6 of its first")


def test_a_failed_warm_up_stays_out_across_restarts(device: Any) -> None:
    dev: Device = device()
    warmup = (
        'model_warmup [ { name: "zeros", batch_size: 1, inputs { key: "INPUT0" '
        "value: { data_type: TYPE_FP32, dims: [ 4 ], zero_data: true } } } ]\n"
    )
    dev.bucket.put("m/config.pbtxt", (CONFIG + warmup).encode())
    dev.bucket.put_version(1, 1)
    proc = dev.start(first=True)
    dev.put_files(2, {"model.onnx": _failing_model().SerializeToString()})
    _wait_for(lambda: "warm-up sample 'zeros' failed" in dev.row("2").get("reason", ""))
    assert dev.added() == 1.0
    assert "version 2 is READY" not in proc.log()
    _restarts_keep_it_out(dev, "2", "warm-up sample 'zeros' failed")


def test_a_deleted_version_leaves_service_even_when_the_next_one_is_broken(
    device: Any,
) -> None:
    dev: Device = device()
    dev.bucket.put("m/config.pbtxt", CONFIG.encode())
    dev.bucket.put_version(1, None)  # broken, never loaded: version 2 is the newest
    dev.bucket.put_version(2, 2)
    dev.bucket.put_version(3, 3)
    proc = dev.start(first=True)
    assert dev.added() == 3.0
    for key in ("m/3/model.onnx", "m/3/SHA256SUMS"):
        dev.bucket.delete(key)
    _wait_for(lambda: dev.added() == 2.0)  # the version below takes over
    for key in ("m/2/model.onnx", "m/2/SHA256SUMS"):
        dev.bucket.delete(key)
    client = httpclient.InferenceServerClient(proc.http_url)
    # Before, version 2 kept serving from memory (READY in the index) although the bucket no
    # longer had it, because version 1 could not replace it.
    _wait_for(lambda: not client.is_model_ready("m"))
    with pytest.raises(InferenceServerException, match="version 2 left the repository"):
        dev.added()
    rows = {e.get("version"): e for e in _index(proc.http_url)}
    assert "2" not in rows
    assert "3" not in rows
    assert rows["1"]["state"] == "UNAVAILABLE"
    assert "onnxruntime cannot load" in rows["1"]["reason"]
    assert "model 'm' version 2 left the repository" in proc.log()
