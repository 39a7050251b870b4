"""The ledger: what the server learned about each model's versions, kept across restarts.

Per model (of one repository): the last version that served well, the versions whose content
failed (verification, load, warm-up, probation) with why, and an operator's pin. A version
whose content failed is not loaded again until its content changes (another checksum), after a
restart too, so a bad push can never come back as an outage at the next boot; a pin makes the
server serve that one version and nothing else until it is unpinned.

    <state dir>/ledger/<repository key>/<model>.json

Each file is replaced whole (temp file, fsync, rename, fsync of the folder): a power cut
leaves the old record or the new one, never a torn one. Entries live in memory once read;
`change` updates memory at once (any thread, the event loop too) and `save` writes the file
(blocking: call it from a thread). A ledger without a state directory keeps memory only
(`check`, `tune`).
"""

from __future__ import annotations

import copy
import datetime
import hashlib
import json
import logging
import os
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from appliance.repository.local import fingerprint
from appliance.repository.store import read_record, write_atomically

log = logging.getLogger(__name__)

# Where a version failed; each is recorded against the content it failed with.
VERIFICATION, LOAD, WARM_UP, PROBATION = "verification", "load", "warm-up", "probation"


@dataclass
class Failure:
    """A version's content that failed, where and why."""

    stage: str  # VERIFICATION | LOAD | WARM_UP | PROBATION
    reason: str
    content: str  # content_id() of what failed
    at: str = ""  # UTC, ISO 8601

    def describe(self) -> str:
        return (
            f"{self.reason} (recorded {self.at or 'earlier'}; not loaded again until its "
            "content changes)"
        )


@dataclass
class LedgerEntry:
    """One model's durable record."""

    last_good: int | None = None
    pinned: int | None = None
    failed: dict[int, Failure] = field(default_factory=dict)
    # The version a fleet rollout (repository/rollout.py) has this device serve; a pin wins.
    rollout: int | None = None
    # The highest rollout.json revision acted on: a lower one (a stale or replayed copy, even
    # validly signed) is refused, after a restart too.
    rollout_revision: int | None = None
    # The version being loaded now: written (fsynced) before its load starts and cleared when
    # it ends. Found set when the file is read at start, it means that version's load killed
    # the process (the OOM killer, a crash in native code): it is recorded failed.
    loading: int | None = None
    # Unfinished loads of the last good version in a row (a power cut at boot looks the same
    # as a kill: the last good one is held back only at the second).
    last_good_deaths: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "last_good": self.last_good,
            "pinned": self.pinned,
            "rollout": self.rollout,
            "rollout_revision": self.rollout_revision,
            "loading": self.loading,
            "last_good_deaths": self.last_good_deaths,
            "failed": {
                str(v): {"stage": f.stage, "reason": f.reason, "content": f.content, "at": f.at}
                for v, f in sorted(self.failed.items())
            },
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LedgerEntry:
        def version(value: Any) -> int | None:
            return value if isinstance(value, int) and not isinstance(value, bool) else None

        failed: dict[int, Failure] = {}
        raw_failed = data.get("failed")
        for key, item in (raw_failed if isinstance(raw_failed, dict) else {}).items():
            # isdecimal, not isdigit: '²' is a digit int() refuses (found by fuzzing)
            if str(key).isdecimal() and isinstance(item, dict):
                failed[int(key)] = Failure(
                    str(item.get("stage", LOAD)),
                    str(item.get("reason", "")),
                    str(item.get("content", "")),
                    str(item.get("at", "")),
                )
        return cls(
            version(data.get("last_good")),
            version(data.get("pinned")),
            failed,
            version(data.get("rollout")),
            version(data.get("rollout_revision")),
            version(data.get("loading")),
            version(data.get("last_good_deaths")) or 0,
        )


def listing_id(files: Mapping[str, Any]) -> str:
    """A remote version's identity: every file's path, ETag and size (`{rel: [etag, size]}`,
    the form the store records each version in)."""
    digest = hashlib.sha256()
    for rel in sorted(files):
        etag, size = files[rel][0], files[rel][1]
        digest.update(f"{rel}\0{etag}\0{size}\n".encode())
    return "listing:" + digest.hexdigest()[:32]


def content_id(version_dir: Path) -> str:
    """What a version's content is: the listing the store fetched it from (remote sources:
    ETags change with the bytes), else every file's path, size and modification time (blocking)."""
    record = read_record(version_dir)
    if record:
        return listing_id(record)
    return "files:" + fingerprint(version_dir)


def held_back(entry: LedgerEntry, contents: Mapping[int, str]) -> dict[int, Failure]:
    """Pure: the versions (of those present, `version -> content_id`) whose present content is
    the content that failed."""
    return {
        v: failure
        for v, failure in entry.failed.items()
        if v in contents and contents[v] == failure.content
    }


def _utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def repository_key(root: Path) -> str:
    """A folder name for one repository's records: readable, and unique by a short hash."""
    resolved = str(root.resolve())
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", resolved).strip("_")[-48:]
    return f"{readable}-{hashlib.sha256(resolved.encode()).hexdigest()[:10]}"


