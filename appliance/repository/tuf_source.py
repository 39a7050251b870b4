"""TUF metadata mode for S3 repositories (--model-repository-tuf-root, docs/model-updates.md).

The bucket holds, beside the model folders, a TUF repository's metadata under
`<prefix>/.tuf/metadata/` (consistent snapshots: `N.root.json`, `N.snapshot.json`,
`N.targets.json`, and `timestamp.json`), written by `edge-appliance fleet keys | sign |
timestamp` (appliance/fleet/tuf_keys.py). Every file a device takes is a target of the
top-level targets role, its path `<model>/<version>/<file>` or `<model>/<file>` (model-level
files), stored at that key.

Each sync first refreshes the trusted metadata with python-tuf's `Updater` (root rotations,
timestamp -> snapshot -> targets; signatures and thresholds, versions that never go back,
expiry, lengths), through the source's own S3 client (tuf_fetch.py), and keeps it in the
state directory (`tuf/<source>/`), so trust survives restarts and never goes backwards. Only
then is the bucket's listing read, and it is replaced by the targets: a version is its
targets and nothing else (other files in its folder are never fetched), each downloaded
into staging, cut at its TUF length, checked by TUF's `verify_length_and_hashes`, and
the version published only when all its targets verified (s3.py's machinery: resume,
ledger, fleet plans). Metadata that does not verify stops the whole sync with a named reason
before anything in the store changes: what it holds keeps serving. Expired metadata is a
freeze: `frozen_since_s` says since when, and nothing new is taken until fresh metadata
arrives.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
from pathlib import Path
from typing import Any, NoReturn

from tuf.api import exceptions
from tuf.api.metadata import Metadata, Root, TargetFile, Targets
from tuf.ngclient import Updater, UpdaterConfig

from appliance.repository.rollout import ROLLOUT, ROLLOUT_SIGNATURE
from appliance.repository.s3 import RemoteObject, S3Source, SourceError
from appliance.repository.store import PartFile, read_record
from appliance.repository.tuf_fetch import SCHEME, S3Fetcher

log = logging.getLogger(__name__)

METADATA_PREFIX = ".tuf/metadata/"  # under the repository's prefix
# Bounds on what one refresh reads (python-tuf enforces them while streaming). A targets
# role lists every file of every model: ~250 bytes a target, so 5 MB is ~20,000 files.
CONFIG = UpdaterConfig(
    max_root_rotations=32,
    max_delegations=1,  # top-level targets only
    root_max_length=512_000,
    timestamp_max_length=16_384,
    snapshot_max_length=1_000_000,
    targets_max_length=5_000_000,
    # Targets keep their plain keys (the bucket stays a Triton repository); metadata
    # still comes as one consistent snapshot.
    prefix_targets_with_hash=False,
)
_REASONS: tuple[tuple[type[Exception], str], ...] = (
    (exceptions.ExpiredMetadataError, "expired (a freeze)"),
    (exceptions.EqualVersionNumberError, "a version replayed"),
    (exceptions.BadVersionNumberError, "a version check failed (a rollback or mix-and-match)"),
    (exceptions.UnsignedMetadataError, "not signed by a threshold of trusted keys"),
    (exceptions.LengthOrHashMismatchError, "a length or hash does not match the signed one"),
    (exceptions.DownloadLengthMismatchError, "longer than its bound"),
    (exceptions.DownloadHTTPError, "cannot be read"),
    (exceptions.DownloadError, "cannot be downloaded"),
    (exceptions.RepositoryError, "refused"),
)
_ROLLOUT_FILES = (ROLLOUT, ROLLOUT_SIGNATURE)


class TufError(ValueError):
    """The trusted root given to the server is not TUF root metadata."""


def check_root(data: bytes, where: str) -> None:
    """TufError unless `data` is signed TUF root metadata (its own threshold verified)."""
    try:
        root = Metadata[Root].from_bytes(data)
        root.signed.verify_delegate(Root.type, root.signed_bytes, root.signatures)
    except Exception as exc:
        raise TufError(f"'{where}' is not a trusted TUF root.json: {exc}") from exc
    if not isinstance(root.signed, Root):
        raise TufError(f"'{where}' is TUF {root.signed.type} metadata, not root")


def reason(exc: Exception) -> str:
    """A named reason for refused metadata: what kind of attack or fault, then python-tuf's."""
    kind = next((text for cls, text in _REASONS if isinstance(exc, cls)), "refused")
    return f"TUF metadata {kind}: {type(exc).__name__}: {exc}"


