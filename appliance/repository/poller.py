"""Poll mode: reload models whose folders changed, load new ones, unload removed ones.

A change is acted on only once the folder's fingerprint (every file's path, size and mtime)
is the same on two polls in a row, so a model still being copied is never loaded half-way. A
version that fails to load is not retried until its content changes again, and what already
serves keeps serving (see ModelManager.load).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from appliance.errors import ApplianceError
from appliance.repository.manager import ModelManager

log = logging.getLogger(__name__)


def fingerprint(model_dir: Path) -> str:
    """A digest of every file's relative path, size and modification time."""
    digest = hashlib.blake2b(digest_size=16)
    for root, dirs, files in os.walk(model_dir):
        dirs.sort()
        for name in sorted(files):
            path = Path(root) / name
            try:
                stat = path.stat()
            except OSError:
                continue  # vanished while listing: the next poll sees the settled state
            digest.update(
                f"{path.relative_to(model_dir)}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode()
            )
    return digest.hexdigest()


@dataclass(frozen=True)
class Changes:
    load: tuple[str, ...]  # new or changed, and settled
    unload: tuple[str, ...]


def plan_changes(served: dict[str, str], seen: dict[str, str], now: dict[str, str]) -> Changes:
    """Pure: `served` fingerprints acted on, `seen` last poll's, `now` this poll's."""
    load = tuple(sorted(n for n, fp in now.items() if served.get(n) != fp and seen.get(n) == fp))
    unload = tuple(sorted(n for n in served if n not in now))
    return Changes(load, unload)


class RepositoryPoller:
    def __init__(self, manager: ModelManager, interval_s: float) -> None:
        self._manager = manager
        self._interval_s = interval_s
        self._served: dict[str, str] = {}
        self._seen: dict[str, str] = {}
        self.last_poll_s = 0.0  # wall-clock time of the last successful scan (for metrics)

    def _scan(self) -> dict[str, str]:
        return {name: fingerprint(path) for name, path in self._manager.model_names().items()}

    async def poll_once(self) -> Changes:
        try:
            now = await asyncio.to_thread(self._scan)
        except (ApplianceError, OSError) as exc:
            log.error("cannot read the model repository: %s", exc)
            return Changes((), ())
        self.last_poll_s = time.time()
        changes = plan_changes(self._served, self._seen, now)
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
        return changes

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Remember what start-up loaded, then poll until the context exits."""
        self._served = await asyncio.to_thread(self._scan)
        self._seen = dict(self._served)
        task = asyncio.ensure_future(self._loop())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            await self.poll_once()
