"""TUF metadata mode against the attacks secure updaters are built for (issue 33): a real S3
server (moto on loopback), the operator's commands (appliance/fleet/tuf_keys.py) writing the
metadata, the device's TufSource (python-tuf's Updater) syncing into a real store. Each
attack is refused with a named reason, and the store keeps the last good version.
"""

from __future__ import annotations

import asyncio
import datetime
import hashlib
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from securesystemslib.signer import CryptoSigner
from tuf.api.metadata import Metadata, Snapshot, TargetFile, Targets, Timestamp

from appliance.fleet import tuf_keys
from appliance.fleet.bucket import FleetBucket, FleetError
from appliance.repository.manifest import NO_MANIFEST_RULES, SYNC_RECORD
from appliance.repository.s3 import S3Source, SourceError
from appliance.repository.tuf_source import METADATA_PREFIX, TufSource
from tests.s3servers import S3Server, moto_server

CONFIG = b'name: "m"\nplatform: "onnxruntime_onnx"\n'
HOUR = datetime.timedelta(hours=1)


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with moto_server() as server:
        yield server


@pytest.fixture(autouse=True)
def no_temp_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Nothing is written outside the store: not even an anonymous temporary file."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    yield
    assert not list(temp.iterdir())


class Repo:
    """A bucket, the operator's keys (targets threshold 2) and a device's TufSource."""

    def __init__(self, s3: S3Server, tmp_path: Path) -> None:
        self.name = f"t-{uuid.uuid4().hex[:12]}"
        s3.make_bucket(self.name)
        self.client = s3.client()
        self.url = f"s3://{s3.host_port}/{self.name}/models"
        self.keys = tmp_path / "keys"
        tuf_keys.create_keys(self.keys, {"targets": 2})
        self.fleet = FleetBucket(self.url)
        self.store = tmp_path / "store"

    def put(self, rel: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.name, Key=f"models/{rel}", Body=data)

    def get(self, rel: str) -> bytes:
        return bytes(self.client.get_object(Bucket=self.name, Key=f"models/{rel}")["Body"].read())

    def sign(self, **expiry: datetime.timedelta) -> None:
        tuf_keys.sign_bucket(self.fleet, self.keys, expiry=expiry or None)

    def version(self, version: int, data: bytes) -> None:
        self.put("m/config.pbtxt", CONFIG)
        self.put(f"m/{version}/model.onnx", data)
        self.sign()

    def source(self) -> TufSource:
        root = (self.keys / "1.root.json").read_bytes()
        return TufSource(self.url, self.store, 0, NO_MANIFEST_RULES, trusted_root=root, timeout_s=5)

    def held(self) -> dict[str, bytes]:
        """The store's files (its bookkeeping left out)."""
        root = self.store / "models"
        return {
            p.relative_to(root).as_posix().split("/", 1)[1]: p.read_bytes()
            for p in root.rglob("*")
            if p.is_file() and p.name != SYNC_RECORD
        }

    def signer(self, role: str, index: int = 0) -> CryptoSigner:
        root = tuf_keys.load_root(self.keys).signed
        return tuf_keys.signers(self.keys, root, role)[index]