class TufSource(S3Source):
    """An S3 repository whose content is what its TUF targets metadata signs."""

    lengths_from = "its TUF target"

    def __init__(self, url: str, state_dir: Path, *args: Any, trusted_root: bytes, **kw: Any):
        super().__init__(url, state_dir, *args, **kw)
        self.trusted_root = trusted_root
        self.metadata_dir = state_dir / "tuf" / self.location.source_id
        self.tuf_problem = ""  # why the last refresh refused the metadata ('' : it did not)
        self._targets: dict[str, TargetFile] = {}  # target path -> its trusted entry

    # ---- the refresh ---------------------------------------------------------------------

    def _refresh(self, loop: asyncio.AbstractEventLoop) -> dict[str, TargetFile]:
        """Refresh the trusted metadata; every target, by path (blocking: run in a thread)."""
        self.metadata_dir.mkdir(parents=True, exist_ok=True)
        base = f"{SCHEME}{self.location.prefix}{METADATA_PREFIX}"
        updater = Updater(
            str(self.metadata_dir),
            base,
            target_base_url=f"{SCHEME}{self.location.prefix}",
            fetcher=S3Fetcher(self, self.location.bucket, loop, self.timeout_s),
            config=CONFIG,
            bootstrap=self.trusted_root,
        )
        updater.refresh()
        # The paths from the targets metadata the refresh just verified and kept; each
        # entry from the Updater itself.
        listed = Metadata[Targets].from_file(str(self.metadata_dir / "targets.json"))
        found: dict[str, TargetFile] = {}
        for path in sorted(listed.signed.targets):
            info = updater.get_targetinfo(path)
            if info is not None:
                found[path] = info
        return found

    def _expired_since(self) -> float:
        """When the trusted metadata expired: the earliest expiry already past (blocking)."""
        now = datetime.datetime.now(datetime.timezone.utc)
        past = []
        for role in ("timestamp", "snapshot", "targets"):
            try:
                expires = Metadata.from_file(str(self.metadata_dir / f"{role}.json")).signed.expires
            except Exception:  # a role not kept yet
                continue
            if expires <= now:
                past.append(expires.timestamp())
        return min(past) if past else time.time()

    async def _list_in_time(self) -> tuple[list[RemoteObject], float | None]:
        # The listing first, then the metadata: an object replaced in between is then one
        # whose ETag changed (retried at the next poll), never a sticky rejection.
        objects, bucket_now = await super()._list_in_time()
        loop = asyncio.get_running_loop()
        try:
            targets = await asyncio.to_thread(self._refresh, loop)
        except (exceptions.RepositoryError, exceptions.DownloadError, OSError) as exc:
            await self._refused(exc)
        self._targets = targets
        if self.frozen_since_s:
            log.info("%s: fresh TUF metadata; updates resume", self.url)
        self.frozen_since_s, self.tuf_problem = 0.0, ""
        return self._as_listing(objects), bucket_now

    async def _refused(self, exc: Exception) -> NoReturn:
        why = reason(exc)
        if isinstance(exc, exceptions.ExpiredMetadataError):
            if not self.frozen_since_s:
                self.frozen_since_s = await asyncio.to_thread(self._expired_since)
            why = f"updates frozen since {_utc(self.frozen_since_s)}: {why}"
        if why != self.tuf_problem:
            log.error("%s: %s; serving what the store holds, taking nothing new", self.url, why)
        self.tuf_problem = why
        raise SourceError(f"{self.url}: {why}") from exc

    def _as_listing(self, objects: list[RemoteObject]) -> list[RemoteObject]:
        """The listing as the sync sees it: each target at its TUF length (and the object's
        ETag, '' when the bucket has no such key yet), and the rollout documents."""
        prefix = self.location.prefix
        listed = {obj.key: obj for obj in objects}
        found = [
            obj
            for obj in objects
            if obj.key[len(prefix) :].count("/") == 1 and obj.key.endswith(_ROLLOUT_FILES)
        ]
        for path, info in self._targets.items():
            real = listed.get(prefix + path)
            found.append(
                RemoteObject(
                    key=prefix + path,
                    size=info.length,
                    etag=real.etag if real is not None else "",
                    modified=real.modified if real is not None else 0.0,
                )
            )
        return found

    # ---- a version's targets --------------------------------------------------------------

    async def _sync_version(
        self, name: str, version: int, files: dict[str, RemoteObject], bucket_now: float | None
    ) -> bool:
        await asyncio.to_thread(self._drop_unsigned, name, version)
        return await super()._sync_version(name, version, files, bucket_now)

    def _drop_unsigned(self, name: str, version: int) -> None:
        """A held version whose files are not what the targets sign (stored before TUF mode,
        from an object the targets do not match) leaves the store, to be fetched and checked
        like any other (blocking: reads the store's record of it)."""
        folder = self.store.version_dir(name, version)
        for rel, entry in read_record(folder).items():
            info = self._targets.get(f"{name}/{version}/{rel}")
            signed = info.hashes.get("sha256") if info is not None else None
            if signed is None or (len(entry) >= 3 and entry[2] == signed):
                continue
            log.warning(
                "model '%s' version %d: the store's '%s' is not what its TUF target signs; "
                "fetching the version again",
                name,
                version,
                rel,
            )
            self.store.remove_version(name, version)
            return

    async def _check_complete(
        self,
        name: str,
        version: int,
        files: dict[str, RemoteObject],
        previous: Any,
        bucket_now: float | None,
    ) -> dict[str, str | None] | None:
        missing = sorted(rel for rel, obj in files.items() if not obj.etag)
        if missing:
            self._set_pending(
                (name, version),
                f"waiting for {', '.join(missing[:10])} (TUF targets the bucket does not hold)",
                logging.INFO,
            )
            return None
        return dict.fromkeys(files)  # no sha256 of our own: TUF's check is the word

    async def _check_part(self, part: PartFile, obj: RemoteObject, sha256: str | None) -> str:
        why = await super()._check_part(part, obj, sha256)
        if why:
            return why
        info = self._targets.get(obj.key[len(self.location.prefix) :])
        if info is None:
            return "is not a TUF target"
        return await asyncio.to_thread(_tuf_verified, part, info)


def _tuf_verified(part: PartFile, info: TargetFile) -> str:
    """'' when the part's bytes are the target (TUF's length and hashes check), else why."""
    part.flush()
    try:
        with part.part.open("rb") as handle:
            info.verify_length_and_hashes(handle)
    except exceptions.LengthOrHashMismatchError as exc:
        return f"does not match its TUF target: {exc}"
    return ""


def _utc(when_s: float) -> str:
    return datetime.datetime.fromtimestamp(when_s, datetime.timezone.utc).strftime(
        "%Y-%m-%dT%H:%M:%SZ"
    )
