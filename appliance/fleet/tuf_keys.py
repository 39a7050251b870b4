"""The operator's side of TUF metadata mode: keys, signing, timestamps, root rotation.

`fleet keys KEYDIR` creates Ed25519 keys for the four top-level roles (as many per role as its
threshold) and root version 1, signed by the root keys; `fleet sign URL --tuf-keys KEYDIR`
makes every model file in the bucket a target and writes new targets, snapshot and timestamp
metadata (consistent snapshots: `N.targets.json`, `N.snapshot.json`, then `timestamp.json`
last, so a device never sees metadata whose files are not there); `fleet publish --tuf-keys`
signs after its upload; `fleet timestamp` signs a fresh timestamp (devices freeze when it
expires); `fleet rotate --role ROLE` replaces a role's keys through a new root version signed
by the old root keys and the new ones, and signs everything again with the new keys.

KEYDIR holds `<role>/<keyid>.pem` (the private keys, PKCS#8 PEM, mode 0600: keep the root
keys offline), `N.root.json` for every root version and `root.json`, the newest. A device's
`--model-repository-tuf-root` is any root version it may trust; it walks forward from there.
Signing is python-tuf's metadata API (`tuf.api.metadata`) with securesystemslib's signers.
"""

from __future__ import annotations

import datetime
import hashlib
import os
from pathlib import Path
from typing import Any

from securesystemslib.signer import CryptoSigner
from tuf.api.metadata import (
    TOP_LEVEL_ROLE_NAMES,
    Metadata,
    MetaFile,
    Root,
    Snapshot,
    TargetFile,
    Targets,
    Timestamp,
)
from tuf.api.serialization.json import JSONSerializer

from appliance.fleet.bucket import FleetBucket, FleetError
from appliance.repository.rollout import FLEET, ROLLOUT, ROLLOUT_SIGNATURE
from appliance.repository.tuf_source import METADATA_PREFIX

ROLES = ("root", "targets", "snapshot", "timestamp")
DAY = datetime.timedelta(days=1)
# Root and targets change rarely and are checked against the fresher roles; the timestamp
# is what says "this is still current": devices freeze once it expires.
DEFAULT_EXPIRY = {
    "root": 365 * DAY,
    "targets": 365 * DAY,
    "snapshot": 365 * DAY,
    "timestamp": DAY,
}
_SKIPPED_FILES = (ROLLOUT, ROLLOUT_SIGNATURE)
_PRETTY = JSONSerializer(compact=False)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)


