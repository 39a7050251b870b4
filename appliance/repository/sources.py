"""The remote repositories of a server, as one thing the poller and control plane can sync.

A local `--model-repository` folder needs no syncing: the manager reads it directly. Each
remote one (s3://...) is synced into its own folder of the model store, and that folder is
what the manager reads: the server only ever loads local, verified files.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

from appliance.repository.fleet_agent import FleetAgent, ServingView
from appliance.repository.ledger import ModelLedger
from appliance.repository.manifest import ManifestPolicy
from appliance.repository.oci import OciSource
from appliance.repository.oci_registry import OciLocation
from appliance.repository.rollout import DeviceIdentity, ProbationRule
from appliance.repository.rollout_policy import ShadowRule
from appliance.repository.s3 import S3Location, S3Source, SourceError

log = logging.getLogger(__name__)

# True inside a sync (and so in the loads it calls back): a load's own fetch must not wait for
# the sync that is bringing the store up to date right now.
_SYNCING: contextvars.ContextVar[bool] = contextvars.ContextVar("syncing", default=False)


def is_remote(location: str) -> bool:
    return "://" in location


def check_location(location: str) -> None:
    """Raise ValueError for a remote location this server cannot read."""
    if location.startswith("s3://"):
        S3Location.parse(location)
        return
    if location.startswith(("oci://", "oci+http://", "oci+https://")):
        OciLocation.parse(location)
        return
    scheme = location.split("://", 1)[0]
    raise ValueError(
        f"model repository '{location}': {scheme}:// is not supported; use a local folder, "
        "s3://[host:port/]bucket/prefix or oci://host[:port]/repository"
    )


class RemoteSources:
    def __init__(
        self,
        locations: tuple[str, ...],
        state_dir: Path,
        reserve_bytes: int | None,  # None: scaled to the store's file system
        manifest: ManifestPolicy,
        rate_bytes_s: float = 0.0,
        ledger: ModelLedger | None = None,
        timeout_s: float = 10.0,
        tuf_root: bytes | None = None,  # --model-repository-tuf-root: TUF metadata mode
    ) -> None:
        s3_kind: Callable[..., S3Source] = S3Source
        extra: dict[str, bytes] = {}
        if tuf_root is not None:
            from appliance.repository.tuf_source import TufSource

            s3_kind, extra = TufSource, {"trusted_root": tuf_root}

        def source_for(url: str) -> S3Source | OciSource:
            kind: Callable[..., S3Source | OciSource] = OciSource
            if url.startswith("s3://"):
                kind = functools.partial(s3_kind, **extra)
            return kind(
                url,
                state_dir,
                reserve_bytes,
                manifest,
                rate_bytes_s=rate_bytes_s,
                ledger=ledger,
                timeout_s=timeout_s,
            )

        self.sources: list[S3Source | OciSource] = [source_for(url) for url in locations]
        self.agents: list[FleetAgent] = []  # fleet rollouts, one per source (enable_fleet)

    @property
    def roots(self) -> tuple[Path, ...]:
        return tuple(source.root for source in self.sources)

    def enable_fleet(
        self,
        identity: DeviceIdentity,
        report_interval_s: float,
        report_always: bool,
        serving: Callable[[str], ServingView | None],
        flag_probation: bool,
        shadow_view: Callable[[str, int], dict[str, object] | None] = lambda n, v: None,
    ) -> None:
        """Follow each source's rollout documents and report there (fleet_agent.py)."""
        for source in self.sources:
            if not isinstance(source, S3Source):
                continue  # rollout documents live in buckets
            agent = FleetAgent(
                source, identity, report_interval_s, report_always, source.manifest.public_key
            )
            agent.serving, agent.flag_probation = serving, flag_probation
            agent.shadow_view = shadow_view
            self.agents.append(agent)

    def probation_rule(self, name: str, version: int) -> ProbationRule | None:
        """A rollout's probation thresholds for a version it switched in, if any."""
        for agent in self.agents:
            rule = agent.probation_rule(name, version)
            if rule is not None:
                return rule
        return None

    def shadow_rule(self, name: str, version: int) -> ShadowRule | None:
        """A rollout's shadow probation rule for the target it switches to, if any."""
        for agent in self.agents:
            rule = agent.shadow_rule(name, version)
            if rule is not None:
                return rule
        return None

    def verdict(self, name: str, version: int, why: str) -> None:
        """Probation's verdict on a version ('' : passed), for the rollouts' verdict keys."""
        for agent in self.agents:
            agent.verdict(name, version, why)

    @contextlib.asynccontextmanager
    async def opened(self) -> AsyncIterator[RemoteSources]:
        async with contextlib.AsyncExitStack() as stack:
            for source in self.sources:
                await stack.enter_async_context(source.opened())
            for agent in self.agents:  # their writes stop before the clients close
                await stack.enter_async_context(agent.running())
            yield self

    async def sync(
        self,
        only: set[str] | None = None,
        arrived: Callable[[str], Awaitable[None]] | None = None,
    ) -> set[str]:
        """Sync every source; models whose store folders changed. `arrived(name)` is awaited
        as soon as a model's folder changed, before the rest is synced. An unreachable source
        is logged (by the source) and skipped: its cached models keep serving."""
        changed: set[str] = set()
        token = _SYNCING.set(True)
        try:
            for source in self.sources:
                try:
                    changed |= await source.sync(only, arrived)
                except SourceError:
                    pass  # logged by the source; its cached models keep serving
                except OSError as exc:  # the store's disk: the next sync tries again
                    source.reachable = False
                    log.error("syncing %s into the model store failed: %s", source.url, exc)
                except Exception:  # a bug: this source alone, the others still sync
                    source.reachable = False
                    log.exception("syncing %s failed", source.url)
        finally:
            _SYNCING.reset(token)
        return changed

    async def fetch(self, name: str) -> None:
        """Bring one model up to date in the store before it loads (explicit mode); nothing
        when called from a load that a sync started (the sync is doing it)."""
        if not _SYNCING.get():
            await self.sync({name})

    def reachable(self) -> bool:
        """Whether the last sync of every source succeeded."""
        return all(source.reachable for source in self.sources)

    def pending(self) -> dict[tuple[str, int], str]:
        """(model, version) -> why the store does not hold its listed content yet."""
        found: dict[tuple[str, int], str] = {}
        for source in self.sources:
            found.update(source.pending)
        return found

    def owns(self, path: Path) -> bool:
        """Whether a model folder lives in the store, where versions only appear whole."""
        return any(path.is_relative_to(root) for root in self.roots)
