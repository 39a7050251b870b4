"""OCI registry model repositories: the artifacts an index pins, synced into the model store.

The layout is in oci_registry.py (and docs/model-updates.md, "OCI registries"). A sync reads
the index manifest (one request when nothing changed: its digest is the one already acted on),
then, for each model and version whose pinned digest the store does not hold yet, the artifact's
manifest by that digest and only the layers the store lacks: a layer whose digest a stored
version of the model already holds is hard-linked from it, the others are downloaded into
staging (`*.part` resumes after a crash, by a Range request), each hashed while it streams and
cut at its descriptor's size. A version reaches the store whole (store.py); one whose content
does not match the digests is recorded in the ledger and not fetched again until the index pins
other content for it. What the store held keeps serving whatever the registry does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from appliance.repository.ledger import VERIFICATION, ModelLedger, record_failure
from appliance.repository.local import version_number
from appliance.repository.manifest import ManifestPolicy
from appliance.repository.oci_registry import (
    INDEX_TAG,
    MAX_INDEX_BYTES,
    MAX_MANIFEST_BYTES,
    ContentRejected,
    Descriptor,
    ModelEntry,
    NotInRegistry,
    OciLocation,
    Registry,
    RegistryError,
    artifact_files,
    digest_of,
    parse_index,
    parse_manifest,
)
from appliance.repository.s3 import DownloadProgress, SourceError
from appliance.repository.store import (
    DiskReserveError,
    FreeBytes,
    ModelStore,
    PartFile,
    disk_free_bytes,
    read_record,
    write_record,
)

log = logging.getLogger(__name__)

_CHUNK = 1 << 20
_FETCH_ATTEMPTS = 5  # a blob's attempts, each resuming where the last one stopped
_BACKOFF_S = 0.5


class _Transient(Exception):
    """A download cut short (connection reset, timeout): retried, resuming."""


def _held(record: dict[str, list[Any]]) -> dict[str, tuple[str, int]]:
    return {rel: (str(v[0]), int(v[1])) for rel, v in record.items() if len(v) >= 2}


def _wanted(files: dict[str, Descriptor]) -> dict[str, tuple[str, int]]:
    return {rel: (d.digest, d.size) for rel, d in files.items()}


class OciSource:
    """One oci:// repository, synced into its folder of the model store (the same members as
    s3.S3Source that the poller, control plane, status page and metrics read)."""

    def __init__(
        self,
        url: str,
        state_dir: Path,
        reserve_bytes: int | None,
        manifest: ManifestPolicy,
        rate_bytes_s: float = 0.0,
        free_bytes: FreeBytes = disk_free_bytes,
        ledger: ModelLedger | None = None,
        timeout_s: float = 10.0,
    ) -> None:
        self.location = OciLocation.parse(url)
        self.url = url
        self.ledger = ledger or ModelLedger(None)
        self.store = ModelStore(state_dir, self.location.source_id, reserve_bytes, free_bytes)
        self.manifest = manifest  # the loader checks SHA256SUMS (and signatures) as anywhere
        self.rate_bytes_s = rate_bytes_s
        self.timeout_s = timeout_s
        self.reachable: bool | None = None
        self.last_error = ""
        self.last_sync_s = 0.0
        self.downloaded_bytes = 0
        self.pending: dict[tuple[str, int], str] = {}
        self.skipped: dict[str, str] = {}
        self.fleet: Any = None  # rollouts follow S3 buckets only
        self.frozen_since_s = 0.0  # TUF metadata mode is for S3 only: an index never expires
        self._registry: Registry | None = None
        self._lock = asyncio.Lock()
        # The index acted on (its manifest's digest and models), and per (model, version) or
        # (model, -1: model files) the artifact digest the store holds.
        self._index: tuple[str, dict[str, ModelEntry], dict[str, str]] | None = None
        self._synced: dict[tuple[str, int], str] = {}
        self._download: tuple[str, int, int, int, float] | None = None
        self._failing: dict[str, str] = {}

    @property
    def root(self) -> Path:
        return self.store.root

    @property
    def requests(self) -> int:
        return self._registry.requests if self._registry else 0

    @property
    def download(self) -> DownloadProgress | None:
        if self._download is None:
            return None
        name, version, total, base, started_s = self._download
        done = min(total, self.downloaded_bytes - base)
        return DownloadProgress(name, version, done, total, started_s)

    @contextlib.asynccontextmanager
    async def opened(self) -> AsyncIterator[OciSource]:
        await asyncio.to_thread(self.store.open)
        async with Registry(self.location, self.timeout_s) as registry:
            self._registry = registry
            try:
                yield self
            finally:
                self._registry = None

    @property
    def _client(self) -> Registry:
        if self._registry is None:
            raise SourceError(f"{self.url}: the source is not open")
        return self._registry

    # ---- one sync ----------------------------------------------------------------------

    async def sync(
        self,
        only: set[str] | None = None,
        arrived: Callable[[str], Awaitable[None]] | None = None,
    ) -> set[str]:
        """Bring the store up to date with the index; the models whose folders changed.
        Raises SourceError when the registry cannot be read; the store keeps serving."""
        async with self._lock:
            try:
                models, problems = await self._read_index()
                changed = await self._sync_models(models, only, arrived)
            except (RegistryError, ContentRejected) as exc:
                why = str(exc)
                if self.reachable is not False or why != self.last_error:
                    log.error("model source unreachable, serving the cached models: %s", why)
                self.reachable, self.last_error = False, why
                raise SourceError(why) from exc
            self.skipped = {name: f"model skipped: {why}" for name, why in problems.items()}
            self.skipped.update(
                {name: f"model not synced: {why}" for name, why in self._failing.items()}
            )
            if self.reachable is not True:
                log.info("model source %s is reachable", self.url)
            self.reachable, self.last_error = True, ""
            self.last_sync_s = time.time()
            return changed

    async def _read_index(self) -> tuple[dict[str, ModelEntry], dict[str, str]]:
        what = f"the repository index ({self.location.repository}:{INDEX_TAG})"
        raw = await self._client.read("manifests", INDEX_TAG, MAX_MANIFEST_BYTES, what)
        if raw is None:
            raise RegistryError(
                f"{self.url}: no repository index (tag '{INDEX_TAG}'): push models with "
                "`edge-appliance oci push`"
            )
        digest = digest_of(raw)
        if self._index is not None and self._index[0] == digest:
            return self._index[1], self._index[2]
        manifest = parse_manifest(raw, what)
        config = manifest.get("config")
        if not isinstance(config, dict):
            raise ContentRejected(f"{what} has no config")
        size = config.get("size")
        if not isinstance(size, int) or size > MAX_INDEX_BYTES:
            raise ContentRejected(f"{what}: its document is {size} bytes, over {MAX_INDEX_BYTES}")
        blob_digest = str(config.get("digest", ""))
        body = await self._client.read("blobs", blob_digest, size, f"{what} document")
        if body is None or digest_of(body) != blob_digest:
            raise ContentRejected(f"{what}: its document does not match its digest {blob_digest}")
        models, problems = parse_index(body)
        self._index = (digest, models, problems)
        return models, problems

    async def _sync_models(
        self,
        models: dict[str, ModelEntry],
        only: set[str] | None,
        arrived: Callable[[str], Awaitable[None]] | None,
    ) -> set[str]:
        changed: set[str] = set()
        for name in sorted(n for n in models if only is None or n in only):
            try:
                fetched = await self._sync_model(name, models[name])
            except (RegistryError, DiskReserveError):
                raise
            except Exception as exc:  # this model's content or folder: it fails alone
                why = f"{type(exc).__name__}: {exc}"
                if self._failing.get(name) != why:
                    log.error("model '%s' from %s not synced: %s", name, self.url, why)
                self._failing[name] = why
                continue
            self._failing.pop(name, None)
            if fetched:
                changed.add(name)
                if arrived is not None:
                    await arrived(name)
        changed |= await asyncio.to_thread(self._remove_gone, models, only)
        return changed

    async def _sync_model(self, name: str, entry: ModelEntry) -> bool:
        changed = False
        if entry.files is not None:
            changed = await self._sync_model_files(name, entry.files)
        for version in sorted(entry.versions):
            if await self._sync_version(name, version, entry.versions[version]):
                changed = True
        return changed

    async def _artifact(self, name: str, version: int, pinned: Descriptor) -> dict[str, Descriptor]:
        """The files of the artifact the index pins, read by its digest and checked."""
        what = f"model '{name}' version {version}" if version >= 0 else f"model '{name}' files"
        if pinned.size > MAX_MANIFEST_BYTES:
            raise ContentRejected(f"{what}: its manifest is {pinned.size} bytes, too large")
        raw = await self._client.read("manifests", pinned.digest, pinned.size, f"{what} manifest")
        if raw is None:
            raise NotInRegistry(f"manifest {pinned.digest} is not in the registry")
        if digest_of(raw) != pinned.digest:
            raise ContentRejected(
                f"{what}: the registry sent a manifest whose digest {digest_of(raw)} is not "
                f"the {pinned.digest} the index pins"
            )
        return artifact_files(parse_manifest(raw, f"{what} manifest"), what)

    async def _sync_model_files(self, name: str, pinned: Descriptor) -> bool:
        """config.pbtxt, labels and the other files beside the version folders."""
        key = (name, -1)
        folder = self.store.root / name
        if self._synced.get(key) == pinned.digest and folder.is_dir():
            return False
        files = await self._artifact(name, -1, pinned)
        record = await asyncio.to_thread(read_record, folder)
        held = _held(record)
        fresh = {rel: d for rel, d in files.items() if held.get(rel) != (d.digest, d.size)}
        gone = [rel for rel in held if rel not in files]
        if fresh or gone:
            staging = self.store.staging / name / ".model"
            for rel, descriptor in sorted(fresh.items()):
                await self._fetch(name, descriptor, staging / rel)

            def publish() -> None:
                for rel in fresh:
                    target = folder / rel
                    target.parent.mkdir(parents=True, exist_ok=True)
                    os.replace(staging / rel, target)
                for rel in gone:
                    self.store.remove_model_file(name, rel)
                write_record(folder, {rel: [d.digest, d.size] for rel, d in files.items()})

            await asyncio.to_thread(publish)
            log.info("model '%s': fetched %s", name, ", ".join(sorted(fresh)) or "(removals)")
        self._synced[key] = pinned.digest
        return bool(fresh or gone)

    async def _sync_version(self, name: str, version: int, pinned: Descriptor) -> bool:
        key = (name, version)
        version_dir = self.store.version_dir(name, version)
        if self._synced.get(key) == pinned.digest and version_dir.is_dir():
            self.pending.pop(key, None)
            return False
        rejected = await asyncio.to_thread(self._rejected, name, version, pinned.digest)
        if rejected:
            self._set_pending(key, f"rejected: {rejected}", logging.INFO)
            return False
        try:
            files = await self._artifact(name, version, pinned)
            held = _held(await asyncio.to_thread(read_record, version_dir))
            if held == _wanted(files):  # already in the store (synced before a restart)
                fetched = False
            else:
                await self._fetch_version(name, version, files)
                fetched = True
        except ContentRejected as exc:
            await asyncio.to_thread(self._reject, name, version, pinned.digest, str(exc))
            self._set_pending(key, f"rejected: {exc}", logging.ERROR)
            return False
        except (DiskReserveError, NotInRegistry) as exc:  # tried again at the next sync
            self._set_pending(key, str(exc), logging.WARNING)
            return False
        self._synced[key] = pinned.digest
        self.pending.pop(key, None)
        if fetched:
            log.info("model '%s' version %d: fetched and verified into the store", name, version)
        return fetched

    def _rejected(self, name: str, version: int, digest: str) -> str:
        failure = self.ledger.entry(self.store.root / name).failed.get(version)
        if failure is None or failure.stage != VERIFICATION or failure.content != digest:
            return ""
        return failure.reason

    def _reject(self, name: str, version: int, digest: str, why: str) -> None:
        folder = self.store.root / name
        try:
            if self.ledger.change(folder, record_failure(version, VERIFICATION, why, digest)):
                self.ledger.save(folder)
        except OSError as exc:
            log.error("model '%s': cannot write its record to the ledger: %s", name, exc)

    def _set_pending(self, key: tuple[str, int], why: str, level: int) -> None:
        if self.pending.get(key) != why:
            log.log(level, "model '%s' version %d not fetched: %s", key[0], key[1], why)
        self.pending[key] = why

    def _held_blobs(self, name: str) -> dict[str, Path]:
        """Digest -> a stored file of the model with that content (blocking)."""
        found: dict[str, Path] = {}
        folder = self.store.root / name
        if not folder.is_dir():
            return found
        for entry in sorted(folder.iterdir()):
            if version_number(entry.name) is None or not entry.is_dir():
                continue
            for rel, value in read_record(entry).items():
                if len(value) >= 2 and str(value[0]).startswith("sha256:"):
                    found.setdefault(str(value[0]), entry / rel)
        return found

    async def _fetch_version(self, name: str, version: int, files: dict[str, Descriptor]) -> None:
        staging = self.store.staging_dir(name, version)
        held = await asyncio.to_thread(self._held_blobs, name)
        to_fetch = {rel: d for rel, d in files.items() if d.digest not in held}
        staged = await asyncio.to_thread(self.store.staged_bytes, name, version)
        needed = sum(d.size for d in to_fetch.values())
        await asyncio.to_thread(
            self.store.check_space, max(0, needed - staged), f"model '{name}' version {version}"
        )

        def link(source: Path, target: Path) -> bool:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.unlink(missing_ok=True)
            try:
                os.link(source, target)
            except FileNotFoundError:
                return False
            except OSError:
                import shutil

                shutil.copy2(source, target)
            return True

        for rel, descriptor in sorted(files.items()):
            if rel not in to_fetch and not await asyncio.to_thread(
                link, held[descriptor.digest], staging / rel
            ):
                to_fetch[rel] = descriptor
        total = sum(d.size for d in to_fetch.values())
        self._download = (name, version, total, self.downloaded_bytes, time.time())
        try:
            for rel, descriptor in sorted(to_fetch.items()):
                await self._fetch(name, descriptor, staging / rel)
        finally:
            self._download = None
        record = {rel: [d.digest, d.size, d.digest.split(":", 1)[1]] for rel, d in files.items()}
        await asyncio.to_thread(self.store.publish, name, version, record)

    async def _fetch(self, name: str, descriptor: Descriptor, final: Path) -> None:
        """One blob into `final`: resumed from a part an earlier run left, hashed while it
        streams, never written past its size; anything but its digest is thrown away."""
        part = await asyncio.to_thread(PartFile, final, descriptor.digest)
        try:
            for attempt in range(_FETCH_ATTEMPTS):
                try:
                    await self._download_into(part, descriptor)
                    break
                except _Transient as exc:
                    if attempt == _FETCH_ATTEMPTS - 1:
                        raise RegistryError(
                            f"{self.url}: blob {descriptor.digest} failed after "
                            f"{_FETCH_ATTEMPTS} attempts: {exc}"
                        ) from exc
                    await asyncio.to_thread(part.flush)
                    delay = min(8.0, _BACKOFF_S * 2**attempt)
                    log.warning("blob %s: %s; retrying in %.1f s", descriptor.digest, exc, delay)
                    await asyncio.sleep(delay)
            got = "sha256:" + part.sha256.hexdigest()
            if part.size != descriptor.size or got != descriptor.digest:
                raise ContentRejected(
                    f"the registry served blob {descriptor.digest} with other content "
                    f"({part.size} bytes, {got}): refused"
                )
            await asyncio.to_thread(part.commit)
        except ContentRejected:
            await asyncio.to_thread(part.discard)  # nothing of a lying body is kept
            raise
        except BaseException:
            await asyncio.to_thread(part.close)
            raise

    async def _download_into(self, part: PartFile, descriptor: Descriptor) -> None:
        import aiohttp

        if part.size >= descriptor.size:
            return  # an earlier run fetched it all and died before the rename
        rate = self.rate_bytes_s
        chunk = min(_CHUNK, max(16384, int(rate / 8))) if rate else _CHUNK
        started, received = time.monotonic(), 0
        try:
            async for data in self._client.blob_chunks(descriptor.digest, part.size, chunk):
                if part.size + len(data) > descriptor.size:
                    raise ContentRejected(
                        f"blob {descriptor.digest} is longer than the {descriptor.size} bytes "
                        "its manifest gives"
                    )
                await asyncio.to_thread(part.write, data)
                self.downloaded_bytes += len(data)
                received += len(data)
                if rate:
                    ahead = received / rate - (time.monotonic() - started)
                    if ahead > 0:
                        await asyncio.sleep(ahead)
        except (
            aiohttp.ClientPayloadError,
            aiohttp.ClientConnectionError,
            asyncio.TimeoutError,
        ) as exc:
            raise _Transient(f"{type(exc).__name__}: {exc}") from exc
        except OSError as exc:
            raise DiskReserveError(f"cannot write '{part.part}': {exc.strerror}") from exc

    def _remove_gone(self, models: dict[str, ModelEntry], only: set[str] | None) -> set[str]:
        """Delete from the store what the index no longer lists (after a good index)."""
        listed = {name: entry.versions.keys() for name, entry in models.items()}
        changed, removed = self.store.remove_unlisted(listed, only, self.url)
        for key in removed:
            self._synced.pop(key, None)
        for key in list(self.pending):
            if key[0] not in models or key[1] not in models[key[0]].versions:
                del self.pending[key]
        return changed
