"""The status page's data: the server, the device, every model with its live numbers, updates,
recent problems; transport-neutral typed results (`StatusReport`), as the control service's.

Everything comes from state the server keeps anyway: the control service (index, readiness,
configs, statistics, log settings with their ring of recent problems), the remote sources and
the poller (update state), /proc and the GPU source of the GPU metrics (device). A sampler
task reads the statistics every `interval_s` into a small ring per model (`LiveStats`), so
the page costs the inference path nothing and a request for `/status.json` only assembles.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
import os
import shutil
import socket
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from appliance import __version__
from appliance.errors import ApplianceError
from appliance.gpu_metrics import (
    MEMORY_TOTAL,
    MEMORY_USED,
    POWER_USAGE,
    UTILIZATION,
    GpuSource,
)
from appliance.logs import Problem
from appliance.protocol import model_config_pb2 as mc
from appliance.services.control import ControlService, index_rows
from appliance.services.results import ModelStatistics

log = logging.getLogger(__name__)

# One sample every 2 s, 150 kept: the last 5 minutes, 150 x 4 numbers per model.
SAMPLE_INTERVAL_S = 2.0
RING_POINTS = 150


# ---- typed results ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RatePoint:
    """One sampling interval of a model (all its versions together)."""

    time_s: float  # wall clock at the end of the interval
    requests_per_s: float  # successful and failed requests
    errors_per_s: float
    mean_ms: float | None  # mean latency of the interval's successful requests; None: none


@dataclass(frozen=True, slots=True)
class LiveNumbers:
    """A model's recent traffic. p50 / p99 are percentiles of the intervals' mean latencies,
    weighted by their requests (the server keeps sums and counts, not each request's time)."""

    window_s: float  # the time the numbers cover (at most RING_POINTS intervals)
    requests_per_s: float  # over the last interval
    p50_ms: float | None
    p99_ms: float | None
    error_rate: float  # failed / all requests over the window; 0 with no requests
    points: tuple[RatePoint, ...]  # oldest first, for the charts


@dataclass(frozen=True, slots=True)
class VersionStatus:
    version: int | None  # None: a model with no version to show
    state: str  # READY, UNAVAILABLE, LOADING, UNLOADING, or "" when never loaded
    reason: str  # why it does not serve, or notes on what serves (a pin)


@dataclass(frozen=True, slots=True)
class InstanceGroupStatus:
    kind: str  # KIND_GPU, KIND_CPU, KIND_AUTO, KIND_MODEL
    count: int
    gpus: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ModelStatus:
    name: str
    state: str  # READY when a version serves, else the state of the model's rows
    platform: str  # "" when no version serves (the config is a served version's)
    versions: tuple[VersionStatus, ...]
    max_batch_size: int
    dynamic_batching: bool
    preferred_batch_sizes: tuple[int, ...]
    max_queue_delay_us: int
    instance_groups: tuple[InstanceGroupStatus, ...]
    live: LiveNumbers


@dataclass(frozen=True, slots=True)
class GpuStatus:
    uuid: str
    utilization: float | None  # 0.0 - 1.0
    memory_total_bytes: float | None
    memory_used_bytes: float | None
    power_watts: float | None


@dataclass(frozen=True, slots=True)
class DeviceStatus:
    hostname: str
    cpu_count: int
    cpu_percent: float | None  # all CPUs, over the last sampling interval
    load_1m: float | None
    memory_total_bytes: int | None
    memory_available_bytes: int | None
    store_path: str
    store_free_bytes: int | None
    store_total_bytes: int | None
    gpus: tuple[GpuStatus, ...]


@dataclass(frozen=True, slots=True)
class SourceStatus:
    """A remote repository (S3): never its keys."""

    url: str
    reachable: bool | None  # None until its first sync
    last_sync_s: float  # wall clock of the last successful listing; 0: never
    last_error: str
    downloaded_bytes: int
    pending: tuple[str, ...]  # "model version N: why", versions not in the store yet


@dataclass(frozen=True, slots=True)
class UpdatesStatus:
    control_mode: str
    local_repositories: tuple[str, ...]
    sources: tuple[SourceStatus, ...]
    poll_interval_s: float | None  # None: not in poll mode
    last_poll_s: float | None  # wall clock of the last successful poll; None: none yet


@dataclass(frozen=True, slots=True)
class ServerStatus:
    name: str
    version: str
    build: dict[str, Any]
    started_s: float  # wall clock
    uptime_s: float
    ready: bool
    problems: tuple[str, ...]  # why not ready / which models do not serve
    notes: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class StatusReport:
    """What `GET /status.json` answers (docs: README, "Status page")."""

    generated_s: float
    server: ServerStatus
    device: DeviceStatus
    models: tuple[ModelStatus, ...]
    updates: UpdatesStatus
    recent_problems: tuple[Problem, ...]  # oldest first


# ---- what the status service reads, as protocols (the composition root hands them over) --------


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
    def downloaded_bytes(self) -> int: ...
    @property
    def pending(self) -> dict[tuple[str, int], str]: ...


class PollState(Protocol):
    @property
    def last_poll_s(self) -> float: ...


# ---- live numbers: pure --------------------------------------------------------------------


@dataclass
class _Counters:
    requests: int = 0
    failures: int = 0
    success_ns: int = 0
    successes: int = 0


def _totals(rows: Iterable[ModelStatistics]) -> dict[tuple[str, int], _Counters]:
    found: dict[tuple[str, int], _Counters] = {}
    for row in rows:
        stats = row.inference_stats
        found[(row.name, row.version)] = _Counters(
            stats.success.count + stats.fail.count,
            stats.fail.count,
            stats.success.ns,
            stats.success.count,
        )
    return found


def weighted_percentile(values: Sequence[tuple[float, int]], fraction: float) -> float | None:
    """The value below which `fraction` of the weight lies; (value, weight) pairs."""
    pairs = sorted((v, w) for v, w in values if w > 0)
    if not pairs:
        return None
    cumulative: list[int] = []
    total = 0
    for _, weight in pairs:
        total += weight
        cumulative.append(total)
    at = bisect.bisect_left(cumulative, fraction * total)
    return pairs[min(at, len(pairs) - 1)][0]


class LiveStats:
    """A bounded ring of rate points per model, fed by statistics snapshots (pure: the caller
    gives the time)."""

    def __init__(self, points: int = RING_POINTS) -> None:
        self._points = points
        self._rings: dict[str, deque[RatePoint]] = {}
        self._previous: dict[tuple[str, int], _Counters] | None = None
        self._previous_s = 0.0

    def sample(self, rows: Iterable[ModelStatistics], now_s: float) -> None:
        """Add one point per model from a snapshot of every served version's counters."""
        totals = _totals(rows)
        previous, elapsed_s = self._previous, now_s - self._previous_s
        self._previous, self._previous_s = totals, now_s
        if previous is None or elapsed_s <= 0:
            return  # the first snapshot is the baseline
        per_model: dict[str, _Counters] = {}
        for key, now in totals.items():
            before = previous.get(key)
            if before is None or before.requests > now.requests:
                before = _Counters()  # a version that came in since: all its requests are new
            delta = per_model.setdefault(key[0], _Counters())
            delta.requests += now.requests - before.requests
            delta.failures += now.failures - before.failures
            delta.successes += now.successes - before.successes
            delta.success_ns += now.success_ns - before.success_ns
        for name in list(self._rings):
            if name not in per_model:
                del self._rings[name]  # no version serves: its chart starts again when one does
        for name, delta in per_model.items():
            ring = self._rings.setdefault(name, deque(maxlen=self._points))
            mean_ms = delta.success_ns / delta.successes / 1e6 if delta.successes else None
            ring.append(
                RatePoint(
                    now_s, delta.requests / elapsed_s, delta.failures / elapsed_s, mean_ms
                )
            )

    def numbers(self, name: str, interval_s: float) -> LiveNumbers:
        points = tuple(self._rings.get(name, ()))
        if not points:
            return LiveNumbers(0.0, 0.0, None, None, 0.0, ())
        requests = sum(p.requests_per_s for p in points)
        errors = sum(p.errors_per_s for p in points)
        latencies = [
            (p.mean_ms, round((p.requests_per_s - p.errors_per_s) * interval_s))
            for p in points
            if p.mean_ms is not None
        ]
        return LiveNumbers(
            window_s=len(points) * interval_s,
            requests_per_s=points[-1].requests_per_s,
            p50_ms=weighted_percentile(latencies, 0.5),
            p99_ms=weighted_percentile(latencies, 0.99),
            error_rate=errors / requests if requests else 0.0,
            points=points,
        )


# ---- device readings (blocking: on a thread) -------------------------------------------------


def _cpu_times(root: Path) -> tuple[int, int] | None:
    """(busy, total) jiffies of all CPUs from /proc/stat."""
    try:
        fields = (root / "proc/stat").read_text().split("\n", 1)[0].split()[1:]
        values = [int(v) for v in fields]
    except (OSError, ValueError):
        return None
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    return sum(values) - idle, sum(values)


def _meminfo(root: Path) -> tuple[int | None, int | None]:
    try:
        lines = (root / "proc/meminfo").read_text().splitlines()
    except OSError:
        return None, None
    found: dict[str, int] = {}
    for line in lines:
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            found[key] = int(parts[0]) * 1024
    return found.get("MemTotal"), found.get("MemAvailable")


@dataclass
class DeviceReader:
    """Reads the device's numbers; keeps the last CPU times for the next interval's use."""

    store_path: Path
    gpu: GpuSource | None = None
    root: Path = Path("/")
    _cpu: tuple[int, int] | None = field(default=None, repr=False)

    def read(self) -> DeviceStatus:
        cpu_now = _cpu_times(self.root)
        cpu_percent = None
        if cpu_now is not None and self._cpu is not None and cpu_now[1] > self._cpu[1]:
            busy, total = cpu_now[0] - self._cpu[0], cpu_now[1] - self._cpu[1]
            cpu_percent = round(100.0 * busy / total, 1)
        self._cpu = cpu_now
        memory_total, memory_available = _meminfo(self.root)
        store_free = store_total = None
        with contextlib.suppress(OSError):
            usage = shutil.disk_usage(self._existing(self.store_path))
            store_free, store_total = usage.free, usage.total
        load_1m = None
        with contextlib.suppress(OSError, AttributeError):
            load_1m = os.getloadavg()[0]
        return DeviceStatus(
            hostname=socket.gethostname(),
            cpu_count=os.cpu_count() or 1,
            cpu_percent=cpu_percent,
            load_1m=load_1m,
            memory_total_bytes=memory_total,
            memory_available_bytes=memory_available,
            store_path=str(self.store_path),
            store_free_bytes=store_free,
            store_total_bytes=store_total,
            gpus=self._gpus(),
        )

    def _gpus(self) -> tuple[GpuStatus, ...]:
        if self.gpu is None:
            return ()
        try:
            readings = self.gpu.read()
        except Exception:  # a driver hiccup must not end the page's readings
            log.debug("GPU reading failed", exc_info=True)
            return ()
        return tuple(
            GpuStatus(
                r.uuid,
                r.values.get(UTILIZATION),
                r.values.get(MEMORY_TOTAL),
                r.values.get(MEMORY_USED),
                r.values.get(POWER_USAGE),
            )
            for r in readings
        )

    @staticmethod
    def _existing(path: Path) -> Path:
        """The path, or its nearest existing parent (the store may not exist yet)."""
        path = path.absolute()
        while not path.exists() and path != path.parent:
            path = path.parent
        return path


def _unread(store_path: Path) -> DeviceStatus:
    """The device before the first sample: what needs no I/O."""
    return DeviceStatus(
        socket.gethostname(), os.cpu_count() or 1, None, None, None, None, str(store_path),
        None, None, (),
    )


def shown_url(url: str) -> str:
    """A repository URL without any user or password in it."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    host, slash, path = rest.partition("/")
    return f"{scheme}://{host.rpartition('@')[2]}{slash}{path}"


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
        """One sample: the statistics (on the loop: counters only) and the device (a thread)."""
        self.live.sample(self.control.statistics(), time.time())
        self._device = await asyncio.to_thread(self.device_reader.read)

    def report(self) -> StatusReport:
        """The whole page's data, from what is kept; no I/O."""
        return StatusReport(
            generated_s=time.time(),
            server=self._server(),
            device=self._device or _unread(self.device_reader.store_path),
            models=self._models(),
            updates=self._updates(),
            recent_problems=tuple(self.control.logs.problems.recent()),
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

    def _models(self) -> tuple[ModelStatus, ...]:
        """Every model the server loaded or tried to, and versions still to be fetched. Not
        the repository's never-loaded folders (explicit mode): listing them is disk I/O on
        the loop, and logs a warning per skipped folder, at every refresh of every page."""
        runtime = self.control.manager
        rows: dict[str, list[VersionStatus]] = {}
        for row in index_rows(runtime.registry.records(), runtime.pending()):
            rows.setdefault(row.name, []).append(VersionStatus(row.version, row.state, row.reason))
        return tuple(self._model(name, versions) for name, versions in sorted(rows.items()))

    def _model(self, name: str, versions: list[VersionStatus]) -> ModelStatus:
        states = {v.state for v in versions}
        state = "READY" if "READY" in states else next(iter(sorted(states - {""})), "")
        config: mc.ModelConfig | None = None
        if state == "READY":
            with contextlib.suppress(ApplianceError):  # unloaded since the index was read
                config = self.control.model_config(name)
        live = self.live.numbers(name, self.interval_s)
        if config is None:
            return ModelStatus(name, state, "", tuple(versions), 0, False, (), 0, (), live)
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
            live=live,
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
                        for (m, v), why in sorted(source.pending.items())
                    ),
                )
                for source in self._sources
            ),
            poll_interval_s=self._poll_interval_s,
            last_poll_s=last_poll,
        )
