"""S3 model repositories: sync a bucket prefix into the local model store, verified.

Triton's spellings of the location are accepted:

    s3://bucket/prefix                     AWS (region from the AWS configuration)
    s3://host:port/bucket/prefix           an S3-compatible endpoint over plain HTTP
    s3://https://host:port/bucket/prefix   the same over HTTPS

Credentials come from wherever the AWS SDK finds them (environment, shared credentials file,
instance metadata); botocore signs every request.

A sync costs one listing when nothing changed. A version is fetched only when its listing
(key, ETag, size of every file) differs from what the store holds, and only its changed
files are downloaded; unchanged ones are hard-linked from the copy already held. A version
is complete when every file matches its size and its checksum: the sha256 in the version's
SHA256SUMS when it has one (see manifest.py), else the ETag when it is the object's MD5. A
version without a manifest is fetched only once its listing has settled (unchanged since the
last poll, or untouched for `settle_s` by the bucket's clock), so a half-uploaded version
is never taken. Versions whose content failed verification are recorded in the ledger and not
fetched again until their listing changes, after a restart too.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import hashlib
import logging
import os
import re
import shutil
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from appliance.common.errors import InvalidInput
from appliance.repository.ledger import (
    VERIFICATION,
    ModelLedger,
    listing_id,
    record_failure,
)
from appliance.repository.local import (
    check_model_name,
    looks_like_version,
    name_problem,
    version_number,
)
from appliance.repository.manifest import (
    BOOKKEEPING,
    MANIFEST,
    SIGNATURE,
    ManifestError,
    ManifestPolicy,
    check_model_level,
    parse_manifest,
    verify_signature,
)
from appliance.repository.rollout import FLEET, ROLLOUT, ROLLOUT_SIGNATURE
from appliance.repository.rollout_policy import PROGRESS
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
_FETCH_ATTEMPTS = 5  # a download's attempts, each resuming where the last one stopped
_REQUEST_ATTEMPTS = 2  # the SDK's attempts per request (a listing page, a GET)
_BACKOFF_S = 0.5
_MD5_ETAG = re.compile(r"^[0-9a-f]{32}$")

# What one sync believes of the endpoint. A bucket (or whoever answers for it) can list any
# number of keys and send any body; these bound what a device spends on it.
# A version's SHA256SUMS: a line is 66 bytes and a name, so 1 MiB lists some 8,000 files
# (a real version has a handful); parsed in a thread, ~150 ms at the cap. A 256 MiB one took
# 1.9 GB of RSS and a minute of the loop.
MAX_MANIFEST_BYTES = 1 << 20
MAX_SIGNATURE_BYTES = 1024  # an Ed25519 signature is 64 bytes
# A listing keeps at most this many keys (~400 bytes each: 20 MB) and asks for at most this
# many pages (1,000 keys a page from AWS, MinIO, SeaweedFS, moto); an endpoint that is always
# "truncated", or repeats its continuation token, fails the listing instead of growing it.
MAX_LISTED_KEYS = 50_000
MAX_LISTING_PAGES = 500
# The whole listing of one sync, every page: a slow-dripping endpoint fails it here (each
# read is bounded by timeout_s; a page that trickles in just under it is not).
LISTING_DEADLINE_S = 300.0
_SHOWN_NAMES = 10  # file names a reason lists before "and N more"
_SHOWN_SKIPPED = 100  # keys left out of a sync that are named (in the log and the status)


class SourceError(Exception):
    """The source cannot be read now: unreachable, refused, or misconfigured."""


class _Transient(Exception):
    """A network failure worth retrying (connection reset, timeout, 5xx, throttling)."""


class _ObjectChanged(Exception):
    """The object changed (or vanished) between listing and download."""


class _Rejected(Exception):
    """The content is wrong (checksum, manifest, signature); not retried until it changes."""


class WriteConflict(SourceError):
    """A conditional write found the object changed since it was read (another writer)."""


class ObjectTooLarge(Exception):
    """A small object (a rollout document) is larger than its reader accepts."""


def _some(names: list[str]) -> str:
    """Names for a reason: the first few, and how many more (a reason is one log line)."""
    more = f" and {len(names) - _SHOWN_NAMES} more" if len(names) > _SHOWN_NAMES else ""
    return ", ".join(names[:_SHOWN_NAMES]) + more


def _parse_manifest_bytes(raw: bytes) -> dict[str, str]:
    """parse_manifest of the raw bytes (run in a thread: up to MAX_MANIFEST_BYTES)."""
    try:
        return parse_manifest(raw.decode("utf-8"))
    except (ManifestError, UnicodeDecodeError) as exc:
        raise _Rejected(str(exc)) from exc


@dataclass(frozen=True)
class S3Location:
    url: str
    endpoint: str | None  # None: AWS
    bucket: str
    prefix: str  # "" or ending in "/"

    @classmethod
    def parse(cls, url: str) -> S3Location:
        if not url.startswith("s3://"):
            raise ValueError(f"'{url}' is not an s3:// location")
        rest = url[len("s3://") :]
        endpoint = None
        for scheme in ("https://", "http://"):
            if rest.startswith(scheme):
                host, _, rest = rest[len(scheme) :].partition("/")
                endpoint = scheme + host
                break
        else:
            first = rest.split("/", 1)[0]
            if ":" in first:  # host:port: an S3-compatible server over plain HTTP
                host, _, rest = rest.partition("/")
                endpoint = "http://" + host
        bucket, _, prefix = rest.partition("/")
        if not bucket or (endpoint is not None and endpoint.endswith("//")):
            raise ValueError(f"'{url}' names no bucket (expected s3://[host:port/]bucket/prefix)")
        prefix = prefix.strip("/")
        return cls(url, endpoint, bucket, prefix + "/" if prefix else "")

    @property
    def source_id(self) -> str:
        """A folder name for this location's cache: readable, and unique by a short hash."""
        readable = re.sub(r"[^A-Za-z0-9._-]+", "_", f"{self.bucket}/{self.prefix}").strip("_")
        digest = hashlib.sha256(self.url.encode()).hexdigest()[:10]
        return f"{readable[:60]}-{digest}"