def _write_private(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def _new_key(keydir: Path, role: str) -> CryptoSigner:
    signer = CryptoSigner.generate_ed25519()
    _write_private(keydir / role / f"{signer.public_key.keyid}.pem", signer.private_bytes)
    return signer


def _save_root(keydir: Path, root: Metadata[Root]) -> Path:
    data = root.to_bytes(_PRETTY)
    path = keydir / f"{root.signed.version}.root.json"
    path.write_bytes(data)
    (keydir / "root.json").write_bytes(data)
    return path


def load_root(keydir: Path) -> Metadata[Root]:
    try:
        return Metadata[Root].from_file(str(keydir / "root.json"))
    except Exception as exc:
        raise FleetError(
            f"'{keydir}' holds no TUF root.json (`fleet keys` makes it): {exc}"
        ) from exc


def signers(keydir: Path, root: Root, role: str) -> list[CryptoSigner]:
    """The private keys KEYDIR holds for a role of `root`."""
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    found = []
    for keyid in root.roles[role].keyids:
        path = keydir / role / f"{keyid}.pem"
        if path.is_file():
            private = load_pem_private_key(path.read_bytes(), None)
            # any key type loads; CryptoSigner refuses one that is not the root's Ed25519 key
            found.append(CryptoSigner(private, root.get_key(keyid)))  # type: ignore[arg-type]
    if len(found) < root.roles[role].threshold:
        raise FleetError(
            f"'{keydir}' holds {len(found)} of the {root.roles[role].threshold} {role} keys "
            "its root asks for"
        )
    return found


def _signed(metadata: Metadata[Any], keys: list[CryptoSigner]) -> bytes:
    metadata.signatures.clear()
    for key in keys:
        metadata.sign(key, append=True)
    return metadata.to_bytes(_PRETTY)


def create_keys(keydir: Path, thresholds: dict[str, int], expiry_days: float = 365) -> list[str]:
    """`fleet keys`: keys for every role and root version 1; the lines to print."""
    if (keydir / "root.json").exists():
        raise FleetError(f"'{keydir}' already holds a root.json; `fleet rotate` changes keys")
    root = Root(expires=_now() + datetime.timedelta(days=expiry_days), consistent_snapshot=True)
    made: dict[str, list[CryptoSigner]] = {}
    for role in ROLES:
        threshold = thresholds.get(role, 1)
        if threshold < 1:
            raise FleetError(f"the {role} threshold must be at least 1, got {threshold}")
        made[role] = [_new_key(keydir, role) for _ in range(threshold)]
        for signer in made[role]:
            root.add_key(signer.public_key, role)
        root.roles[role].threshold = threshold
    metadata = Metadata(root)
    _signed(metadata, made["root"])
    path = _save_root(keydir, metadata)
    return [
        f"{role}: {len(made[role])} key(s), threshold {root.roles[role].threshold}"
        for role in ROLES
    ] + [
        f"root version 1: {path} (give devices --model-repository-tuf-root {path}); keep "
        f"'{keydir / 'root'}' offline"
    ]


def _read(bucket: FleetBucket, name: str, cls: type[Any], root: Root) -> Metadata[Any] | None:
    """The bucket's metadata file, verified against our root (None: there is none)."""
    data = bucket.get(METADATA_PREFIX + name)
    if data is None:
        return None
    try:
        metadata: Metadata[Any] = Metadata.from_bytes(data)
        if not isinstance(metadata.signed, cls):
            raise ValueError(f"not {cls.type} metadata")
        root.verify_delegate(cls.type, metadata.signed_bytes, metadata.signatures)
    except Exception as exc:
        raise FleetError(
            f"the bucket's {METADATA_PREFIX}{name} does not verify with our root: {exc} "
            "(changed by someone else?)"
        ) from exc
    return metadata


def _current(bucket: FleetBucket, root: Root) -> tuple[Any, Any, Any]:
    """The bucket's timestamp, snapshot and targets (None where the bucket has none)."""
    timestamp = _read(bucket, "timestamp.json", Timestamp, root)
    if timestamp is None:
        return None, None, None
    version = timestamp.signed.snapshot_meta.version
    snapshot = _read(bucket, f"{version}.snapshot.json", Snapshot, root)
    if snapshot is None:
        return timestamp, None, None
    meta = snapshot.signed.meta["targets.json"]
    targets = _read(bucket, f"{meta.version}.targets.json", Targets, root)
    return timestamp, snapshot, targets


def _upload_roots(bucket: FleetBucket, keydir: Path, root: Root) -> None:
    for version in range(1, root.version + 1):
        name = f"{version}.root.json"
        if bucket.get(METADATA_PREFIX + name) is None:
            bucket.put(METADATA_PREFIX + name, (keydir / name).read_bytes())


def _model_objects(bucket: FleetBucket) -> list[Any]:
    """Every object that is a model file: not metadata, the fleet area or rollout documents."""
    objects, _ = bucket.listing("")
    found = []
    for obj in objects:
        rel = obj.key[len(bucket.prefix) :]
        parts = rel.split("/")
        if len(parts) < 2 or parts[0].startswith(".") or rel.endswith("/"):
            continue
        if parts[0] == FLEET or (len(parts) == 2 and parts[1] in _SKIPPED_FILES):
            continue
        found.append(obj)
    return found


def _target(bucket: FleetBucket, obj: Any, old: TargetFile | None, local: Path | None) -> Any:
    rel = obj.key[len(bucket.prefix) :]
    custom = {"etag": obj.etag}
    if local is not None:
        data = local.read_bytes()
        if len(data) != obj.size:
            raise FleetError(f"'{rel}' in the bucket is not the file '{local}' just uploaded")
    elif old is not None and old.length == obj.size and (old.custom or {}).get("etag") == obj.etag:
        return TargetFile(old.length, old.hashes, rel, {"custom": custom})
    else:
        data = bucket.get(rel) or b""
        if len(data) != obj.size:
            raise FleetError(f"'{rel}' changed while it was read; sign again")
    return TargetFile(
        len(data), {"sha256": hashlib.sha256(data).hexdigest()}, rel, {"custom": custom}
    )


def sign_bucket(
    bucket: FleetBucket,
    keydir: Path,
    local: dict[str, Path] | None = None,
    force: bool = False,
    expiry: dict[str, datetime.timedelta] | None = None,
    trust: Root | None = None,
) -> list[str]:
    """`fleet sign`: every model file of the bucket a target, then new targets, snapshot and
    timestamp metadata, the timestamp last. `local`: target path -> the file just uploaded
    (hashed here, not read back). `trust`: the root the bucket's current metadata was signed
    under (a rotation's previous one; default KEYDIR's). The lines to print."""
    expires = {**DEFAULT_EXPIRY, **(expiry or {})}
    root_md = load_root(keydir)
    root = root_md.signed
    _upload_roots(bucket, keydir, root)
    timestamp, snapshot, targets = _current(bucket, trust or root)
    old = targets.signed.targets if targets is not None else {}
    entries = {}
    for obj in _model_objects(bucket):
        rel = obj.key[len(bucket.prefix) :]
        entries[rel] = _target(bucket, obj, old.get(rel), (local or {}).get(rel))
    if targets is not None and entries == old and not force:
        return [f"targets version {targets.signed.version}: unchanged ({len(old)} targets)"]
    now = _now()
    new_targets = Metadata(
        Targets(
            version=(targets.signed.version + 1) if targets is not None else 1,
            expires=now + expires["targets"],
            targets=entries,
        )
    )
    targets_bytes = _signed(new_targets, signers(keydir, root, "targets"))
    new_snapshot = Metadata(
        Snapshot(
            version=(snapshot.signed.version + 1) if snapshot is not None else 1,
            expires=now + expires["snapshot"],
            meta={"targets.json": _meta(new_targets.signed.version, targets_bytes)},
        )
    )
    snapshot_bytes = _signed(new_snapshot, signers(keydir, root, "snapshot"))
    bucket.put(f"{METADATA_PREFIX}{new_targets.signed.version}.targets.json", targets_bytes)
    bucket.put(f"{METADATA_PREFIX}{new_snapshot.signed.version}.snapshot.json", snapshot_bytes)
    version = (timestamp.signed.version + 1) if timestamp is not None else 1
    _put_timestamp(
        bucket,
        keydir,
        root,
        version,
        new_snapshot.signed.version,
        snapshot_bytes,
        now + expires["timestamp"],
    )
    return [
        f"targets version {new_targets.signed.version}: {len(entries)} targets; snapshot "
        f"version {new_snapshot.signed.version}; timestamp version {version}, expires "
        f"{(now + expires['timestamp']).isoformat()}"
    ]


def _meta(version: int, data: bytes) -> MetaFile:
    return MetaFile(version, len(data), {"sha256": hashlib.sha256(data).hexdigest()})


def _put_timestamp(
    bucket: FleetBucket,
    keydir: Path,
    root: Root,
    version: int,
    snapshot_version: int,
    snapshot_bytes: bytes,
    expires: datetime.datetime,
) -> None:
    metadata = Metadata(
        Timestamp(
            version=version,
            expires=expires,
            snapshot_meta=_meta(snapshot_version, snapshot_bytes),
        )
    )
    bucket.put(
        METADATA_PREFIX + "timestamp.json", _signed(metadata, signers(keydir, root, "timestamp"))
    )


def refresh_timestamp(
    bucket: FleetBucket, keydir: Path, expires_in: datetime.timedelta = DAY
) -> list[str]:
    """`fleet timestamp`: the same snapshot under a new timestamp version that expires later."""
    root = load_root(keydir).signed
    timestamp, snapshot, _ = _current(bucket, root)
    if timestamp is None or snapshot is None:
        raise FleetError("the bucket has no TUF metadata yet: `fleet sign` first")
    version = snapshot.signed.version
    data = bucket.get(f"{METADATA_PREFIX}{version}.snapshot.json") or b""
    expires = _now() + expires_in
    _put_timestamp(bucket, keydir, root, timestamp.signed.version + 1, version, data, expires)
    return [f"timestamp version {timestamp.signed.version + 1}: expires {expires.isoformat()}"]


def rotate(
    bucket: FleetBucket,
    keydir: Path,
    role: str,
    threshold: int | None = None,
    expiry_days: float = 365,
) -> list[str]:
    """`fleet rotate`: new keys for `role` (the old ones revoked) in a new root version signed
    by the old root keys and the new; then every role signed again."""
    if role not in TOP_LEVEL_ROLE_NAMES:
        raise FleetError(f"--role must be one of {', '.join(ROLES)}, got {role!r}")
    old_md = load_root(keydir)
    old_signers = signers(keydir, old_md.signed, "root")
    root = Metadata[Root].from_bytes(old_md.to_bytes())
    count = threshold or root.signed.roles[role].threshold
    for keyid in list(root.signed.roles[role].keyids):
        root.signed.revoke_key(keyid, role)
        retired = keydir / role / f"{keyid}.pem"
        if retired.is_file():
            retired.rename(keydir / role / f"{keyid}.pem.retired")
    fresh = [_new_key(keydir, role) for _ in range(count)]
    for signer in fresh:
        root.signed.add_key(signer.public_key, role)
    root.signed.roles[role].threshold = count
    root.signed.version += 1
    root.signed.expires = _now() + datetime.timedelta(days=expiry_days)
    new_root_signers = fresh if role == "root" else signers(keydir, root.signed, "root")
    root.signatures.clear()
    for signer in [*old_signers, *new_root_signers]:
        root.sign(signer, append=True)
    path = _save_root(keydir, root)
    lines = [f"root version {root.signed.version}: {role} keys replaced ({count}); {path}"]
    _upload_roots(bucket, keydir, root.signed)
    if _current(bucket, old_md.signed)[0] is not None:
        lines += sign_bucket(bucket, keydir, force=True, trust=old_md.signed)
    return lines
