"""The status page's data: the server, the device, every model with its live numbers, updates,
recent problems; transport-neutral typed results (`StatusReport`), as the control service's.

Everything comes from state the server keeps anyway: the control service (index, readiness,
configs, log settings with their ring of recent problems), the runtime (served versions, their
counters and instances, the ledger), the remote sources and the poller (update state, the
download under way), /proc and the GPU source of the GPU metrics (device). A sampler task reads
the counters every `interval_s` into a small ring per model (`LiveStats`), notes switches of
served versions (`SwitchLog`) and reads the device and the ledger on a thread, so the page
costs the inference path nothing and a request for `/status.json` only assembles.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Protocol

from appliance import __version__
from appliance.common.errors import ApplianceError
from appliance.common.protocol import model_config_pb2 as mc
from appliance.ops.gpu import (
    GpuSource,
)
from appliance.repository.ledger import PROBATION, LedgerEntry, ModelLedger
from appliance.repository.s3 import DownloadProgress
from appliance.runtime.on_demand import NOT_LOADED, is_pinned
from appliance.runtime.placement import where_instances_run
from appliance.runtime.registry import ModelRecord
from appliance.services.control import ControlService, shown_url
from appliance.services.rows import index_rows
from appliance.services.status_results import (
    DeviceStatus,
    DownloadStatus,
    InstanceGroupStatus,
    InstanceStatus,
    MemoryStatus,
    ModelMemory,
    ModelStatus,
    ModelUpdateStatus,
    RecordedFailure,
    ServerStatus,
    SourceStatus,
    StatusReport,
    UpdatesStatus,
)
from appliance.services.status_results import VersionStatus as VersionStatus
from appliance.services.status_samples import (
    SAMPLE_INTERVAL_S,
    DeviceReader,
    LiveStats,
    SwitchLog,
    unread,
)
from appliance.services.status_samples import weighted_percentile as weighted_percentile

log = logging.getLogger(__name__)


class UpdateSource(Protocol):
    """A remote repository's sync state (repository/s3.py's S3Source), read only."""

    @property
    def url(self) -> str: ...
    @property
    def reachable(self) -> bool | None: ...
    @property
    def last_sync_s(self) -> float: ...
    @property
    def last_error(self) -> str: ...
    @property
    def frozen_since_s(self) -> float: ...
    @property
    def downloaded_bytes(self) -> int: ...
    @property
    def pending(self) -> dict[tuple[str, int], str]: ...
    @property
    def skipped(self) -> dict[str, str]: ...  # keys left out of the sync -> why
    @property
    def download(self) -> DownloadProgress | None: ...


class PollState(Protocol):
    @property
    def last_poll_s(self) -> float: ...


# ---- live numbers: pure --------------------------------------------------------------------


def _recorded_s(at: str) -> float | None:
    """The ledger's UTC time (ISO 8601, as ledger.py writes it) as seconds since the epoch."""
    try:
        when = datetime.datetime.strptime(at, "%Y-%m-%dT%H:%M:%SZ")
    except ValueError:
        return None
    return when.replace(tzinfo=datetime.timezone.utc).timestamp()


def update_status(
    name: str, serving: tuple[int, ...], entry: LedgerEntry | None, switches: SwitchLog
) -> ModelUpdateStatus:
    """One model's update history from its served versions, the ledger and the switches."""
    failures = tuple(
        RecordedFailure(version, f.stage, f.reason, _recorded_s(f.at))
        for version, f in sorted((entry.failed if entry else {}).items())
    )
    rollbacks = [f for f in failures if f.stage == PROBATION]
    return ModelUpdateStatus(
        name=name,
        serving=serving,
        last_switch=switches.last.get(name),
        last_good=entry.last_good if entry else None,
        pinned=entry.pinned if entry else None,
        rollback=max(rollbacks, key=lambda f: f.time_s or 0.0, default=None),
        failures=failures,
    )


def _read_ledger(ledger: ModelLedger, models: list[tuple[str, Path]]) -> dict[str, LedgerEntry]:
    """Each model's record (blocking: a file the first time a model's is read)."""
    return {name: ledger.entry(path) for name, path in models}


# ---- the service -------------------------------------------------------------------------------


