"""The status page's typed results (`StatusReport` and its parts), as services/results.py
holds the control service's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from appliance.logs import Problem

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
