"""The sync against an endpoint that lies (tests/lying_s3.py): bodies longer than listed,
listings that never end, bookkeeping files and rollout documents too big to fetch. Issue 31
items 3 and 9: what the device spends is bounded by its caps, not by the endpoint."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from appliance.repository import s3 as s3_module
from appliance.repository.fleet_agent import FleetAgent
from appliance.repository.manifest import NO_MANIFEST_RULES, SYNC_RECORD
from appliance.repository.rollout import MAX_ROLLOUT_BYTES, DeviceIdentity
from appliance.repository.s3 import MAX_MANIFEST_BYTES, S3Source, SourceError
from tests.lying_s3 import Listed, LyingS3

CONFIG = b'name: "m"\nplatform: "onnxruntime_onnx"\n'
# Old code without caps loops for ever on a listing that never ends: fail instead of hanging.
_SYNC_S = 30.0


@pytest.fixture
async def lying(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[LyingS3]:
    for key, value in {
        "AWS_ACCESS_KEY_ID": "k",
        "AWS_SECRET_ACCESS_KEY": "s",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
    }.items():
        monkeypatch.setenv(key, value)
    async with LyingS3() as server:
        yield server


def _source(lying: LyingS3, tmp_path: Path) -> S3Source:
    return S3Source(lying.url("models"), tmp_path / "store", 0, NO_MANIFEST_RULES, timeout_s=5)


def _good_model(lying: LyingS3, name: str) -> None:
    lying.objects[f"models/{name}/config.pbtxt"] = Listed(len(CONFIG), CONFIG)
    lying.objects[f"models/{name}/1/model.onnx"] = Listed(50, b"w" * 50)


async def test_a_body_longer_than_listed_fails_that_object_and_nothing_past_it_is_written(
    lying: LyingS3, tmp_path: Path
) -> None:
    _good_model(lying, "ok")
    lying.objects["models/m/config.pbtxt"] = Listed(len(CONFIG), CONFIG)
    lying.objects["models/m/1/model.onnx"] = Listed(100, b"x" * (4 << 20))  # 4 MiB sent
    source = _source(lying, tmp_path)
    async with source.opened():
        changed = await asyncio.wait_for(source.sync(), _SYNC_S)
    assert changed == {"ok", "m"}  # m's config arrived; its version did not
    assert (source.root / "ok" / "1" / "model.onnx").read_bytes() == b"w" * 50
    assert not (source.root / "m" / "1").exists()
    assert source.pending[("m", 1)] == (
        "rejected: 'models/m/1/model.onnx' is longer than the 100 bytes the listing gives"
    )
    # What was written to the store's disk: the listed sizes, not the 4 MiB the endpoint sent.
    assert source.downloaded_bytes <= 2 * len(CONFIG) + 50 + 101
    # (the store's own sync records, with each file's hash, are not the endpoint's bytes)
    largest = max(
        p.stat().st_size
        for p in (tmp_path / "store").rglob("*")
        if p.is_file() and p.name != SYNC_RECORD
    )
    assert largest <= 100
    assert source.reachable is True


async def test_a_listing_that_never_ends_fails_the_sync_at_its_cap(
    lying: LyingS3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(s3_module, "MAX_LISTING_PAGES", 30, raising=False)
    lying.pages = lambda token: ({}, f"t{int((token or 't0')[1:]) + 1}")  # empty, truncated
    source = _source(lying, tmp_path)
    async with source.opened():
        with pytest.raises(SourceError, match="still truncated after 30 pages"):
            await asyncio.wait_for(source.sync(), _SYNC_S)
    assert lying.listings == 30
    assert source.reachable is False


async def test_a_listing_that_repeats_its_token_fails_at_once(
    lying: LyingS3, tmp_path: Path
) -> None:
    lying.pages = lambda token: ({}, "again")
    source = _source(lying, tmp_path)
    async with source.opened():
        with pytest.raises(SourceError, match="without a new continuation token"):
            await asyncio.wait_for(source.sync(), _SYNC_S)
    assert lying.listings == 2


async def test_a_listing_keeps_at_most_its_cap_of_keys(
    lying: LyingS3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(s3_module, "MAX_LISTED_KEYS", 50, raising=False)

    def pages(token: str | None) -> tuple[dict[str, Listed], str]:
        page = int((token or "t0")[1:])
        keys = {f"models/m{page:06d}/1/f{i:03d}": Listed(1) for i in range(20)}
        return keys, f"t{page + 1}"

    lying.pages = pages
    source = _source(lying, tmp_path)
    async with source.opened():
        with pytest.raises(SourceError, match="more than 50 keys under 'models/'"):
            await asyncio.wait_for(source.sync(), _SYNC_S)
    assert lying.listings == 3  # 20 + 20 + the 11th key of the third page
    assert lying.gets == []


async def test_a_huge_manifest_is_refused_before_a_byte_of_it_is_fetched(
    lying: LyingS3, tmp_path: Path
) -> None:
    _good_model(lying, "ok")
    lying.objects["models/m/1/model.onnx"] = Listed(10, b"0123456789")
    lying.objects["models/m/1/SHA256SUMS"] = Listed(256 << 20, b"")  # listed as 256 MiB
    source = _source(lying, tmp_path)
    async with source.opened():
        await asyncio.wait_for(source.sync(), _SYNC_S)
    assert source.pending[("m", 1)] == (
        f"rejected: SHA256SUMS is {256 << 20} bytes, more than the {MAX_MANIFEST_BYTES} it may "
        "have"
    )
    assert "models/m/1/SHA256SUMS" not in lying.gets
    assert (source.root / "ok" / "1" / "model.onnx").is_file()


async def test_rollout_documents_over_their_cap_are_not_read_whole(
    lying: LyingS3, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Item 9: a 200 MB document was downloaded whole before it was refused."""
    _good_model(lying, "ok")
    _good_model(lying, "m")
    _good_model(lying, "n")
    lying.objects["models/m/rollout.json"] = Listed(200_000_000, b"{}")  # listed as 200 MB
    lying.objects["models/n/rollout.json"] = Listed(100, b"[" * (4 << 20))  # sends 4 MiB
    source = _source(lying, tmp_path)
    FleetAgent(source, DeviceIdentity("dev-1"), 0, False)
    caplog.set_level(logging.ERROR, "appliance.repository.fleet_agent")
    async with source.opened():
        changed = await asyncio.wait_for(source.sync(), _SYNC_S)
    assert "models/m/rollout.json" not in lying.gets
    logged = caplog.text
    assert f"rollout.json is 200000000 bytes, more than the {MAX_ROLLOUT_BYTES} it may" in logged
    assert f"rollout.json is over the {MAX_ROLLOUT_BYTES} bytes it may have" in logged
    # A model whose first document cannot be read takes no new version; the others sync.
    assert changed == {"ok", "m", "n"}
    assert (source.root / "ok" / "1" / "model.onnx").is_file()
    assert not (source.root / "m" / "1").exists()
    assert source.reachable is True


async def test_a_reason_names_a_few_files_not_every_one(lying: LyingS3, tmp_path: Path) -> None:
    """A manifest naming thousands of missing files made a 42 MB log line at every poll."""
    names = [f"weights-{i:05d}.bin" for i in range(5000)]
    manifest = "".join(f"{'0' * 64}  {name}\n" for name in names).encode()
    assert len(manifest) <= MAX_MANIFEST_BYTES
    lying.objects["models/m/1/SHA256SUMS"] = Listed(len(manifest), manifest)
    lying.objects["models/m/1/weights-00000.bin"] = Listed(1, b"w")
    source = _source(lying, tmp_path)
    async with source.opened():
        await asyncio.wait_for(source.sync(), _SYNC_S)
    shown = ", ".join(names[1:11])
    assert source.pending[("m", 1)] == (
        f"incomplete: waiting for {shown} and 4989 more (listed in SHA256SUMS)"
    )