@dataclass(frozen=True)
class RemoteObject:
    key: str
    size: int
    etag: str  # without quotes
    modified: float  # seconds since the epoch, by the bucket's clock

    @property
    def md5(self) -> str | None:
        """The content MD5 when the ETag is one (single-part, not KMS-encrypted)."""
        return self.etag if _MD5_ETAG.match(self.etag) else None


@dataclass
class RemoteModel:
    files: dict[str, RemoteObject] = field(default_factory=dict)  # model-level: config.pbtxt
    versions: dict[int, dict[str, RemoteObject]] = field(default_factory=dict)
    # rollout.json and its signature (fleet_agent.py reads them; never synced as model files)
    rollout: dict[str, RemoteObject] = field(default_factory=dict)
    # What this listing cannot be synced as, and why (logged once, shown as the source's
    # pending reasons): the whole model (`problem`), versions (kept as the store holds them)
    # and single objects left out (by key).
    problem: str = ""
    bad_versions: dict[int, str] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class FleetPlan:
    """What a fleet rollout lets one sync do (fleet_agent.py decides it from the listing)."""

    fetch: dict[str, frozenset[int]]  # model -> the only versions to fetch (absent: every one)
    switch: frozenset[str]  # models to load again although no file changed (another version)


class FleetHook(Protocol):
    """The device's side of fleet rollouts, told of every sync of its source."""

    async def plan(
        self, remote: dict[str, RemoteModel], bucket_now_s: float | None = None
    ) -> FleetPlan: ...

    def synced(self, ok: bool) -> None: ...


def group_objects(prefix: str, objects: list[RemoteObject]) -> dict[str, RemoteModel]:
    """Pure: a listing -> model name -> model-level files and numbered versions' files.

    A key the store cannot hold as it is named is left out with its reason, never the whole
    listing: a model whose name is not a folder name, a version folder of digits that is no
    version ('²'), a name too long for the file system, a file that is also a folder
    (`m/2` beside `m/2/...`: the object is left out; `m/3/a` beside `m/3/a/b`: version 3)."""
    models: dict[str, RemoteModel] = {}
    for obj in objects:
        rel = obj.key[len(prefix) :]
        parts = [p for p in rel.split("/") if p]
        if rel.endswith("/") or len(parts) < 2 or parts[0].startswith("."):
            continue  # folder markers and files at the repository root
        if "." in parts or ".." in parts:
            continue  # "m/../../x" would be written outside the model's folder
        model = models.setdefault(parts[0], RemoteModel())
        if not model.problem:
            model.problem = _model_name_problem(parts[0])
        version = version_number(parts[1]) if len(parts) >= 3 else None
        if model.problem:
            if version is not None:
                model.bad_versions[version] = model.problem
            continue
        bad = next(filter(None, (name_problem(p) for p in parts[1:])), "")
        if bad:
            if version is not None:
                model.bad_versions[version] = f"'{'/'.join(parts[2:])}': {bad}"
            else:
                model.skipped[obj.key] = bad
        elif version is not None:
            model.versions.setdefault(version, {})["/".join(parts[2:])] = obj
        elif looks_like_version(parts[1]):
            model.skipped[obj.key] = (
                f"'{parts[1]}' is not a version folder (versions are ASCII digits)"
            )
        elif len(parts) == 2 and parts[1] in (ROLLOUT, ROLLOUT_SIGNATURE, PROGRESS):
            model.rollout[parts[1]] = obj
        else:
            model.files["/".join(parts[1:])] = obj
    for model in models.values():
        _leave_out_clashes(model)
    return models


def _model_name_problem(name: str) -> str:
    problem = name_problem(name)
    if not problem:
        try:
            check_model_name(name)
        except InvalidInput as exc:
            problem = str(exc)
    return f"model skipped: {problem}" if problem else ""


def _folders(paths: list[str]) -> set[str]:
    """Every folder the paths lie in ('a/b/c' -> 'a', 'a/b')."""
    found: set[str] = set()
    for path in paths:
        parts = path.split("/")
        found.update("/".join(parts[:i]) for i in range(1, len(parts)))
    return found


def _leave_out_clashes(model: RemoteModel) -> None:
    """A path that is both a file and a folder cannot be written: such a version is not
    fetched, such a model-level file is left out (a version folder wins over a file `m/2`)."""
    for version in model.bad_versions:
        model.versions.pop(version, None)
    for version, files in list(model.versions.items()):
        clash = sorted(set(files) & _folders(list(files)))
        if clash:
            model.bad_versions[version] = f"'{clash[0]}' is both a file and a folder"
            del model.versions[version]
    taken = _folders(list(model.files)) | {str(v) for v in model.versions}
    taken |= {str(v) for v in model.bad_versions}
    for rel in sorted(set(model.files) & taken):
        obj = model.files.pop(rel)
        model.skipped[obj.key] = f"'{rel}' is both a file and a folder"


