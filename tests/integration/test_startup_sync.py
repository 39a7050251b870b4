"""Start-up serves from the model store before the network answers: a slow download or an
endpoint that accepts connections and never answers no longer keeps the cached models offline;
what the sync brings switches in when it arrives; --repository-sync-wait-secs bounds a strict
wait. Real server processes, a real S3 server (moto).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.s3device import Device, HungEndpoint
from tests.integration.test_s3_repository import _metric, _wait_for
from tests.s3servers import S3Server, moto_server


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with moto_server() as server:
        yield server


@pytest.fixture
def dev(start_server: Any, s3: S3Server, tmp_path: Path) -> Iterator[Device]:
    device = Device(start_server, s3, tmp_path, "--repository-timeout-secs=2")
    device.bucket.seed()
    device.start(first=True)
    assert device.added() == 1.0
    device.stop()
    yield device
    device.link.stop()


def _timed_start(dev: Device, *flags: str) -> float:
    """Seconds from starting the process to its readiness."""
    started = time.monotonic()
    dev.start(*flags)
    return time.monotonic() - started


def test_a_pending_download_does_not_keep_the_cached_version_offline(dev: Device) -> None:
    dev.bucket.put_version(2, 2, padding=6 * 1024 * 1024)  # 6 MiB at 16 Mbit/s: about 3 s
    ready_s = _timed_start(dev, "--model-download-limit-mbps=16")
    assert dev.added() == 1.0  # served from the store while version 2 downloads
    assert not list(dev.store.glob("models/*/m/2")), "version 2 arrived before start-up ended"
    started = time.monotonic()
    _wait_for(lambda: dev.added() == 2.0)  # and it switches in once it arrives
    print(f"ready in {ready_s:.1f} s, version 2 serving {time.monotonic() - started:.1f} s later")  # noqa: T201


def test_an_endpoint_that_never_answers_does_not_delay_start_up(dev: Device) -> None:
    dev.link.stop()
    hung = HungEndpoint(dev.link.port)
    try:
        ready_s = _timed_start(dev)
        assert dev.added() == 1.0
        assert dev.proc is not None
        proc = dev.proc
        # Before, start-up waited for the sync: 123 s against such an endpoint.
        assert ready_s < 20, ready_s
        assert "unreachable" not in proc.log()  # ready before the sync gave up
        started = time.monotonic()
        _wait_for(lambda: "model source unreachable" in proc.log(), timeout_s=30)
        print(f"ready in {ready_s:.1f} s; sync gave up {time.monotonic() - started:.1f} s later")  # noqa: T201
        assert "Read timeout" in proc.log() or "timed out" in proc.log()
        assert _metric(proc, "edge_repository_source_up") == 0.0
        assert dev.added() == 1.0
    finally:
        hung.close()
    dev.link.start()  # the network comes back: the poller catches up
    dev.bucket.put_version(2, 2)
    _wait_for(lambda: dev.added() == 2.0)


def test_a_strict_start_waits_for_the_first_sync_at_most_as_long_as_told(dev: Device) -> None:
    dev.link.stop()
    hung = HungEndpoint(dev.link.port)
    try:
        ready_s = _timed_start(dev, "--repository-sync-wait-secs=3")
        assert dev.proc is not None
        assert 3 <= ready_s < 20, ready_s
        assert "were not synced within 3 s (--repository-sync-wait-secs)" in dev.proc.log()
        assert dev.added() == 1.0
    finally:
        hung.close()
        dev.stop()
    dev.link.start()
    dev.bucket.put_version(2, 2)
    ready_s = _timed_start(dev, "--repository-sync-wait-secs=60")
    assert dev.added() == 2.0  # ready only once the sync brought version 2 in
    assert dev.proc is not None
    assert "remote repositories synced in" in dev.proc.log()