class ModelLedger:
    """The durable records of every model, by model folder (thread-safe)."""

    def __init__(self, state_dir: Path | None) -> None:
        self.root = state_dir / "ledger" if state_dir is not None else None
        self._entries: dict[Path, LedgerEntry] = {}
        self._lock = threading.Lock()

    def _file(self, model_dir: Path) -> Path | None:
        if self.root is None:
            return None
        return self.root / repository_key(model_dir.parent) / f"{model_dir.name}.json"

    def _entry(self, model_dir: Path) -> LedgerEntry:
        """The cached entry, read from its file the first time (call with the lock held)."""
        key = Path(os.path.abspath(model_dir))  # one entry however the folder is spelled
        entry = self._entries.get(key)
        if entry is not None:
            return entry
        entry = LedgerEntry()
        path = self._file(model_dir)
        if path is not None and path.is_file():
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
                entry = LedgerEntry.from_json(data if isinstance(data, dict) else {})
            except (OSError, ValueError, RecursionError) as exc:  # RecursionError: fuzzing
                log.warning("the ledger of '%s' cannot be read (%s); starting afresh", path, exc)
            if entry.loading is not None:
                self._unfinished_load(model_dir, path, entry)
        self._entries[key] = entry
        return entry

    @staticmethod
    def _unfinished_load(model_dir: Path, path: Path, entry: LedgerEntry) -> None:
        """A load marker left by an earlier process: the version it names killed that process
        while loading (nothing else leaves one: a load that fails or ends clears it, and so
        does a shutdown). Recorded failed with its content, so it is held back until it
        changes; but the last good version only the second time in a row (a power cut during
        the boot's load looks the same). The file is written at once (call with the lock
        held)."""
        version = entry.loading
        assert version is not None
        entry.loading = None
        reason = (
            f"the server process died while loading version {version} (killed, e.g. by the "
            "kernel's out-of-memory killer, or crashed in native code)"
        )
        if version == entry.last_good and entry.last_good_deaths == 0:
            entry.last_good_deaths = 1
            log.warning(
                "model '%s' version %d: %s; it served well before, so it is tried once more "
                "(held back if that happens again)",
                model_dir.name,
                version,
                reason,
            )
        else:
            entry.last_good_deaths = 0
            record_failure(version, LOAD, reason, content_id(model_dir / str(version)))(entry)
            log.error(
                "model '%s' version %d: %s; holding it back", model_dir.name, version, reason
            )
        data = json.dumps(entry.to_json(), indent=1, sort_keys=True)
        try:
            write_atomically(path, data.encode() + b"\n")
        except OSError as exc:
            log.error("the ledger of '%s' cannot be written: %s", path, exc)

    def entry(self, model_dir: Path) -> LedgerEntry:
        """A copy of a model's record (reads its file the first time: blocking once)."""
        with self._lock:
            return copy.deepcopy(self._entry(model_dir))

    def change(self, model_dir: Path, edit: Callable[[LedgerEntry], None]) -> bool:
        """Apply `edit` to a model's record in memory; whether anything changed (then `save`)."""
        with self._lock:
            entry = self._entry(model_dir)
            before = entry.to_json()
            edit(entry)
            return entry.to_json() != before

    def save(self, model_dir: Path) -> None:
        """Write a model's record as it is now (blocking; fsynced)."""
        path = self._file(model_dir)
        if path is None:
            return
        with self._lock:
            data = json.dumps(self._entry(model_dir).to_json(), indent=1, sort_keys=True)
            write_atomically(path, data.encode() + b"\n")

    def held_back(self, model_dir: Path, versions: Iterable[int]) -> dict[int, Failure]:
        """The versions among `versions` whose content on disk is the content that failed
        (blocking: reads the folders)."""
        entry = self.entry(model_dir)
        wanted = [v for v in versions if v in entry.failed]
        return held_back(entry, {v: content_id(model_dir / str(v)) for v in wanted})


def record_failure(
    version: int, stage: str, reason: str, content: str
) -> Callable[[LedgerEntry], None]:
    """A ledger edit: `version`'s `content` failed at `stage`."""

    def edit(entry: LedgerEntry) -> None:
        known = entry.failed.get(version)
        if known is not None and (known.stage, known.reason, known.content) == (
            stage,
            reason,
            content,
        ):
            return  # the same failure again: keep when it was first seen
        entry.failed[version] = Failure(stage, reason, content, _utc_now())

    return edit


def record_good(version: int) -> Callable[[LedgerEntry], None]:
    """A ledger edit: `version` took the traffic and served well (an old failure of it, of
    other content, is forgotten)."""

    def edit(entry: LedgerEntry) -> None:
        entry.failed.pop(version, None)
        entry.last_good = version
        entry.last_good_deaths = 0

    return edit


def record_pin(version: int | None) -> Callable[[LedgerEntry], None]:
    """A ledger edit: serve `version` alone from now on (None: follow the version policy);
    pinning a version also gives its recorded failure, if any, a new chance."""

    def edit(entry: LedgerEntry) -> None:
        entry.pinned = version
        if version is not None:
            entry.failed.pop(version, None)

    return edit


def record_rollout(version: int | None) -> Callable[[LedgerEntry], None]:
    """A ledger edit: a fleet rollout has this device serve `version` (None: no rollout; the
    version policy applies again)."""

    def edit(entry: LedgerEntry) -> None:
        entry.rollout = version

    return edit


def record_rollout_revision(revision: int) -> Callable[[LedgerEntry], None]:
    """A ledger edit: a rollout document of `revision` was acted on (the highest is kept)."""

    def edit(entry: LedgerEntry) -> None:
        if entry.rollout_revision is None or revision > entry.rollout_revision:
            entry.rollout_revision = revision

    return edit


def record_loading(version: int | None) -> Callable[[LedgerEntry], None]:
    """A ledger edit: `version`'s load starts (None: the load ended, however it ended)."""

    def edit(entry: LedgerEntry) -> None:
        entry.loading = version

    return edit