class StatusService:
    """Assembles the status page's `StatusReport`; `running()` owns the sampler task."""

    def __init__(
        self,
        control: ControlService,
        *,
        store_path: Path,
        local_repositories: Sequence[Path] = (),
        sources: Sequence[UpdateSource] = (),
        poller: Callable[[], PollState | None] = lambda: None,
        poll_interval_s: float | None = None,
        gpu: Callable[[], Awaitable[GpuSource | None]] | None = None,
        interval_s: float = SAMPLE_INTERVAL_S,
    ) -> None:
        self.control = control
        self.interval_s = interval_s
        self.live = LiveStats()
        self.device_reader = DeviceReader(store_path)
        self._local = tuple(str(p) for p in local_repositories)
        self._sources = tuple(sources)
        self._poller = poller
        self._poll_interval_s = poll_interval_s
        self._gpu = gpu  # the GPU readings' source, shared with the metrics (None: none)
        self._started_s = time.time()
        self._started_ns = time.monotonic_ns()
        self._device: DeviceStatus | None = None
        self.switches = SwitchLog()
        self._ledger: dict[str, LedgerEntry] = {}
        # Per source: downloaded_bytes and the time at the last sample, and the rate since.
        self._downloaded: list[tuple[int, float]] = [(s.downloaded_bytes, 0.0) for s in sources]
        self._download_rates: list[float | None] = [None for _ in sources]

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[StatusService]:
        """Sample every `interval_s` until the context exits."""
        task = asyncio.ensure_future(self._loop())
        try:
            yield self
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _loop(self) -> None:
        if self._gpu is not None:
            try:
                self.device_reader.gpu = await self._gpu()
            except Exception:  # the page shows no GPU rather than nothing at all
                log.exception("status page: no GPU readings")
        while True:
            try:
                await self.sample()
            except Exception:  # a bug here must not end the sampling for good
                log.exception("status sampling failed; trying again in %.0f s", self.interval_s)
            await asyncio.sleep(self.interval_s)

    async def sample(self) -> None:
        """One sample: the counters and the served versions (on the loop: no I/O), the device
        and the ledger (a thread)."""
        runtime, now_s = self.control.runtime, time.time()
        self.live.sample(runtime.ready_versions(), now_s)
        records = runtime.registry.records()
        self.switches.observe({r.name: r.versions for r in records}, now_s)
        for i, source in enumerate(self._sources):
            (before, then_s), done = self._downloaded[i], source.downloaded_bytes
            if then_s and now_s > then_s:
                self._download_rates[i] = max(0, done - before) / (now_s - then_s)
            self._downloaded[i] = (done, now_s)
        ledgered = [(r.name, r.path) for r in records if r.path and r.owned_dir is None]
        self._device, self._ledger = await asyncio.to_thread(self._read, ledgered)

    def _read(
        self, ledgered: list[tuple[str, Path]]
    ) -> tuple[DeviceStatus, dict[str, LedgerEntry]]:
        ledger = self.control.runtime.history.ledger
        return self.device_reader.read(), _read_ledger(ledger, ledgered)

    def report(self, since_s: float = 0.0) -> StatusReport:
        """The whole page's data, from what is kept; no I/O. `since_s`: the charts' points
        after this time only (the page asks for what it has not drawn yet)."""
        return StatusReport(
            generated_s=time.time(),
            server=self._server(),
            device=self._device or unread(self.device_reader.store_path),
            models=self._models(since_s),
            updates=self._updates(),
            recent_problems=tuple(self.control.logs.problems.recent()),
            memory=self._memory(),
        )

    def _memory(self) -> MemoryStatus | None:
        """The memory budget's part: each model resident, loading, unloaded or never loaded."""
        runtime = self.control.runtime
        residency = runtime.residency
        if not residency.active:
            return None
        residents = {r.name: r for r in residency.residents()}
        now = time.monotonic()
        models = []
        for record in runtime.registry.records():
            resident = residents.get(record.name)
            estimate = residency.estimates.get(record.name)
            state = (
                "resident" if resident is not None
                else "loading" if runtime.is_loading(record.name)
                else "not_loaded" if record.reason == NOT_LOADED
                else "evicted"
            )
            models.append(
                ModelMemory(
                    name=record.name,
                    state=state,
                    pinned=is_pinned(record.config, record.name, residency.flagged),
                    bytes=resident.bytes if resident is not None else 0,
                    estimate_bytes=estimate.bytes if estimate is not None else 0,
                    estimate_measured=estimate.measured if estimate is not None else False,
                    idle_s=round(now - resident.last_used, 1) if resident is not None else None,
                    reason="" if resident is not None else record.reason,
                )
            )
        return MemoryStatus(
            budget_bytes=residency.budget,
            budget_source=residency.budget_source,
            used_bytes=residency.used(),
            load_on_demand=residency.on_demand,
            idle_unload_secs=residency.idle_s,
            loads_on_demand=sum(residency.loads_on_demand.values()),
            unloads=sum(residency.evictions.values()),
            refusals=sum(residency.refusals.values()),
            models=tuple(models),
        )

    def _server(self) -> ServerStatus:
        metadata = self.control.server_metadata()
        readiness = self.control.readiness()
        return ServerStatus(
            name="edge-appliance",
            version=metadata.version or __version__,
            build=dict(metadata.build),
            started_s=self._started_s,
            uptime_s=round((time.monotonic_ns() - self._started_ns) / 1e9, 1),
            ready=readiness.ready,
            problems=readiness.problems,
            notes=readiness.notes,
        )

    def _models(self, since_s: float = 0.0) -> tuple[ModelStatus, ...]:
        """Every model the server loaded or tried to, and versions still to be fetched. Not
        the repository's never-loaded folders (explicit mode): listing them is disk I/O on
        the loop, and logs a warning per skipped folder, at every refresh of every page."""
        runtime = self.control.runtime
        pending = {**runtime.pending(), **self._downloading()}
        rows: dict[str, list[VersionStatus]] = {}
        for row in index_rows(runtime.registry.records(), pending):
            rows.setdefault(row.name, []).append(VersionStatus(row.version, row.state, row.reason))
        return tuple(
            self._model(name, versions, since_s) for name, versions in sorted(rows.items())
        )

    def _model(self, name: str, versions: list[VersionStatus], since_s: float) -> ModelStatus:
        states = {v.state for v in versions}
        state = "READY" if "READY" in states else next(iter(sorted(states - {""})), "")
        config: mc.ModelConfig | None = None
        if state == "READY":
            with contextlib.suppress(ApplianceError):  # unloaded since the index was read
                config = self.control.model_config(name)
        live = self.live.numbers(name, self.interval_s, since_s)
        if config is None:
            return ModelStatus(name, state, "", tuple(versions), 0, False, (), 0, (), (), live)
        batching = config.dynamic_batching if config.HasField("dynamic_batching") else None
        return ModelStatus(
            name=name,
            state=state,
            platform=config.platform or config.backend,
            versions=tuple(versions),
            max_batch_size=config.max_batch_size,
            dynamic_batching=batching is not None,
            preferred_batch_sizes=tuple(batching.preferred_batch_size) if batching else (),
            max_queue_delay_us=batching.max_queue_delay_microseconds if batching else 0,
            instance_groups=tuple(
                InstanceGroupStatus(
                    mc.ModelInstanceGroup.Kind.Name(group.kind), group.count, tuple(group.gpus)
                )
                for group in config.instance_group
            ),
            instances=self._instances(self.control.runtime.registry.find(name)),
            live=live,
        )

    @staticmethod
    def _instances(record: ModelRecord | None) -> tuple[InstanceStatus, ...]:
        """Every served version's instances, where they run and why (placement.py)."""
        if record is None:
            return ()
        return tuple(
            InstanceStatus(version, p.group, p.name, p.kind, p.gpu, p.reason)
            for version, served in sorted(record.versions.items())
            for p in where_instances_run(served.config, served.instances, record.notes)
        )

    def _updates(self) -> UpdatesStatus:
        poller = self._poller()
        last_poll = poller.last_poll_s if poller is not None and poller.last_poll_s else None
        return UpdatesStatus(
            control_mode=self.control.control_mode,
            local_repositories=self._local,
            sources=tuple(
                SourceStatus(
                    url=shown_url(source.url),
                    reachable=source.reachable,
                    last_sync_s=source.last_sync_s,
                    last_error=source.last_error,
                    downloaded_bytes=source.downloaded_bytes,
                    pending=tuple(
                        f"model '{m}' version {v}: {why}"
                        for (m, v), why in sorted(
                            {**source.pending, **self._downloading([source])}.items()
                        )
                    )
                    + tuple(f"'{key}' left out: {why}" for key, why in source.skipped.items()),
                    download=self._download(source.download, rate),
                    frozen_since_s=source.frozen_since_s,
                )
                for source, rate in zip(self._sources, self._download_rates, strict=True)
            ),
            poll_interval_s=self._poll_interval_s,
            last_poll_s=last_poll,
            models=tuple(
                update_status(
                    r.name, tuple(sorted(r.versions)), self._ledger.get(r.name), self.switches
                )
                for r in self.control.runtime.registry.records()
            ),
        )

    def _downloading(
        self, sources: Sequence[UpdateSource] | None = None
    ) -> dict[tuple[str, int], str]:
        """The versions being fetched now: what they wait for is the download (a reason from
        an earlier poll, such as an upload still settling, stays until the fetch ends)."""
        found: dict[tuple[str, int], str] = {}
        for source in self._sources if sources is None else sources:
            progress = source.download
            if progress is not None:
                found[(progress.model, progress.version)] = (
                    f"downloading: {progress.done_bytes} of {progress.total_bytes} bytes"
                )
        return found

    @staticmethod
    def _download(progress: DownloadProgress | None, rate: float | None) -> DownloadStatus | None:
        if progress is None:
            return None
        return DownloadStatus(
            progress.model,
            progress.version,
            progress.done_bytes,
            progress.total_bytes,
            progress.started_s,
            rate,
        )