@pytest.fixture
def repo(s3: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Repo:
    for key, value in s3.env().items():
        monkeypatch.setenv(key, value)
    return Repo(s3, tmp_path)


async def _sync(source: TufSource) -> set[str]:
    async with source.opened():
        return await asyncio.wait_for(source.sync(), 30)


async def _refused(source: TufSource) -> str:
    with pytest.raises(SourceError) as caught:
        await _sync(source)
    assert source.reachable is False
    return str(caught.value)


async def _good_start(repo: Repo) -> TufSource:
    """Version 1 signed and synced: the last good one every attack must leave serving."""
    repo.version(1, b"one" * 100)
    source = repo.source()
    assert await _sync(source) == {"m"}
    assert repo.held() == {"m/config.pbtxt": CONFIG, "m/1/model.onnx": b"one" * 100}
    return source


async def test_signed_versions_sync_and_files_that_are_no_targets_never_do(repo: Repo) -> None:
    source = await _good_start(repo)
    repo.put("m/1/extra.bin", b"unsigned")  # not a target: never fetched
    repo.put("m/3/model.onnx", b"unsigned version")
    assert await _sync(source) == set()
    assert "m/1/extra.bin" not in repo.held()
    assert (source.metadata_dir / "timestamp.json").is_file()  # trust kept in the state dir
    repo.sign()  # the operator signs them: now they are targets
    assert await _sync(source) == {"m"}
    assert repo.held()["m/3/model.onnx"] == b"unsigned version"


async def test_a_tampered_target_is_refused_and_the_last_good_serves(repo: Repo) -> None:
    source = await _good_start(repo)
    repo.version(2, b"two" * 100)
    repo.put("m/2/model.onnx", b"evi" * 100)  # same length, other bytes
    await _sync(source)
    assert "does not match its TUF target" in source.pending[("m", 2)]
    assert source.pending[("m", 2)].startswith("rejected:")
    assert "m/2/model.onnx" not in repo.held()
    assert repo.held()["m/1/model.onnx"] == b"one" * 100


async def test_endless_data_is_cut_at_the_signed_length(repo: Repo) -> None:
    source = await _good_start(repo)
    repo.version(2, b"two" * 100)
    repo.put("m/2/model.onnx", b"two" * 100 + b"x" * (2 << 20))  # 2 MiB more than signed
    await _sync(source)
    assert "longer than the 300 bytes its TUF target gives" in source.pending[("m", 2)]
    staged = [p for p in repo.store.rglob("*") if p.is_file() and "/2/" in p.as_posix()]
    assert all(p.stat().st_size <= 300 for p in staged)
    assert "m/2/model.onnx" not in repo.held()


async def test_a_rollback_to_older_signed_metadata_is_refused(repo: Repo) -> None:
    source = await _good_start(repo)
    old = {n: repo.get(METADATA_PREFIX + n) for n in ("timestamp.json", "1.snapshot.json")}
    repo.version(2, b"two" * 100)
    assert await _sync(source) == {"m"}
    # The attacker replays the older, validly signed timestamp (which lists no version 2).
    repo.put(METADATA_PREFIX + "timestamp.json", old["timestamp.json"])
    why = await _refused(source)
    assert "a version check failed (a rollback or mix-and-match)" in why
    assert "m/2/model.onnx" in repo.held()  # nothing removed, nothing taken
    assert source.tuf_problem in why


async def test_an_expired_timestamp_freezes_updates_visibly(repo: Repo) -> None:
    source = await _good_start(repo)
    repo.put("m/2/model.onnx", b"two" * 100)
    repo.sign(timestamp=-HOUR)  # the bucket keeps answering metadata that has expired
    why = await _refused(source)
    assert "updates frozen since" in why
    assert "ExpiredMetadataError" in why
    assert source.frozen_since_s > 0
    assert "m/2/model.onnx" not in repo.held()
    assert repo.held()["m/1/model.onnx"] == b"one" * 100
    tuf_keys.refresh_timestamp(repo.fleet, repo.keys)  # fresh metadata: updates resume
    assert await _sync(source) == {"m"}
    assert source.frozen_since_s == 0
    assert source.tuf_problem == ""
    assert "m/2/model.onnx" in repo.held()


async def test_targets_of_another_snapshot_are_refused(repo: Repo) -> None:
    repo.version(1, b"one" * 100)
    repo.version(2, b"two" * 100)
    # Mix-and-match: the current timestamp and snapshot, with the targets of the first one.
    repo.put(METADATA_PREFIX + "2.targets.json", repo.get(METADATA_PREFIX + "1.targets.json"))
    source = repo.source()
    why = await _refused(source)
    assert "TUF metadata" in why
    assert "LengthOrHashMismatchError" in why or "BadVersionNumberError" in why
    assert not (repo.store / "models").exists() or repo.held() == {}


def _forge(repo: Repo, targets_keys: list[CryptoSigner], path: str, data: bytes) -> None:
    """An attacker who holds the snapshot and timestamp keys and `targets_keys` adds a target."""
    current = Metadata[Targets].from_bytes(repo.get(METADATA_PREFIX + "1.targets.json"))
    for name in ("2.targets.json", "3.targets.json"):
        try:
            current = Metadata[Targets].from_bytes(repo.get(METADATA_PREFIX + name))
        except Exception:
            break
    forged = current.signed
    forged.version += 1
    forged.targets[path] = TargetFile(len(data), {"sha256": hashlib.sha256(data).hexdigest()}, path)
    repo.put(path, data)
    md = Metadata(forged)
    for key in targets_keys:
        md.sign(key, append=True)
    targets_bytes = md.to_bytes()
    repo.put(f"{METADATA_PREFIX}{forged.version}.targets.json", targets_bytes)
    ts = Metadata[Timestamp].from_bytes(repo.get(METADATA_PREFIX + "timestamp.json"))
    snapshot = Metadata[Snapshot].from_bytes(
        repo.get(f"{METADATA_PREFIX}{ts.signed.snapshot_meta.version}.snapshot.json")
    )
    snapshot.signed.version += 1
    snapshot.signed.meta["targets.json"] = tuf_keys._meta(forged.version, targets_bytes)
    snapshot.sign(repo.signer("snapshot"))
    snapshot_bytes = snapshot.to_bytes()
    repo.put(f"{METADATA_PREFIX}{snapshot.signed.version}.snapshot.json", snapshot_bytes)
    ts.signed.version += 1
    ts.signed.snapshot_meta = tuf_keys._meta(snapshot.signed.version, snapshot_bytes)
    ts.sign(repo.signer("timestamp"))
    repo.put(METADATA_PREFIX + "timestamp.json", ts.to_bytes())


async def test_one_compromised_key_below_the_threshold_is_refused(repo: Repo) -> None:
    source = await _good_start(repo)
    _forge(repo, [repo.signer("targets", 0)], "m/2/model.onnx", b"evil")  # 1 of 2
    why = await _refused(source)
    assert "not signed by a threshold of trusted keys" in why
    assert "m/2/model.onnx" not in repo.held()
    assert repo.held()["m/1/model.onnx"] == b"one" * 100


async def test_a_rotated_out_key_is_refused(repo: Repo) -> None:
    source = await _good_start(repo)
    old = [repo.signer("targets", 0), repo.signer("targets", 1)]
    tuf_keys.rotate(repo.fleet, repo.keys, "targets")  # root 2, targets signed anew
    assert await _sync(source) == set()  # the device walks to root 2
    assert (source.metadata_dir / "root_history" / "2.root.json").is_file()
    genuine = repo.get(METADATA_PREFIX + "timestamp.json")
    _forge(repo, old, "m/2/model.onnx", b"evil")  # both old keys: a full old threshold
    why = await _refused(source)
    assert "not signed by a threshold of trusted keys" in why
    assert "m/2/model.onnx" not in repo.held()
    # The operator's own signing refuses to build on the forged metadata ...
    with pytest.raises(FleetError, match="does not verify with our root"):
        repo.sign()
    # ... puts the genuine timestamp back, rotates the snapshot and timestamp keys the attacker
    # also held (the device then drops the forged ones it had checked) and goes on.
    repo.put(METADATA_PREFIX + "timestamp.json", genuine)
    repo.client.delete_object(Bucket=repo.name, Key="models/m/2/model.onnx")
    tuf_keys.rotate(repo.fleet, repo.keys, "snapshot")
    tuf_keys.rotate(repo.fleet, repo.keys, "timestamp")
    repo.version(3, b"three")
    assert await _sync(source) == {"m"}
    assert repo.held()["m/3/model.onnx"] == b"three"


async def test_trust_survives_a_restart_and_never_goes_back(repo: Repo) -> None:
    await _good_start(repo)
    old = repo.get(METADATA_PREFIX + "timestamp.json")
    repo.version(2, b"two" * 100)
    assert await _sync(repo.source()) == {"m"}
    repo.put(METADATA_PREFIX + "timestamp.json", old)
    # A new source (a restarted device) with only the initial root given: the kept
    # metadata still says version 2, so the replay is refused.
    why = await _refused(repo.source())
    assert "BadVersionNumberError" in why
    assert (repo.source().metadata_dir / "root_history" / "1.root.json").is_file()


async def test_the_operators_commands_make_a_repository_a_device_takes(
    repo: Repo, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from appliance.fleet import ops

    keys = tmp_path / "cli-keys"
    assert ops.main(["keys", str(keys), "--targets-threshold", "2"]) == 0
    assert (keys / "1.root.json").is_file()
    assert len(list((keys / "targets").glob("*.pem"))) == 2
    assert ops.main(["keys", str(keys)]) == 1
    assert "already holds a root.json" in capsys.readouterr().err
    folder = tmp_path / "v1"
    folder.mkdir()
    (folder / "model.onnx").write_bytes(b"one" * 10)
    model_files = tmp_path / "model-files"
    model_files.mkdir()
    (model_files / "config.pbtxt").write_bytes(CONFIG)
    published = ["publish", repo.url, "m", str(folder), "--version", "1"]
    flags = ["--model-files", str(model_files), "--tuf-keys", str(keys)]
    assert ops.main([*published, *flags]) == 0
    assert "targets version 1:" in capsys.readouterr().out
    assert ops.main(["sign", repo.url, "--tuf-keys", str(keys)]) == 0
    assert "unchanged" in capsys.readouterr().out
    assert ops.main(["timestamp", repo.url, "--tuf-keys", str(keys), "--expires-hours", "2"]) == 0
    assert "timestamp version 2" in capsys.readouterr().out
    assert ops.main(["rotate", repo.url, "--tuf-keys", str(keys), "--role", "targets"]) == 0
    assert "root version 2" in capsys.readouterr().out
    source = TufSource(
        repo.url,
        repo.store,
        0,
        NO_MANIFEST_RULES,
        trusted_root=(keys / "1.root.json").read_bytes(),
        timeout_s=5,
    )
    assert await _sync(source) == {"m"}
    assert repo.held()["m/1/model.onnx"] == b"one" * 10
    assert repo.held()["m/config.pbtxt"] == CONFIG


async def test_a_held_version_that_the_targets_do_not_sign_leaves_the_store(
    repo: Repo, tmp_path: Path
) -> None:
    # Stored before TUF mode, from a bucket object someone had replaced ...
    repo.put("m/config.pbtxt", CONFIG)
    repo.put("m/1/model.onnx", b"evi" * 100)
    plain = S3Source(repo.url, repo.store, 0, NO_MANIFEST_RULES, settle_s=0, timeout_s=5)
    async with plain.opened():
        await plain.sync()
    assert repo.held()["m/1/model.onnx"] == b"evi" * 100
    # ... which the operator's signing (hashing the release's own files) does not vouch for.
    good = tmp_path / "model.onnx"
    good.write_bytes(b"one" * 100)
    tuf_keys.sign_bucket(repo.fleet, repo.keys, local={"m/1/model.onnx": good})
    source = repo.source()
    await _sync(source)
    assert "m/1/model.onnx" not in repo.held()
    assert "does not match its TUF target" in source.pending[("m", 1)]
