"""What the runtime takes from the server's settings, and how a served version is let go."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from appliance.common.host_policy import HostPolicy
from appliance.common.settings import (
    DEFAULT_MAX_BATCH_SIZE,
    MemorySettings,
    SchedulingSettings,
    ServerSettings,
)
from appliance.repository.manifest import ManifestPolicy
from appliance.runtime.registry import ServedVersion


@dataclass(frozen=True)
class RuntimeSettings:
    """What the runtime takes from the server's settings (see `from_server`); no defaults of
    its own beyond those of ServerSettings, so serve, check and tune run under one set."""

    repositories: tuple[Path, ...]
    strict_model_config: bool
    drain_timeout_s: float  # a retiring version's in-flight requests get this long
    latency_histograms: bool
    manifest: ManifestPolicy  # SHA256SUMS required / signed
    scheduling: SchedulingSettings
    # Automatic rollback: a new version whose model errors exceed this share of its first
    # `rollback_window` requests is taken out, and the version it replaced serves again.
    rollback_error_rate: float  # 0: off
    rollback_window: int
    cache_dir: Path | None  # derived files of models (engines, conversions) go under it
    load_concurrency: int = 2
    load_retries: int = 0  # a version whose instances failed to load is tried this often again
    # --model-namespacing: a model is (repository, name); a name in two repositories loads
    # twice, and an ensemble's steps are its own repository's models first.
    namespacing: bool = False
    # --host-policy's policies by name (appliance/common/host_policy.py).
    host_policies: Mapping[str, HostPolicy] = field(default_factory=dict)
    # --metrics-config summary_latencies=true: the summaries' (quantile, error); () off.
    summary_quantiles: tuple[tuple[float, float], ...] = ()
    # --model-config-name: each model's config is configs/<name>.pbtxt where that exists.
    config_name: str = ""
    # Auto-complete's max_batch_size for a model that can batch, by backend ('': the others;
    # --backend-config [BACKEND,]default-max-batch-size).
    default_max_batch_sizes: Mapping[str, int] = field(
        default_factory=lambda: {"": DEFAULT_MAX_BATCH_SIZE}
    )
    # ... or whose median latency over the window exceeds this many times the replaced one's.
    rollback_latency_ratio: float = 0.0  # 0: off
    # Models on demand under a memory budget (runtime/on_demand.py); the measured costs are
    # kept in `state_dir` (None: in memory only).
    memory: MemorySettings = field(default_factory=MemorySettings)
    state_dir: Path | None = None

    @classmethod
    def from_server(
        cls,
        settings: ServerSettings,
        repositories: tuple[Path, ...] | None = None,
        manifest: ManifestPolicy | None = None,
    ) -> RuntimeSettings:
        """The runtime's part of the server's settings (`repositories`: the local ones plus
        the model store's roots, when remote sources feed it)."""
        return cls(
            repositories=settings.model_repositories if repositories is None else repositories,
            strict_model_config=settings.strict_model_config,
            config_name=settings.model_config_name,
            drain_timeout_s=settings.exit_timeout_secs,
            latency_histograms=settings.latency_histograms,
            manifest=manifest or ManifestPolicy(settings.require_manifest, None),
            scheduling=settings.scheduling,
            rollback_error_rate=settings.rollback_error_rate,
            rollback_window=settings.rollback_window,
            cache_dir=settings.model_store_dir,
            rollback_latency_ratio=settings.rollback_latency_ratio,
            memory=settings.memory,
            state_dir=settings.model_store_dir,
            load_concurrency=settings.model_load_threads,
            load_retries=settings.model_load_retries,
            namespacing=settings.model_namespacing,
            host_policies={policy.name: policy for policy in settings.host_policies},
            summary_quantiles=settings.summary_quantiles if settings.latency_summaries else (),
            default_max_batch_sizes={
                "": settings.default_max_batch_size,
                **dict(settings.backend_max_batch_sizes),
            },
        )


async def release_version(served: ServedVersion, timeout_s: float, reason: str) -> str:
    """Stop one version's scheduler within timeout_s and close its instances; a line
    naming what had to be cancelled, '' when nothing was."""
    deadline = time.monotonic() + timeout_s
    failed = await served.scheduler.stop(timeout_s, reason)
    # Work was failed: the deadline has passed, so instances still running are
    # interrupted at once where the backend can (a Python model's process ends).
    left_s = 0.0 if failed else max(0.0, deadline - time.monotonic())
    stuck = await asyncio.to_thread(served.scheduler.release, left_s)
    parts = [f"{failed} request(s) cancelled"] if failed else []
    if stuck:
        parts.append(f"instance(s) still running: {', '.join(stuck)}")
    return f"{served.label}: {'; '.join(parts)}" if parts else ""