def _listing_id(files: dict[str, RemoteObject]) -> str:
    """The ledger's identity of a version's content: the same as the store's record gives."""
    return listing_id({rel: [obj.etag, obj.size] for rel, obj in files.items()})


def _signature(files: dict[str, RemoteObject]) -> frozenset[tuple[str, str, int]]:
    return frozenset((rel, obj.etag, obj.size) for rel, obj in files.items())


def _recorded(record: dict[str, list[Any]]) -> frozenset[tuple[str, str, int]]:
    return frozenset((rel, str(v[0]), int(v[1])) for rel, v in record.items() if len(v) >= 2)


@dataclass(frozen=True)
class DownloadProgress:
    """The version a source is fetching now, as the status page shows it."""

    model: str
    version: int
    done_bytes: int  # of its changed files, parts left by an earlier run included
    total_bytes: int
    started_s: float  # wall clock


def client_options(
    location: S3Location, session: Any, timeout_s: float, attempts: int
) -> dict[str, Any]:
    """`create_client("s3", **options)` for a location, the same for the server's sync and the
    fleet commands: the region from the environment or the AWS configuration (us-east-1 when
    neither says), the timeouts, `attempts` tries a request, path-style addressing for an
    endpoint (S3-compatible stores)."""
    from botocore.config import Config

    region = (
        os.environ.get("AWS_REGION")
        or os.environ.get("AWS_DEFAULT_REGION")
        or session.get_config_variable("region")
        or "us-east-1"
    )
    config = Config(
        connect_timeout=timeout_s,
        read_timeout=timeout_s,
        retries={"max_attempts": attempts, "mode": "standard"},
        s3={"addressing_style": "path"} if location.endpoint else {},
    )
    return {"endpoint_url": location.endpoint, "region_name": region, "config": config}


