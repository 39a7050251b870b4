"""Poll mode: reload models whose folders changed, load new ones, unload removed ones.

Each poll first syncs the remote repositories into the model store (a model that arrives is
loaded at once), then scans the folders. The same machinery, run until the first successful
sync, is how the other modes catch up with remote repositories after start-up.
A change in a local folder is acted on only once its fingerprint (every file's path, size
and mtime) is the same on two polls in a row, so a model still being copied is never loaded
half-way; the store needs no such wait, as versions appear there whole. A version that fails
to load is not retried until its content changes again, and what already serves keeps
serving (see ModelRuntime.load).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from appliance.common.errors import ApplianceError
from appliance.repository.local import fingerprint
from appliance.repository.sources import RemoteSources

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Changes:
    load: tuple[str, ...]  # new or changed, and settled
    unload: tuple[str, ...]


def plan_changes(
    served: dict[str, str],
    seen: dict[str, str],
    now: dict[str, str],
    settled: frozenset[str] = frozenset(),
) -> Changes:
    """Pure: `served` fingerprints acted on, `seen` last poll's, `now` this poll's.

    Models in `settled` change only whole (the model store), so they need no second look.
    """
    load = tuple(
        sorted(
            n
            for n, fp in now.items()
            if served.get(n) != fp and (seen.get(n) == fp or n in settled)
        )
    )
    unload = tuple(sorted(n for n in served if n not in now))
    return Changes(load, unload)


class ModelTarget(Protocol):
    """What the poller drives (the model runtime): the repository feeds it, never the reverse."""

    def model_names(self) -> dict[str, Path]: ...

    async def load(self, name: str) -> None: ...

    async def unload(self, name: str) -> None: ...


class RepositoryPoller:
    """Syncs the remote repositories into the store and tells the runtime what changed.

    Poll mode: every `interval_s`, the first poll at once, every model. `until_synced`
    (the none and explicit modes, with remote repositories): the start-up catch-up, which acts
    only on models in the store (and in `only`, when given) and ends once every remote
    repository has been synced once, trying again every `interval_s` until then. Either way a
    model fetched into the store is loaded as soon as it arrives, not after the whole sync.
    """

    def __init__(
        self,
        manager: ModelTarget,
        interval_s: float,
        remote: RemoteSources | None = None,
        *,
        until_synced: bool = False,
        only: set[str] | None = None,
    ) -> None:
        self._manager = manager
        self._remote = remote
        self._interval_s = interval_s
        self._until_synced = until_synced
        self._only = only
        self._served: dict[str, str] = {}
        self._seen: dict[str, str] = {}
        self.last_poll_s = 0.0  # wall-clock time of the last successful scan (for metrics)
        # Set once a poll reached every remote repository and loaded what it brought.
        self.synced = asyncio.Event()

    def _names(self) -> tuple[dict[str, Path], frozenset[str]]:
        names = self._manager.model_names()
        in_store = frozenset(
            n for n, path in names.items() if self._remote is not None and self._remote.owns(path)
        )
        if self._until_synced:  # local folders are read once, at start
            names = {n: p for n, p in names.items() if n in in_store}
        if self._only is not None:
            names = {n: p for n, p in names.items() if n in self._only}
        return names, in_store

    def _scan(self) -> tuple[dict[str, str], frozenset[str]]:
        names, in_store = self._names()
        return {name: fingerprint(path) for name, path in names.items()}, in_store

    async def _arrived(self, name: str) -> None:
        """A model's store folder changed in the middle of a sync: load it now."""
        try:
            names, _ = await asyncio.to_thread(self._names)
            if name not in names:
                return
            self._served[name] = await asyncio.to_thread(fingerprint, names[name])
        except (ApplianceError, OSError) as exc:
            log.error("cannot read the model repository: %s", exc)
            return
        log.info("model '%s' arrived in the model store; loading", name)
        with contextlib.suppress(ApplianceError):  # logged and kept in the index
            await self._manager.load(name)

    async def poll_once(self) -> Changes:
        reached = True
        if self._remote is not None:
            try:
                await self._remote.sync(self._only, self._arrived)
                reached = self._remote.reachable()
            except Exception:  # the local folders are scanned all the same
                log.exception("syncing the remote repositories failed")
                reached = False
        try:
            now, in_store = await asyncio.to_thread(self._scan)
        except (ApplianceError, OSError) as exc:
            log.error("cannot read the model repository: %s", exc)
            return Changes((), ())
        self.last_poll_s = time.time()
        changes = plan_changes(self._served, self._seen, now, in_store)
        self._seen = now
        for name in changes.load:
            self._served[name] = now[name]  # a failed load is retried only after a change
            log.info("model '%s' changed in the repository; loading", name)
            with contextlib.suppress(ApplianceError):  # logged and kept in the index
                await self._manager.load(name)
        for name in changes.unload:
            del self._served[name]
            log.info("model '%s' left the repository; unloading", name)
            with contextlib.suppress(ApplianceError):
                await self._manager.unload(name)
        if reached:
            self.synced.set()
        return changes

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Remember what start-up loaded, then poll until the context exits."""
        self._served, _ = await asyncio.to_thread(self._scan)
        self._seen = dict(self._served)
        task = asyncio.ensure_future(self._loop())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _loop(self) -> None:
        first = True
        while not (self._until_synced and self.synced.is_set()):
            if not first:
                await asyncio.sleep(self._interval_s)
            first = False
            try:
                await self.poll_once()
            except Exception:  # a bug or a full disk must not end polling for good
                log.exception("repository poll failed; trying again in %.0f s", self._interval_s)
