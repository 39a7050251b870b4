"""The local model store: the verified cache that remote repositories are synced into.

Layout under the state directory (--model-store-dir, else systemd's $STATE_DIRECTORY):

    models/<source>/<model>/config.pbtxt       a Triton repository the server loads from
    models/<source>/<model>/<version>/...      only ever complete, verified versions
    staging/<source>/<model>/<version>/...     downloads in progress; `*.part` resume
    trash/                                     versions being replaced, removed right after

A version reaches `models/` by one rename of its fully verified, fsynced staging folder, so
the server never sees a torn file, even after a power cut: a killed download leaves only a
`.part` file in staging, which the next sync resumes. Everything here is blocking file work:
call it from a thread.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import uuid
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

from appliance.repository.local import version_number
from appliance.repository.manifest import (
    MANIFEST,
    SYNC_RECORD,
    ManifestError,
    parse_manifest,
    sha256_of,
)

log = logging.getLogger(__name__)

MiB = 1024 * 1024
# The free space downloads leave by default: the smaller of these, so that a small store
# partition (a 150 MB one fetched nothing with a flat 256 MiB) still takes models.
DEFAULT_RESERVE_BYTES = 256 * MiB
DEFAULT_RESERVE_SHARE = 0.10


class DiskReserveError(OSError):
    """Writing would leave less free space than the configured reserve."""


FreeBytes = Callable[[Path], int]  # the free bytes of the file system holding a folder


def disk_free_bytes(folder: Path) -> int:
    """Free bytes an unprivileged writer may use on the file system holding `folder`."""
    return shutil.disk_usage(folder).free


def disk_total_bytes(folder: Path) -> int:
    """The size of the file system holding `folder`."""
    return shutil.disk_usage(folder).total


def reserve_bytes(configured: int | None, total_bytes: int) -> int:
    """Pure: the free space downloads must leave: `configured` (--model-store-reserve-mb), else
    the smaller of 256 MiB and 10% of the store's file system."""
    if configured is not None:
        return configured
    return min(DEFAULT_RESERVE_BYTES, int(total_bytes * DEFAULT_RESERVE_SHARE))


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: Path, data: bytes) -> None:
    """Replace `path` with `data`: a temp file, fsync, rename, fsync of the folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    with tmp.open("wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def read_record(folder: Path) -> dict[str, list[Any]]:
    """What a sync fetched into `folder`: relative path -> [etag, size, sha256] (the sha256
    only in versions stored since it was kept); {} when unknown."""
    try:
        data = json.loads((folder / SYNC_RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_record(folder: Path, record: dict[str, list[Any]]) -> None:
    write_atomically(folder / SYNC_RECORD, json.dumps(record, sort_keys=True).encode())


def with_hashes(folder: Path, record: dict[str, list[Any]]) -> dict[str, list[Any]]:
    """`record` with each file's sha256 added: the record's own where it has one (an OCI
    layer's digest, checked while it streamed), else the manifest's (the sync checked every
    listed file against it) where the folder has one, else computed (blocking)."""
    listed: dict[str, str] = {}
    if (folder / MANIFEST).is_file():
        try:
            listed = parse_manifest((folder / MANIFEST).read_text(encoding="utf-8"))
        except (ManifestError, UnicodeDecodeError):
            listed = {}
    return {
        rel: [*entry[:2], _sha256(entry, listed.get(rel), folder / rel)]
        for rel, entry in record.items()
    }


def _sha256(entry: list[Any], listed: str | None, path: Path) -> str:
    return str(entry[2]) if len(entry) > 2 else listed or sha256_of(path)


def damage_of(version_dir: Path) -> tuple[str, dict[str, str]]:
    """Whether a stored version still holds the bytes it was stored with: ('' and each file's
    sha256, checked) or (what is wrong, {}). A folder without a record with hashes (a local
    repository, a version stored before hashes were kept) says ('', {}) (blocking: hashes
    every file; 87 ms for a 32.7 MB DenseNet-121 here: docs/model-updates.md)."""
    checked: dict[str, str] = {}
    for rel, entry in sorted(read_record(version_dir).items()):
        if not isinstance(entry, list) or len(entry) < 3 or not isinstance(entry[2], str):
            continue
        path = version_dir / rel
        try:
            size = path.stat().st_size
        except OSError:
            return f"damaged in the store: '{rel}' is missing", {}
        if size != entry[1]:
            return f"damaged in the store: '{rel}' is {size} bytes, stored with {entry[1]}", {}
        if sha256_of(path) != entry[2]:
            return f"damaged in the store: '{rel}' no longer matches its stored sha256", {}
        checked[rel] = entry[2]
    return "", checked


def remove_damaged(version_dir: Path) -> None:
    """Take a damaged version out of the store (renamed aside first, then deleted): the next
    sync finds it missing and fetches it again (blocking)."""
    aside = version_dir.with_name(f".damaged-{version_dir.name}-{uuid.uuid4().hex[:8]}")
    try:
        os.replace(version_dir, aside)
    except OSError:
        return
    shutil.rmtree(aside, ignore_errors=True)


class PartFile:
    """A download in progress: appends, hashes as it goes, and resumes after a crash.

    `<name>.part` holds the bytes so far and `<name>.part-etag` the ETag they belong to; a
    part whose object has since changed is thrown away.
    """

    def __init__(self, final: Path, etag: str) -> None:
        self.final = final
        self.part = final.with_name(final.name + ".part")
        self._etag_file = final.with_name(final.name + ".part-etag")
        self.md5 = hashlib.md5(usedforsecurity=False)
        self.sha256 = hashlib.sha256()
        self.etag_is_md5 = True
        final.parent.mkdir(parents=True, exist_ok=True)
        try:
            resumable = self._etag_file.read_text() == etag and self.part.is_file()
        except OSError:
            resumable = False
        if not resumable:
            self.part.unlink(missing_ok=True)
            self._etag_file.write_text(etag)
        self._handle = self.part.open("ab")
        self.size = 0
        with self.part.open("rb") as existing:  # hash what an earlier run already fetched
            while chunk := existing.read(MiB):
                self._hash(chunk)

    def _hash(self, chunk: bytes) -> None:
        self.md5.update(chunk)
        self.sha256.update(chunk)
        self.size += len(chunk)

    def write(self, chunk: bytes) -> None:
        self._handle.write(chunk)
        self._hash(chunk)

    def flush(self) -> None:
        self._handle.flush()

    def discard(self) -> None:
        self._handle.close()
        self.part.unlink(missing_ok=True)
        self._etag_file.unlink(missing_ok=True)

    def commit(self) -> None:
        """fsync and rename to the final name."""
        self._handle.flush()
        os.fsync(self._handle.fileno())
        self._handle.close()
        os.replace(self.part, self.final)
        self._etag_file.unlink(missing_ok=True)

    def close(self) -> None:
        self._handle.close()


class ModelStore:
    """The folders of one remote source inside the state directory."""

    def __init__(
        self,
        state_dir: Path,
        source_id: str,
        reserve_bytes: int | None,
        free_bytes: FreeBytes = disk_free_bytes,
        total_bytes: FreeBytes = disk_total_bytes,
    ) -> None:
        self.state_dir = state_dir
        # Injected by tests: a disk of their own size.
        self._free_bytes, self._total_bytes = free_bytes, total_bytes
        self.root = state_dir / "models" / source_id
        self.staging = state_dir / "staging" / source_id
        self._trash = state_dir / "trash"
        self.configured_reserve_bytes = reserve_bytes  # None: scaled to the file system

    def open(self) -> None:
        for folder in (self.root, self.staging, self._trash):
            folder.mkdir(parents=True, exist_ok=True)
        for leftover in self._trash.iterdir():  # a replace interrupted by a crash
            shutil.rmtree(leftover, ignore_errors=True)

    def check_space(self, needed: int, what: str) -> None:
        """DiskReserveError, with the numbers, when writing `needed` bytes would leave less
        than the reserve free (blocking)."""
        free = self._free_bytes(self.state_dir)
        # The file system's size matters only to the default reserve (one statvfs less).
        configured = self.configured_reserve_bytes
        total = self._total_bytes(self.state_dir) if configured is None else 0
        reserve = reserve_bytes(configured, total)
        if free - needed < reserve:
            why = (
                "--model-store-reserve-mb"
                if self.configured_reserve_bytes is not None
                else f"--model-store-reserve-mb: by default the smaller of "
                f"{DEFAULT_RESERVE_BYTES // MiB} MiB and {DEFAULT_RESERVE_SHARE:.0%} of the "
                f"{total / MiB:.0f} MiB file system"
            )
            raise DiskReserveError(
                f"not enough disk for {what}: needs {needed / MiB:.1f} MiB, "
                f"{free / MiB:.1f} MiB free in '{self.state_dir}', and "
                f"{reserve / MiB:.1f} MiB must stay free ({why})"
            )

    def staged_bytes(self, model: str, version: int) -> int:
        folder = self.staging / model / str(version)
        total = 0
        for root, _, names in os.walk(folder):
            for name in names:
                with contextlib.suppress(OSError):
                    total += (Path(root) / name).stat().st_size
        return total

    def version_dir(self, model: str, version: int) -> Path:
        return self.root / model / str(version)

    def staging_dir(self, model: str, version: int) -> Path:
        return self.staging / model / str(version)

    def reuse(self, model: str, version: int, relpath: str) -> bool:
        """Hard-link (else copy) an unchanged file of the served copy into staging."""
        source = self.version_dir(model, version) / relpath
        target = self.staging_dir(model, version) / relpath
        if not source.is_file():
            return False
        target.parent.mkdir(parents=True, exist_ok=True)
        target.unlink(missing_ok=True)
        try:
            os.link(source, target)
        except OSError:
            shutil.copy2(source, target)
        return True

    def publish(self, model: str, version: int, record: dict[str, list[Any]]) -> None:
        """Move a fully verified staging folder into the repository in one rename."""
        staged = self.staging_dir(model, version)
        write_record(staged, with_hashes(staged, record))
        for root, _, _ in os.walk(staged):
            fsync_dir(Path(root))
        target = self.version_dir(model, version)
        target.parent.mkdir(parents=True, exist_ok=True)
        self._remove(target)
        os.replace(staged, target)
        fsync_dir(target.parent)

    def remove_version(self, model: str, version: int) -> None:
        self._remove(self.version_dir(model, version))
        shutil.rmtree(self.staging_dir(model, version), ignore_errors=True)

    def remove_model(self, model: str) -> None:
        self._remove(self.root / model)
        shutil.rmtree(self.staging / model, ignore_errors=True)

    def remove_unlisted(
        self, listed: Mapping[str, Collection[int]], only: set[str] | None, source: str
    ) -> tuple[set[str], list[tuple[str, int]]]:
        """Delete the models and version folders that `listed` (model -> versions, read from a
        good listing of `source`) no longer has; `only` limits it to those models. Returns the
        models changed and the (model, version) pairs removed."""
        changed: set[str] = set()
        removed: list[tuple[str, int]] = []
        if not self.root.is_dir():
            return changed, removed
        for folder in sorted(self.root.iterdir()):
            name = folder.name
            if not folder.is_dir() or (only is not None and name not in only):
                continue
            if name not in listed:
                log.info("model '%s' left %s; removing it from the store", name, source)
                self.remove_model(name)
                changed.add(name)
                continue
            for entry in folder.iterdir():
                version = version_number(entry.name)
                if version is not None and version not in listed[name] and entry.is_dir():
                    self.remove_version(name, version)
                    removed.append((name, version))
                    changed.add(name)
        return changed, removed

    def remove_model_file(self, model: str, relpath: str) -> None:
        (self.root / model / relpath).unlink(missing_ok=True)

    def _remove(self, folder: Path) -> None:
        """Rename aside first, so the repository never shows a half-deleted folder."""
        if not folder.exists():
            return
        aside = self._trash / uuid.uuid4().hex
        os.replace(folder, aside)
        shutil.rmtree(aside, ignore_errors=True)
