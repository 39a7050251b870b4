"""The runtime's side of the ledger (repository/ledger.py): what a load must respect and what
it taught, kept across restarts.

Before a load: the versions whose content failed before are skipped (with why), and a pin
replaces the version policy. After it: each version that failed is recorded with its content
and where it failed, and the version that took the traffic becomes the last good one, once it
passes its probation when it is on one. Probation's verdicts come here too.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from appliance.repository.ledger import (
    LOAD,
    PROBATION,
    WARM_UP,
    ModelLedger,
    content_id,
    record_failure,
    record_good,
    record_loading,
)
from appliance.repository.local import list_versions
from appliance.runtime.loader import PreparedModel

log = logging.getLogger(__name__)


class Recorded(enum.Enum):
    """The pin the ledger holds (as opposed to one being asked for)."""

    PIN = "recorded"


RECORDED = Recorded.PIN


@dataclass(frozen=True)
class LoadPlan:
    """What a load of one model folder must respect, from the folder and the ledger."""

    present: frozenset[int]  # the version folders there now
    skip: dict[int, str]  # version -> why it is not loaded (its content failed before)
    pin: int | None  # serve this version alone


class UpdateHistory:
    """Reads and writes the ledger for the runtime."""

    def __init__(
        self, ledger: ModelLedger, spawn: Callable[[Coroutine[Any, Any, None]], None]
    ) -> None:
        self.ledger = ledger
        self._spawn = spawn  # runs a background write, owned by the runtime
        self._loading: set[Path] = set()  # models whose "loading" marker is set now
        self._ended = False  # the runtime is stopping: no marker is set any more

    def plan(
        self,
        path: Path,
        from_repository: bool,
        pin: int | Recorded | None = RECORDED,
        retry_failed: bool = False,
    ) -> LoadPlan:
        """What the ledger says for a load of `path` (blocking: reads the version folders).
        `pin`: a pin being asked for (None: an unpin), tried before it is recorded; a version
        pinned on purpose gets a new chance even if its content failed before.
        `retry_failed`: a client's load request, which (as in Triton) tries again the versions
        that failed to load or warm up; a rolled-back or unverified one stays out."""
        present = frozenset(list_versions(path))
        if not from_repository:  # a load request's own files: nothing recorded applies
            return LoadPlan(present, {}, None)
        held = self.ledger.held_back(path, present)
        if retry_failed:
            held = {v: f for v, f in held.items() if f.stage not in (LOAD, WARM_UP)}
        if isinstance(pin, Recorded):
            pin = self.ledger.entry(path).pinned
        elif pin is not None:
            held.pop(pin, None)
        return LoadPlan(present, {v: f.describe() for v, f in held.items()}, pin)

    async def remember(
        self, name: str, path: Path, prepared: PreparedModel, plan: LoadPlan
    ) -> None:
        """Record the versions a load could not bring into service (not those skipped), each
        with its content and stage; on disk when this returns."""
        # Not a version found damaged in the store: it is fetched again, same content.
        failed = {
            v: why
            for v, why in prepared.failed.items()
            if v not in plan.skip and v not in prepared.damaged
        }

        def write() -> None:
            changed = False
            for version, why in failed.items():
                stage = prepared.failed_stage.get(version, LOAD)
                content = content_id(path / str(version))
                changed |= self.ledger.change(path, record_failure(version, stage, why, content))
            if changed:
                self.ledger.save(path)

        try:
            await asyncio.to_thread(write)
        except OSError as exc:  # the model serves all the same; the next change retries
            log.error("model '%s': cannot write its record to the ledger: %s", name, exc)

    async def remember_good(self, name: str, path: Path, version: int) -> None:
        """Record `version` as the model's last good one (it took the traffic for good)."""
        if self.ledger.change(path, record_good(version)):
            await self.save(name, path)

    def verdict(self, name: str, path: Path, version: int, why: str) -> None:
        """Probation's verdict, on the loop: in memory at once (a reload right after sees it),
        written in the background. `why`: '' for a version that passed."""
        if why:
            content = content_id(path / str(version))  # one small file read or a few stat()s
            edit = record_failure(version, PROBATION, why, content)
        else:
            edit = record_good(version)
        if self.ledger.change(path, edit):
            done = "rolled back" if why else "passed its probation"
            self._spawn(self.save(name, path, f"version {version} {done}"))

    async def save(self, name: str, path: Path, what: str = "") -> None:
        """Write a model's record (on a thread); `what`: the news it holds, logged once it is
        on disk (until then a power cut would lose it)."""
        try:
            await asyncio.to_thread(self.ledger.save, path)
        except OSError as exc:
            log.error("model '%s': cannot write its record to the ledger: %s", name, exc)
            return
        if what:
            log.info("model '%s': %s: kept in the ledger across restarts", name, what)

    def loading(self, name: str, path: Path) -> Callable[[int | None], None]:
        """The durable "loading version N" marker of a model (None: the load ended): on disk
        before the load goes on (blocking: call it from the loading thread). A marker found
        at the next start means N killed the process (ledger.py records it failed)."""

        def mark(version: int | None) -> None:
            if version is not None and self._ended:
                return  # shutting down: a load still under way is not the version's fault
            if self.ledger.change(path, record_loading(version)):
                try:
                    self.ledger.save(path)
                except OSError as exc:  # the load goes on; only this protection is lost
                    log.error("model '%s': cannot write its record to the ledger: %s", name, exc)
            if version is None:
                self._loading.discard(path)
            else:
                self._loading.add(path)

        return mark

    def end_loads(self) -> None:
        """Clear every marker still set (a shutdown during a load: not the version's fault;
        blocking)."""
        self._ended = True
        for path in list(self._loading):
            self.loading(path.name, path)(None)
