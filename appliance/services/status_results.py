"""The status page's typed results (`StatusReport` and its parts), as services/results.py
holds the control service's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from appliance.ops.logs import Problem

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
    """A model's recent traffic. p50 / p99: percentiles of its successful requests' latencies
    over the window, from each interval's latencies (all of them up to 512 an interval, else
    its last 512, weighted to the interval's count) in log buckets 4.4 % wide: within 2.2 %."""

    window_s: float  # the time the numbers cover (at most RING_POINTS intervals)
    requests_per_s: float  # over the last interval
    p50_ms: float | None  # None: no successful request in the window
    p99_ms: float | None
    error_rate: float  # failed / all requests over the window; 0 with no requests
    ring_points: int  # the points the server holds for the charts (the window)
    points: tuple[RatePoint, ...]  # oldest first; with ?since=T only those after T


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
class InstanceStatus:
    """One model instance of a served version, and where it runs."""

    version: int
    group: str
    name: str  # <group>_<n>
    kind: str  # where it runs: KIND_GPU or KIND_CPU (KIND_MODEL: the backend decides)
    gpu: int | None  # the device of a GPU instance
    reason: str  # why it runs on CPU when its config asked for a GPU; "" otherwise


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
    instance_groups: tuple[InstanceGroupStatus, ...]  # as served (the kind where they run)
    instances: tuple[InstanceStatus, ...]  # every served version's, by version
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
class DownloadStatus:
    """The version a source is fetching now."""

    model: str
    version: int
    done_bytes: int  # of its changed files (a part left by an earlier attempt counts)
    total_bytes: int
    started_s: float  # wall clock
    rate_bytes_s: float | None  # over the last sampling interval; None: not sampled yet


@dataclass(frozen=True, slots=True)
class SourceStatus:
    """A remote repository (S3): never its keys."""

    url: str
    reachable: bool | None  # None until its first sync
    last_sync_s: float  # wall clock of the last successful listing; 0: never
    last_error: str
    downloaded_bytes: int
    pending: tuple[str, ...]  # "model version N: why", versions not in the store yet
    download: DownloadStatus | None  # None: nothing being fetched
    # TUF mode: when the trusted metadata expired, so updates froze (0: not frozen)
    frozen_since_s: float = 0.0


@dataclass(frozen=True, slots=True)
class SwitchStatus:
    """A change of the versions a model serves, as the sampler saw it (every 2 s)."""

    time_s: float  # wall clock of the sample that saw it
    from_versions: tuple[int, ...]  # () : the model was not serving (its first load)
    to_versions: tuple[int, ...]  # () : it stopped serving


@dataclass(frozen=True, slots=True)
class RecordedFailure:
    """A version's content the ledger keeps out, until the content changes."""

    version: int
    stage: str  # verification, load, warm-up, probation (probation: a rollback)
    reason: str
    time_s: float | None  # wall clock when it was recorded; None: not known


@dataclass(frozen=True, slots=True)
class ModelUpdateStatus:
    """One model's update history: what serves, the last switch, the ledger's record."""

    name: str
    serving: tuple[int, ...]
    last_switch: SwitchStatus | None  # None: none seen since the server started
    last_good: int | None  # the last version that took the traffic and served well
    pinned: int | None
    rollback: RecordedFailure | None  # the newest rolled-back version (stage probation)
    failures: tuple[RecordedFailure, ...]  # every version held back, by version


@dataclass(frozen=True, slots=True)
class UpdatesStatus:
    control_mode: str
    local_repositories: tuple[str, ...]
    sources: tuple[SourceStatus, ...]
    poll_interval_s: float | None  # None: not in poll mode
    last_poll_s: float | None  # wall clock of the last successful poll; None: none yet
    models: tuple[ModelUpdateStatus, ...]  # every model the server loaded or tried to


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
class ModelMemory:
    """One model under the memory budget (docs/memory.md)."""

    name: str
    state: str  # resident | loading | evicted (unloaded idle or for room) | not_loaded
    pinned: bool  # resident by its config or --model-resident
    bytes: int  # what its loaded versions took, measured at their load; 0: not loaded
    estimate_bytes: int  # its last load's estimate (0: none yet)
    estimate_measured: bool  # the estimate is an earlier measurement, not its files' size
    idle_s: float | None  # since its last request; None: not loaded
    reason: str  # why it is not loaded ('' when it is)


@dataclass(frozen=True, slots=True)
class MemoryStatus:
    """The memory budget, loads on demand and the idle timer; None without any of them."""

    budget_bytes: int  # 0: no budget
    budget_source: str  # bytes | memory.max | MemAvailable ('' without a budget)
    used_bytes: int  # by the loaded models, as measured
    load_on_demand: bool
    idle_unload_secs: float  # 0: never
    loads_on_demand: int
    unloads: int  # idle, or to make room
    refusals: int
    models: tuple[ModelMemory, ...]


@dataclass(frozen=True, slots=True)
class StatusReport:
    """What `GET /status.json` answers (docs: README, "Status page")."""

    generated_s: float
    server: ServerStatus
    device: DeviceStatus
    models: tuple[ModelStatus, ...]
    updates: UpdatesStatus
    recent_problems: tuple[Problem, ...]  # oldest first
    memory: MemoryStatus | None = None  # the memory budget's (docs/memory.md)


# ---- what the status service reads, as protocols (the composition root hands them over) --------
