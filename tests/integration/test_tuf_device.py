"""A real server in TUF metadata mode (--model-repository-tuf-root) on a real S3 server (moto):
a freeze is visible everywhere the device reports (readiness detail, status.json, metrics)
while the last good version serves, and a kill -9 in the middle of an update leaves trust and
store consistent, versions never going backwards (issue 33)."""

from __future__ import annotations

import datetime
import json
import signal
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tuf.api.metadata import Metadata

from appliance.fleet import tuf_keys
from appliance.fleet.bucket import FleetBucket
from tests.integration.test_s3_repository import (
    CONFIG,
    Bucket,
    _added,
    _metric,
    _model_bytes,
    _wait_for,
)
from tests.s3servers import S3Server, moto_server

POLL = ("--model-control-mode=poll", "--repository-poll-secs=0.3")


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with moto_server() as server:
        yield server


class TufBucket:
    def __init__(self, s3: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        for key, value in s3.env().items():
            monkeypatch.setenv(key, value)
        self.bucket = Bucket(s3)
        self.keys = tmp_path / "keys"
        tuf_keys.create_keys(self.keys, {})
        self.fleet = FleetBucket(self.bucket.url)
        self.store = tmp_path / "store"
        self.env = s3.env()

    def publish(self, version: int, padding: int = 0, **expiry: datetime.timedelta) -> None:
        self.bucket.put("m/config.pbtxt", CONFIG.encode())
        self.bucket.put(f"m/{version}/model.onnx", _model_bytes(version, padding))
        tuf_keys.sign_bucket(self.fleet, self.keys, expiry=expiry or None)

    def start(self, start_server: Any, *flags: str, wait: bool = True) -> Any:
        return start_server(
            self.bucket.url,
            f"--model-store-dir={self.store}",
            f"--model-repository-tuf-root={self.keys / '1.root.json'}",
            *POLL,
            *flags,
            env=self.env,
            wait=wait,
        )

    def trusted_timestamp(self) -> int:
        found = list(self.store.glob("tuf/*/timestamp.json"))
        return Metadata.from_file(str(found[0])).signed.version if found else 0


@pytest.fixture
def tuf(s3: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> TufBucket:
    return TufBucket(s3, tmp_path, monkeypatch)


def _json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def test_a_freeze_is_visible_and_the_last_good_version_serves(
    start_server: Any, tuf: TufBucket
) -> None:
    tuf.publish(1)
    proc = tuf.start(start_server, "--repository-sync-wait-secs=60")
    assert _added(proc.http_url) == 1.0
    assert _metric(proc, "edge_repository_updates_frozen") == 0
    tuf.publish(2, timestamp=-datetime.timedelta(hours=1))  # signed, but already expired
    _wait_for(lambda: _metric(proc, "edge_repository_updates_frozen") == 1)
    ready = _json(f"http://{proc.http_url}/v2/health/ready?verbose=true")
    assert any("updates frozen since" in p for p in ready["problems"]), ready
    source = _json(f"http://{proc.http_url}/status.json")["updates"]["sources"][0]
    assert source["frozen_since_s"] > 0
    assert "ExpiredMetadataError" in source["last_error"]
    assert _added(proc.http_url) == 1.0  # nothing new taken
    assert "updates frozen since" in proc.log()
    tuf_keys.refresh_timestamp(tuf.fleet, tuf.keys)  # fresh metadata: updates resume
    _wait_for(lambda: _added(proc.http_url) == 2.0)
    assert _metric(proc, "edge_repository_updates_frozen") == 0


def test_kill_9_during_updates_keeps_trust_and_store_consistent(
    start_server: Any, tuf: TufBucket
) -> None:
    tuf.publish(1)
    proc = tuf.start(start_server, "--repository-sync-wait-secs=60")
    served, trusted = 1.0, tuf.trusted_timestamp()
    # 1 MiB of padding at 4 Mbit/s: each update takes ~2 s, long enough to be cut.
    limit = "--model-download-limit-mbps=4"
    proc.stop()
    for version in (2, 3):
        tuf.publish(version, padding=1 << 20)
        proc = tuf.start(start_server, limit)
        assert _added(proc.http_url) == served  # the store serves at once, before any sync
        staging = tuf.store / "staging"
        _wait_for(lambda s=staging: any(p.stat().st_size for p in s.rglob("*.part")))
        proc.proc.send_signal(signal.SIGKILL)
        proc.proc.wait()
        # Trust moved forward (the new metadata was checked before the download began), the
        # store did not: the version being fetched is not in it, half or whole.
        assert tuf.trusted_timestamp() > trusted
        trusted = tuf.trusted_timestamp()
        held = tuf.store.glob(f"models/*/m/{version}")
        assert not list(held)
        proc = tuf.start(start_server, "--repository-sync-wait-secs=60")
        assert _added(proc.http_url) == float(version)  # resumed and verified
        assert tuf.trusted_timestamp() >= trusted
        served = float(version)
        proc.stop()