class S3Source:
    """One s3:// repository, synced into its folder of the model store."""

    lengths_from = "the listing"  # whose word an object's length is (tuf_source.py: TUF's)
    frozen_since_s = 0.0  # TUF mode: when the trusted metadata expired (0: not frozen)

    def __init__(
        self,
        url: str,
        state_dir: Path,
        reserve_bytes: int | None,
        manifest: ManifestPolicy,
        settle_s: float = 5.0,
        rate_bytes_s: float = 0.0,
        free_bytes: FreeBytes = disk_free_bytes,
        ledger: ModelLedger | None = None,
        timeout_s: float = 10.0,
    ) -> None:
        self.location = S3Location.parse(url)
        # Verification failures, kept across restarts (shared with the runtime's records).
        self.ledger = ledger or ModelLedger(None)
        self.rate_bytes_s = rate_bytes_s  # 0: as fast as the link goes
        self.url = url
        self.store = ModelStore(state_dir, self.location.source_id, reserve_bytes, free_bytes)
        self.manifest = manifest
        self.settle_s = settle_s
        # Each connect and each read (of a listing page or a download) waits at most this long:
        # an endpoint that accepts connections and never answers costs a sync
        # _REQUEST_ATTEMPTS x timeout_s, not the SDK's default minutes.
        self.timeout_s = timeout_s
        self.reachable: bool | None = None  # None until the first sync
        self.last_error = ""
        self.last_sync_s = 0.0  # wall clock of the last successful listing
        self.downloaded_bytes = 0
        self.requests = 0  # S3 API calls made (listing pages and GETs)
        # (model, version) -> why it is not in the store at its listed content.
        self.pending: dict[tuple[str, int], str] = {}
        # Objects of the listing left out of the sync (key -> why): names the store cannot
        # hold; a model that failed this poll (name -> why), each logged once.
        self.skipped: dict[str, str] = {}
        self._skipped_count = 0
        self._failing_models: dict[str, str] = {}
        self._last_listing: dict[tuple[str, int], frozenset[tuple[str, str, int]]] = {}
        # The fetch under way: (model, version, total, bytes staged before it, downloaded_bytes
        # when it began, wall clock); read through `download`.
        self._download: tuple[str, int, int, int, int, float] | None = None
        self._client: Any = None
        self._lock = asyncio.Lock()
        self.fleet: FleetHook | None = None  # fleet_agent.FleetAgent, when rollouts are on
        # The last listing ran into the fleet area (.fleet/: device reports and verdicts) at a
        # page's end: the next one starts with a one-key page to skip it at once.
        self._fleet_area_big = False
        # model -> why its model-level files were refused (signed mode), logged once
        self._untrusted: dict[str, tuple[str, frozenset[tuple[str, str, int]]]] = {}

    @property
    def root(self) -> Path:
        return self.store.root

    @property
    def download(self) -> DownloadProgress | None:
        """The version being fetched now, if any (no I/O: from the counters kept anyway)."""
        if self._download is None:
            return None
        name, version, total, staged, base, started_s = self._download
        done = min(total, staged + self.downloaded_bytes - base)
        return DownloadProgress(name, version, done, total, started_s)

    @contextlib.asynccontextmanager
    async def opened(self) -> AsyncIterator[S3Source]:
        try:
            from aiobotocore.session import get_session
        except ImportError as exc:
            raise SourceError(
                f"{self.url}: S3 repositories need aiobotocore (pip install 'edge-appliance[s3]')"
            ) from exc
        await asyncio.to_thread(self.store.open)
        session = get_session()
        options = client_options(self.location, session, self.timeout_s, _REQUEST_ATTEMPTS)
        async with session.create_client("s3", **options) as client:
            self._client = client
            try:
                yield self
            finally:
                self._client = None

    # ---- one sync ----------------------------------------------------------------------------

    async def sync(
        self,
        only: set[str] | None = None,
        arrived: Callable[[str], Awaitable[None]] | None = None,
    ) -> set[str]:
        """Bring the store up to date with the bucket; the models whose folders changed.
        `arrived(name)` is awaited as soon as a model's folder changed (it loads the model),
        before the next model is synced.

        Raises SourceError when the bucket cannot be listed or a download cannot finish;
        what the store already holds is untouched and keeps serving.
        """
        async with self._lock:
            try:
                objects, bucket_now = await self._list_in_time()
            except SourceError as exc:
                self._mark_unreachable(str(exc))
                raise
            remote = group_objects(self.location.prefix, objects)
            self._report_unsyncable(remote)
            try:
                changed = await self._sync_listed(remote, bucket_now, only, arrived)
            except SourceError as exc:
                self._mark_unreachable(str(exc))
                raise
            if self.reachable is not True:
                log.info("model source %s is reachable", self.url)
            self.reachable, self.last_error = True, ""
            self.last_sync_s = time.time()
            if self.fleet is not None:
                self.fleet.synced(True)
            return changed

    async def _sync_listed(
        self,
        remote: dict[str, RemoteModel],
        bucket_now: float | None,
        only: set[str] | None,
        arrived: Callable[[str], Awaitable[None]] | None,
    ) -> set[str]:
        """Sync every model of a good listing; one model's failure is its own (logged, and
        the next poll tries it again), never the others'."""
        wanted = {n: m for n, m in remote.items() if not m.problem and (only is None or n in only)}
        plan = FleetPlan({}, frozenset())
        if self.fleet is not None:
            plan = await self.fleet.plan(wanted, bucket_now)
        changed: set[str] = set()
        for name in sorted(wanted):
            try:
                fetched = await self._sync_model(
                    name, wanted[name], bucket_now, plan.fetch.get(name)
                )
            except (SourceError, DiskReserveError):
                raise  # the endpoint or the store's disk: the next models would fail alike
            except Exception as exc:  # this model's objects or folder: it fails alone
                self._model_failed(name, exc)
                continue
            self._failing_models.pop(name, None)
            if fetched or name in plan.switch:
                changed.add(name)
                if arrived is not None:
                    await arrived(name)
        changed |= await asyncio.to_thread(self._remove_gone, remote, only)
        return changed

    def _model_failed(self, name: str, exc: Exception) -> None:
        why = f"{type(exc).__name__}: {exc}"
        if self._failing_models.get(name) != why:  # once, not at every poll
            log.error(
                "model '%s' from %s not synced (the other models are): %s",
                name,
                self.url,
                why,
                exc_info=not isinstance(exc, OSError),
            )
        self._failing_models[name] = why
        self.skipped[f"{self.location.prefix}{name}/"] = f"model not synced: {why}"

    def _report_unsyncable(self, remote: dict[str, RemoteModel]) -> None:
        """Log once, and show as pending, what the listing holds that cannot be synced."""
        skipped: dict[str, str] = {}
        for name, model in sorted(remote.items()):
            if model.problem and not model.bad_versions:
                skipped[f"{self.location.prefix}{name}/"] = model.problem
            for version, why in sorted(model.bad_versions.items()):
                self._set_pending((name, version), f"not synced: {why}", logging.WARNING)
            skipped.update(model.skipped)
        kept = dict(sorted(skipped.items())[:_SHOWN_SKIPPED])  # a status, not a copy
        for key, why in kept.items():
            if self.skipped.get(key) != why:
                log.warning("%s: '%s' left out of the sync: %s", self.url, key, why)
        if len(skipped) > len(kept) and len(skipped) != self._skipped_count:
            log.warning("%s: %d more keys left out of the sync", self.url, len(skipped) - len(kept))
        self.skipped, self._skipped_count = kept, len(skipped)

    def _mark_unreachable(self, why: str) -> None:
        if self.reachable is not False or why != self.last_error:
            log.error("model source unreachable, serving the cached models: %s", why)
        self.reachable, self.last_error = False, why
        if self.fleet is not None:
            self.fleet.synced(False)

    async def _list_in_time(self) -> tuple[list[RemoteObject], float | None]:
        try:
            return await asyncio.wait_for(self._list(), LISTING_DEADLINE_S)
        except asyncio.TimeoutError:
            raise SourceError(
                f"{self.url}: listing failed: not done in {LISTING_DEADLINE_S:.0f} s"
            ) from None

    async def _list(self) -> tuple[list[RemoteObject], float | None]:
        """Every object under the prefix but the fleet area (`.fleet/`: one report per device
        and verdicts, thousands of keys in a big fleet). Keys come in UTF-8 order, so a page
        that ends inside the fleet area is followed by one that starts after it; when the
        last listing did that, the first page asks for one key only."""
        fleet = self.location.prefix + FLEET + "/"
        after_fleet = self.location.prefix + FLEET + "0"  # "0" follows "/"
        objects: list[RemoteObject] = []
        bucket_now: float | None = None
        token: str | None = None
        start_after: str | None = None
        first, jumped = True, False
        tokens: set[str] = set()
        for _ in range(MAX_LISTING_PAGES):
            kwargs: dict[str, Any] = {
                "Bucket": self.location.bucket,
                "Prefix": self.location.prefix,
            }
            if token:
                kwargs["ContinuationToken"] = token
            elif start_after:
                kwargs["StartAfter"] = start_after
            if first and self._fleet_area_big:
                kwargs["MaxKeys"] = 1
            first = False
            self.requests += 1
            try:
                page = await self._client.list_objects_v2(**kwargs)
            except Exception as exc:
                raise SourceError(self._explain(exc, "listing")) from exc
            date = page.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
            if date:
                with contextlib.suppress(TypeError, ValueError):
                    bucket_now = email.utils.parsedate_to_datetime(date).timestamp()
            contents = page.get("Contents", [])
            for item in contents:
                if str(item.get("Key", "")).startswith(fleet):
                    continue
                if len(objects) >= MAX_LISTED_KEYS:
                    raise SourceError(
                        f"{self.url}: listing failed: more than {MAX_LISTED_KEYS} keys under "
                        f"'{self.location.prefix}'"
                    )
                objects.append(_listed(self.url, item))
            if not page.get("IsTruncated"):
                self._fleet_area_big = jumped
                return objects, bucket_now
            if contents and str(contents[-1].get("Key", "")).startswith(fleet):
                token, start_after, jumped = None, after_fleet, True
            else:
                token = page.get("NextContinuationToken")
                if not token or token in tokens:
                    raise SourceError(
                        f"{self.url}: listing failed: a truncated page without a new "
                        "continuation token"
                    )
                tokens.add(token)
        raise SourceError(
            f"{self.url}: listing failed: still truncated after {MAX_LISTING_PAGES} pages"
        )

    # ---- small objects (fleet_agent.py: rollout documents, reports, verdicts) -------------

    async def read_object(self, key: str, max_bytes: int) -> bytes | None:
        """A small object's bytes (None: there is no such key); SourceError if unreadable,
        ObjectTooLarge once more than `max_bytes` arrived (nothing more is read)."""
        self.requests += 1
        try:
            response = await self._client.get_object(Bucket=self.location.bucket, Key=key)
            async with response["Body"] as body:
                data = bytearray()
                while chunk := await body.read(min(_CHUNK, max_bytes + 1 - len(data))):
                    data += chunk
                    if len(data) > max_bytes:
                        raise ObjectTooLarge(
                            f"'{key}' is larger than the {max_bytes} bytes it may have"
                        )
                return bytes(data)
        except ObjectTooLarge:
            raise
        except Exception as exc:
            response = getattr(exc, "response", None)
            if isinstance(response, dict) and response.get("Error", {}).get("Code") in (
                "NoSuchKey",
                "404",
            ):
                return None
            raise SourceError(self._explain(exc, f"reading '{key}'")) from exc

    async def write_object(self, key: str, data: bytes, expect: str | None = None) -> str:
        """Write a small object; its ETag. `expect`: None writes over whatever is there; ''
        only where there is none (If-None-Match); an ETag only over that object (If-Match):
        else WriteConflict, the compare-and-swap of a rollout's progress and slots."""
        condition: dict[str, str] = {}
        if expect is not None:
            condition = {"IfMatch": f'"{expect}"'} if expect else {"IfNoneMatch": "*"}
        self.requests += 1
        try:
            answer = await self._client.put_object(
                Bucket=self.location.bucket,
                Key=key,
                Body=data,
                ContentType="application/json",
                **condition,
            )
        except Exception as exc:
            response = getattr(exc, "response", None) or {}
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            code = response.get("Error", {}).get("Code", "")
            if condition and (status in (409, 412) or code in ("PreconditionFailed", "409")):
                raise WriteConflict(f"'{key}' changed since it was read") from exc
            raise SourceError(self._explain(exc, f"writing '{key}'")) from exc
        return str(answer.get("ETag", "")).strip('"')

    async def delete_object(self, key: str) -> None:
        self.requests += 1
        try:
            await self._client.delete_object(Bucket=self.location.bucket, Key=key)
        except Exception as exc:
            raise SourceError(self._explain(exc, f"deleting '{key}'")) from exc

    async def list_keys(self, prefix: str) -> list[str]:
        """Every key under `prefix` (keys only)."""
        return [obj.key for obj in await self.list_objects(prefix)]

    async def list_objects(self, prefix: str) -> list[RemoteObject]:
        """Every object under `prefix`."""
        keys: list[RemoteObject] = []
        kwargs: dict[str, Any] = {"Bucket": self.location.bucket, "Prefix": prefix}
        for _ in range(MAX_LISTING_PAGES):
            self.requests += 1
            try:
                page = await self._client.list_objects_v2(**kwargs)
            except Exception as exc:
                raise SourceError(self._explain(exc, f"listing '{prefix}'")) from exc
            keys += [_listed(self.url, item) for item in page.get("Contents", [])]
            if not page.get("IsTruncated"):
                return keys
            token = page.get("NextContinuationToken")
            if len(keys) > MAX_LISTED_KEYS or not token or token == kwargs.get("ContinuationToken"):
                break
            kwargs["ContinuationToken"] = token
        raise SourceError(f"{self.url}: listing '{prefix}' failed: too many keys or pages")

    def _explain(self, exc: Exception, what: str) -> str:
        """A one-line reason naming the source and what failed."""
        response = getattr(exc, "response", None)
        where = f"{self.url}: {what}"
        if isinstance(response, dict) and "Error" in response:
            code = response["Error"].get("Code", "")
            message = response["Error"].get("Message", "")
            if code == "NoSuchBucket":
                return f"{where} failed: bucket '{self.location.bucket}' does not exist"
            if code in ("SignatureDoesNotMatch", "InvalidAccessKeyId", "AccessDenied", "403"):
                return f"{where} refused ({code}): check the AWS credentials: {message}"
            return f"{where} failed ({code}): {message}"
        name = type(exc).__name__
        if name in ("NoCredentialsError", "PartialCredentialsError"):
            return (
                f"{where} failed: no AWS credentials found (AWS_ACCESS_KEY_ID / "
                "AWS_SECRET_ACCESS_KEY, ~/.aws/credentials or instance metadata)"
            )
        return f"{where} failed: cannot reach the endpoint: {exc}"

    async def _sync_model(
        self,
        name: str,
        remote: RemoteModel,
        bucket_now: float | None,
        only_versions: frozenset[int] | None = None,
    ) -> bool:
        """`only_versions`: a fleet rollout's choice; the other versions are not fetched."""
        changed = await self._sync_model_files(name, remote.files)
        for version in sorted(remote.versions):
            if only_versions is not None and version not in only_versions:
                self.pending.pop((name, version), None)
                continue
            if await self._sync_version(name, version, remote.versions[version], bucket_now):
                changed = True
        return changed

    async def _sync_model_files(self, name: str, files: dict[str, RemoteObject]) -> bool:
        """config.pbtxt, labels and other files beside the version folders."""
        folder = self.store.root / name
        record = await asyncio.to_thread(read_record, folder)
        fresh = {rel: obj for rel, obj in files.items() if record.get(rel) != [obj.etag, obj.size]}
        gone = [rel for rel in record if rel not in files]
        if not fresh and not gone:
            return False
        if self._untrusted.get(name, ("", None))[1] == _signature(files):
            return False  # refused as it is (unsigned): not fetched again until it changes
        staging = self.store.staging / name / ".model"
        for rel, obj in sorted(fresh.items()):
            try:
                await self._fetch(obj, staging / rel, None)
            except (_ObjectChanged, _Rejected) as exc:
                log.warning("model '%s': %s: %s; retrying on the next poll", name, rel, exc)
                return False
        untrusted = await asyncio.to_thread(self._untrusted_model_files, name, files, fresh)
        if untrusted:
            return False
        new_record = {rel: [obj.etag, obj.size] for rel, obj in files.items()}

        def publish() -> None:
            for rel in fresh:
                target = folder / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(staging / rel, target)
            for rel in gone:
                self.store.remove_model_file(name, rel)
            write_record(folder, new_record)

        await asyncio.to_thread(publish)
        log.info("model '%s': fetched %s", name, ", ".join(sorted(fresh)) or "(removals)")
        return True

    def _untrusted_model_files(
        self, name: str, files: dict[str, RemoteObject], fresh: dict[str, RemoteObject]
    ) -> str:
        """With --manifest-public-key: why the model-level files just fetched (`fresh`, in
        staging) with those already held are not all covered by the model's signed manifest
        ('' when they are); the fetched ones are then thrown away and nothing is published
        (blocking). The model's versions sync on; its load refuses unsigned model files."""
        if not self.manifest.signed:
            return ""
        staging, folder = self.store.staging / name / ".model", self.store.root / name
        paths = {rel: (staging if rel in fresh else folder) / rel for rel in files}
        why = check_model_level(paths, self.manifest)
        if why:
            shutil.rmtree(staging, ignore_errors=True)
            if self._untrusted.get(name, ("", None))[0] != why:
                log.error("model '%s': model-level files not taken: %s", name, why)
            self._untrusted[name] = (why, _signature(files))
        else:
            self._untrusted.pop(name, None)
        return why

    async def _sync_version(
        self, name: str, version: int, files: dict[str, RemoteObject], bucket_now: float | None
    ) -> bool:
        key = (name, version)
        signature = _signature(files)
        previous, self._last_listing[key] = self._last_listing.get(key), signature
        held = _recorded(await asyncio.to_thread(read_record, self.store.version_dir(*key)))
        if held == signature:
            self.pending.pop(key, None)
            return False
        rejected = await asyncio.to_thread(self._rejected, name, version, files)
        if rejected:  # failed verification; fetched again once its content changes
            self._set_pending(key, f"rejected: {rejected}", logging.INFO)
            return False
        try:
            wanted = await self._check_complete(name, version, files, previous, bucket_now)
            if wanted is None:
                return False
            await self._fetch_version(name, version, files, wanted, held)
        except _Rejected as exc:
            # Recorded before it is shown: a device stopped once the status says "rejected"
            # never fetches the same listing again.
            await asyncio.to_thread(self._reject, name, version, files, str(exc))
            self._set_pending(key, f"rejected: {exc}", logging.ERROR)
            return False
        except (_ObjectChanged, DiskReserveError) as exc:
            self._set_pending(key, str(exc), logging.WARNING)
            return False
        self.pending.pop(key, None)
        log.info("model '%s' version %d: fetched and verified into the store", name, version)
        return True

    def _rejected(self, name: str, version: int, files: dict[str, RemoteObject]) -> str:
        """Why this listing of a version failed verification before; '' if it did not
        (blocking: reads the ledger once)."""
        failure = self.ledger.entry(self.store.root / name).failed.get(version)
        if failure is None or failure.stage != VERIFICATION:
            return ""
        return failure.reason if failure.content == _listing_id(files) else ""

    def _reject(self, name: str, version: int, files: dict[str, RemoteObject], why: str) -> None:
        """Record in the ledger that this listing of a version failed verification (blocking)."""
        folder = self.store.root / name
        edit = record_failure(version, VERIFICATION, why, _listing_id(files))
        try:
            if self.ledger.change(folder, edit):
                self.ledger.save(folder)
        except OSError as exc:
            log.error("model '%s': cannot write its record to the ledger: %s", name, exc)

    def _set_pending(self, key: tuple[str, int], why: str, level: int) -> None:
        if self.pending.get(key) != why:
            log.log(level, "model '%s' version %d not fetched: %s", key[0], key[1], why)
        self.pending[key] = why

    async def _check_complete(
        self,
        name: str,
        version: int,
        files: dict[str, RemoteObject],
        previous: frozenset[tuple[str, str, int]] | None,
        bucket_now: float | None,
    ) -> dict[str, str | None] | None:
        """The files to fetch (name -> expected sha256), or None while the upload is unfinished.

        Raises _Rejected for a manifest or signature that is wrong.
        """
        key = (name, version)
        staging = self.store.staging_dir(name, version)
        if MANIFEST not in files:
            if self.manifest.signed or self.manifest.required:
                flag = "--manifest-public-key" if self.manifest.signed else "--require-manifest"
                self._set_pending(key, f"waiting for {MANIFEST} ({flag} is set)", logging.INFO)
                return None
            newest = max(obj.modified for obj in files.values())
            quiet = bucket_now is not None and bucket_now - newest >= self.settle_s
            if previous != _signature(files) and not quiet:
                self._set_pending(key, "waiting for the upload to settle", logging.INFO)
                return None
            return dict.fromkeys(files)
        _check_size(files[MANIFEST], MAX_MANIFEST_BYTES)
        await self._fetch(files[MANIFEST], staging / MANIFEST, None)
        raw = await asyncio.to_thread((staging / MANIFEST).read_bytes)
        listed = await asyncio.to_thread(_parse_manifest_bytes, raw)
        if self.manifest.signed:
            if SIGNATURE not in files:
                self._set_pending(key, f"waiting for {SIGNATURE}", logging.INFO)
                return None
            _check_size(files[SIGNATURE], MAX_SIGNATURE_BYTES)
            await self._fetch(files[SIGNATURE], staging / SIGNATURE, None)
            signature = await asyncio.to_thread((staging / SIGNATURE).read_bytes)
            try:
                verify_signature(self.manifest.public_key, raw, signature)
            except ManifestError as exc:
                raise _Rejected(str(exc)) from exc
            unlisted = sorted(f for f in files if f not in listed and f not in BOOKKEEPING)
            if unlisted:
                raise _Rejected(f"files not in the signed {MANIFEST}: {_some(unlisted)}")
        missing = sorted(f for f in listed if f not in files)
        if missing:
            self._set_pending(
                key,
                f"incomplete: waiting for {_some(missing)} (listed in {MANIFEST})",
                logging.INFO,
            )
            return None
        wanted: dict[str, str | None] = {rel: listed.get(rel) for rel in files}
        return wanted

    async def _fetch_version(
        self,
        name: str,
        version: int,
        files: dict[str, RemoteObject],
        wanted: dict[str, str | None],
        held: frozenset[tuple[str, str, int]],
    ) -> None:
        staging = self.store.staging_dir(name, version)
        unchanged = {rel for rel, etag, size in held if (rel, etag, size) in _signature(files)}
        to_fetch = [rel for rel in sorted(wanted) if rel not in unchanged]
        needed = sum(files[rel].size for rel in to_fetch)
        staged = await asyncio.to_thread(self.store.staged_bytes, name, version)
        await asyncio.to_thread(
            self.store.check_space, max(0, needed - staged), f"model '{name}' version {version}"
        )
        for rel in sorted(unchanged):
            if not await asyncio.to_thread(self.store.reuse, name, version, rel):
                to_fetch.append(rel)
        total = sum(files[rel].size for rel in to_fetch)
        self._download = (name, version, total, staged, self.downloaded_bytes, time.time())
        try:
            for rel in to_fetch:
                if rel in (MANIFEST, SIGNATURE) and (staging / rel).is_file():
                    continue  # fetched and checked by _check_complete
                await self._fetch(files[rel], staging / rel, wanted[rel])
        finally:
            self._download = None
        record = {rel: [files[rel].etag, files[rel].size] for rel in wanted}
        await asyncio.to_thread(self.store.publish, name, version, record)

    async def _fetch(self, obj: RemoteObject, final: Path, sha256: str | None) -> None:
        """Download one object to `final`, resuming a part left by an earlier run."""
        part = await asyncio.to_thread(PartFile, final, obj.etag)
        try:
            for attempt in range(_FETCH_ATTEMPTS):
                try:
                    await self._download_into(part, obj)
                    break
                except _Rejected:
                    await asyncio.to_thread(part.discard)  # nothing of a lying body is kept
                    raise
                except _Transient as exc:
                    if attempt == _FETCH_ATTEMPTS - 1:
                        raise SourceError(
                            f"{self.url}: downloading '{obj.key}' failed after "
                            f"{_FETCH_ATTEMPTS} attempts: {exc}"
                        ) from exc
                    await asyncio.to_thread(part.flush)
                    delay = min(8.0, _BACKOFF_S * 2**attempt)
                    log.warning("downloading '%s': %s; retrying in %.1f s", obj.key, exc, delay)
                    await asyncio.sleep(delay)
            why = await self._check_part(part, obj, sha256)
            if why:
                await asyncio.to_thread(part.discard)
                raise _Rejected(f"'{obj.key}' {why}")
            await asyncio.to_thread(part.commit)
        except BaseException:
            await asyncio.to_thread(part.close)
            raise

    async def _download_into(self, part: PartFile, obj: RemoteObject) -> None:
        if part.size >= obj.size:
            return  # an earlier run fetched it all and died before the rename
        kwargs: dict[str, Any] = {
            "Bucket": self.location.bucket,
            "Key": obj.key,
            "IfMatch": f'"{obj.etag}"',
        }
        if part.size:
            kwargs["Range"] = f"bytes={part.size}-"
        self.requests += 1
        rate = self.rate_bytes_s
        chunk_size = min(_CHUNK, max(16384, int(rate / 8))) if rate else _CHUNK
        try:
            response = await self._client.get_object(**kwargs)
            if response.get("ServerSideEncryption") == "aws:kms":
                part.etag_is_md5 = False  # a KMS-encrypted object's ETag is not its MD5
            async with response["Body"] as body:
                await self._read_body(body, part, obj, chunk_size)
        except _Rejected:
            raise
        except OSError as exc:
            if isinstance(exc, ConnectionError | TimeoutError):
                raise _Transient(str(exc)) from exc
            raise DiskReserveError(f"cannot write '{part.part}': {exc.strerror}") from exc
        except Exception as exc:
            raise self._classify(exc, obj) from exc

    async def _read_body(self, body: Any, part: PartFile, obj: RemoteObject, chunk: int) -> None:
        """Append the body to the part, never past the listed size: a longer body fails the
        object and nothing beyond the size is written (the disk reserve was checked for it)."""
        rate = self.rate_bytes_s
        started, received = time.monotonic(), 0
        while data := await body.read(max(1, min(chunk, obj.size - part.size + 1))):
            if part.size + len(data) > obj.size:
                raise _Rejected(
                    f"'{obj.key}' is longer than the {obj.size} bytes {self.lengths_from} gives"
                )
            await asyncio.to_thread(part.write, data)
            self.downloaded_bytes += len(data)
            received += len(data)
            if rate:  # pace to the configured link share
                ahead = received / rate - (time.monotonic() - started)
                if ahead > 0:
                    await asyncio.sleep(ahead)

    async def _check_part(self, part: PartFile, obj: RemoteObject, sha256: str | None) -> str:
        """'' when a downloaded part is the object, else what is wrong (tuf_source.py adds
        TUF's own check)."""
        return _mismatch(part, obj, sha256)

    def _classify(self, exc: Exception, obj: RemoteObject) -> Exception:
        response = getattr(exc, "response", None)
        if isinstance(response, dict) and "Error" in response:
            code = str(response["Error"].get("Code", ""))
            status = int(response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
            if code in ("PreconditionFailed", "NoSuchKey") or status in (404, 412):
                return _ObjectChanged(f"'{obj.key}' changed during the download")
            if status >= 500 or code in ("SlowDown", "Throttling", "RequestTimeout"):
                return _Transient(f"{code} (HTTP {status})")
            return SourceError(self._explain(exc, f"downloading '{obj.key}'"))
        if type(exc).__name__ in ("NoCredentialsError", "PartialCredentialsError"):
            return SourceError(self._explain(exc, f"downloading '{obj.key}'"))
        return _Transient(f"{type(exc).__name__}: {exc}")

    def _remove_gone(self, remote: dict[str, RemoteModel], only: set[str] | None) -> set[str]:
        """Delete from the store what the bucket no longer has (after a good listing)."""
        listed = {
            name: held.versions.keys() | held.bad_versions.keys() for name, held in remote.items()
        }
        changed, removed = self.store.remove_unlisted(listed, only, self.url)
        for key in removed:
            self._last_listing.pop(key, None)
        for model, version in list(self.pending):
            held = remote.get(model)
            if held is None or (version not in held.versions and version not in held.bad_versions):
                del self.pending[(model, version)]
        return changed


def _listed(url: str, item: dict[str, Any]) -> RemoteObject:
    """One entry of a listing page; SourceError for one that is not an object's."""
    try:
        size = int(item["Size"])
        if size < 0:
            raise ValueError(f"size {size}")
        return RemoteObject(
            key=str(item["Key"]),
            size=size,
            etag=str(item.get("ETag", "")).strip('"'),
            modified=item["LastModified"].timestamp(),
        )
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
        raise SourceError(f"{url}: listing failed: a malformed entry ({exc!r})") from None


def _check_size(obj: RemoteObject, most: int) -> None:
    """_Rejected, before a byte is fetched, for a bookkeeping file over its cap."""
    if obj.size > most:
        name = obj.key.rsplit("/", 1)[-1]
        raise _Rejected(f"{name} is {obj.size} bytes, more than the {most} it may have")


def _mismatch(part: PartFile, obj: RemoteObject, sha256: str | None) -> str:
    """'' when the downloaded bytes are the object, else what is wrong."""
    if part.size != obj.size:
        return f"is {part.size} bytes, the listing says {obj.size}"
    if sha256 is not None:  # the manifest's word is final: ETags are the store's to compute
        return (
            "" if part.sha256.hexdigest() == sha256 else f"does not match its sha256 in {MANIFEST}"
        )
    if obj.md5 is not None and part.etag_is_md5 and part.md5.hexdigest() != obj.md5:
        return "does not match its ETag (MD5): corrupted in transit or in the bucket"
    return ""
