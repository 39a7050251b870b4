"""ModelRuntime: which models and versions are loaded, their state, load / unload / lookup."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import shutil
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from appliance.errors import (
    ApplianceError,
    ConfigError,
    InvalidInput,
    ModelNotFound,
    ModelNotReady,
    Unsupported,
)
from appliance.model_config import ENSEMBLE, ModelConfig, read_config
from appliance.repository.local import fingerprint, list_models
from appliance.repository.manifest import NO_MANIFEST_RULES, ManifestPolicy
from appliance.runtime.loader import (
    PreparedModel,
    TensorRule,
    prepare_model,
    tensor_rules,
)
from appliance.scheduling.batcher import Scheduler
from appliance.scheduling.ensemble import EnsemblePlan
from appliance.scheduling.policy import BatchPolicy
from appliance.scheduling.queues import QueuePolicy
from appliance.scheduling.rate_limiter import RateLimiter
from appliance.scheduling.sequence import SequenceScheduler
from appliance.scheduling.stats import LatencyHistogram, ModelStats
from appliance.settings import SchedulingSettings

log = logging.getLogger(__name__)

READY, UNAVAILABLE, LOADING, UNLOADING = "READY", "UNAVAILABLE", "LOADING", "UNLOADING"


@dataclass
class ServedVersion:
    """One ready model version: its config, tensor rules, scheduler and statistics."""

    name: str
    version: int
    config: ModelConfig
    inputs: dict[str, TensorRule]
    outputs: dict[str, TensorRule]
    labels: dict[str, list[str]]
    scheduler: Scheduler | SequenceScheduler  # an ensemble's has no instances, gets no work
    stats: ModelStats
    ensemble: EnsemblePlan | None = None
    # Read on every request: plain attributes, not protobuf lookups.
    max_batch_size: int = 0
    all_outputs: tuple[str, ...] = ()
    cache_enabled: bool = False
    sequence: bool = False
    decoupled: bool = False

    def __post_init__(self) -> None:
        self.max_batch_size = int(self.config.max_batch_size)
        self.all_outputs = tuple(self.outputs)
        self.cache_enabled = bool(self.config.response_cache.enable)
        self.sequence = self.config.HasField("sequence_batching")
        self.decoupled = bool(self.config.model_transaction_policy.decoupled)


@dataclass
class ModelRecord:
    """What the repository index shows for one model."""

    name: str
    path: Path | None
    state: str = UNAVAILABLE
    reason: str = ""
    config: ModelConfig | None = None
    versions: dict[int, ServedVersion] = field(default_factory=dict)
    failed: dict[int, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # e.g. GPU instances running on CPU
    owned_dir: Path | None = None  # a folder the server made for it (file overrides)


@dataclass(frozen=True)
class RuntimeSettings:
    repositories: tuple[Path, ...]
    strict_model_config: bool = False
    drain_timeout_s: float = 30.0
    load_concurrency: int = 2
    latency_histograms: bool = False
    manifest: ManifestPolicy = NO_MANIFEST_RULES  # SHA256SUMS required / signed
    scheduling: SchedulingSettings = field(default_factory=SchedulingSettings)
    # Automatic rollback: a new version whose model errors exceed this share of its first
    # `rollback_window` requests is taken out, and the version it replaced serves again.
    rollback_error_rate: float = 0.0  # 0: off
    rollback_window: int = 100
    cache_dir: Path | None = None  # derived files of models (engines, conversions) go under it


@dataclass
class Probation:
    """A newly switched-in version watched over its first requests, with the versions it
    replaced still loaded (not drained) so that a rollback is instant."""

    served: ServedVersion
    held: list[ServedVersion]
    requests: int = 0
    failures: int = 0


def _policy(config: ModelConfig) -> BatchPolicy:
    dyn = config.dynamic_batching if config.HasField("dynamic_batching") else None
    if config.model_transaction_policy.decoupled:
        dyn = None  # a decoupled request streams its own responses: one request per execution
    return BatchPolicy(
        max_batch_size=int(config.max_batch_size),
        dynamic=dyn is not None,
        preferred_batch_sizes=tuple(dyn.preferred_batch_size) if dyn else (),
        max_queue_delay_ns=int(dyn.max_queue_delay_microseconds) * 1000 if dyn else 0,
    )


def _queue_policy(policy: Any) -> QueuePolicy:
    return QueuePolicy(
        max_queue_size=int(policy.max_queue_size),
        default_timeout_ns=int(policy.default_timeout_microseconds) * 1000,
        delay_on_timeout=policy.timeout_action == policy.DELAY,
        allow_timeout_override=bool(policy.allow_timeout_override),
    )


def _queue_settings(config: ModelConfig) -> tuple[int, int, dict[int, QueuePolicy]]:
    """Priority levels, the default level and each level's queue policy from the config."""
    if not config.HasField("dynamic_batching"):
        return 0, 0, {}
    dyn = config.dynamic_batching
    levels = int(dyn.priority_levels)
    default = _queue_policy(dyn.default_queue_policy)
    policies = dict.fromkeys(range(1, max(1, levels) + 1), default)
    for level, policy in dyn.priority_queue_policy.items():
        policies[int(level)] = _queue_policy(policy)
    return levels, int(dyn.default_priority_level), policies


def _join(*parts: str) -> str:
    return "; ".join(p for p in parts if p)


def _is_ensemble(model_dir: Path) -> bool:
    try:
        config, _ = read_config(model_dir)
    except ApplianceError:
        return False
    return bool(config.platform == ENSEMBLE)


class ModelRuntime:
    """Loads models from the repositories and hands out ready versions."""

    def __init__(self, settings: RuntimeSettings) -> None:
        self._settings = settings
        self._models: dict[str, ModelRecord] = {}
        self.host: Any = None  # blocking inference entry handed to backends for BLS
        # (model, version) -> why a remote version is not in the store yet (sources.py).
        self.pending: Callable[[], dict[tuple[str, int], str]] = dict
        # Explicit mode: brings a remote model into the store before it loads.
        self.fetch: Callable[[str], Awaitable[object]] | None = None
        self.load_results: dict[tuple[str, str], int] = {}  # (model, success|failure) -> count
        self.rate_limiter = RateLimiter(
            settings.scheduling.rate_limit, dict(settings.scheduling.rate_limit_resources)
        )
        self._locks: dict[str, asyncio.Lock] = {}
        self._stopping = False
        self._probation: dict[str, Probation] = {}
        self._tasks: set[asyncio.Future[None]] = set()
        # (model, version) -> (folder fingerprint, why): rolled back, skipped until it changes.
        self._rolled_back: dict[tuple[str, int], tuple[str, str]] = {}

    # ---- lookup (hot path) -------------------------------------------------------------------

    def get(self, name: str, version: str = "") -> ServedVersion:
        """The version to run a request on; raises ModelNotFound / ModelNotReady."""
        record = self._models.get(name)
        if record is None:
            raise ModelNotFound(f"Request for unknown model: '{name}' is not found")
        if version:
            try:
                wanted = int(version)
            except ValueError:
                raise InvalidInput(
                    f"failed to get model version from specified version string '{version}', "
                    f"version should be an integral value > 0 (model '{name}')"
                ) from None
            if wanted < 0:
                raise InvalidInput(
                    f"invalid model version specified '{version}', version should be an "
                    f"integral value > 0 (model '{name}')"
                )
            served = record.versions.get(wanted)
            if served is None:
                if wanted in record.failed:
                    raise ModelNotReady(
                        f"model '{name}' version {wanted} is not ready: {record.failed[wanted]}"
                    )
                raise ModelNotFound(
                    f"Request for unknown model: '{name}' version {wanted} is not found"
                )
            return served
        if not record.versions:
            reason = f": {record.reason}" if record.reason else ""
            raise ModelNotReady(f"model '{name}' has no ready versions{reason}")
        return record.versions[max(record.versions)]

    def is_ready(self, name: str, version: str = "") -> bool:
        try:
            self.get(name, version)
        except ApplianceError:
            return False
        return True

    def record(self, name: str) -> ModelRecord:
        record = self._models.get(name)
        if record is None:
            raise ModelNotFound(f"Request for unknown model: '{name}' is not found")
        return record

    def ready_versions(self) -> list[ServedVersion]:
        return [v for r in self._models.values() for _, v in sorted(r.versions.items())]

    def all_ready(self) -> bool:
        return all(r.state == READY for r in self._models.values())

    def index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        """Triton's repository index: one entry per model version (per model when none load)."""
        entries: list[dict[str, Any]] = []
        pending = self.pending()
        for name in sorted(self._models.keys() | {model for model, _ in pending}):
            record = self._models.get(name) or ModelRecord(name=name, path=None)
            note = "; ".join(record.notes)
            rows: list[tuple[int | None, str, str]] = [
                (v, READY, _join(note, f"new content failed: {record.failed[v]}"))
                if v in record.failed
                else (v, READY, note)
                for v in record.versions
            ]
            rows += [
                (v, UNAVAILABLE, why)
                for v, why in record.failed.items()
                if v not in record.versions
            ]
            for (model, v), why in pending.items():
                if model != name:
                    continue
                rows = [r for r in rows if r[0] != v]
                if v in record.versions:  # an older copy of this version still serves
                    rows.append((v, READY, _join(note, f"new content not fetched: {why}")))
                else:
                    rows.append((v, UNAVAILABLE, f"not fetched: {why}"))
            if not rows:
                rows = [(None, record.state, record.reason)]
            for version, state, reason in sorted(rows, key=lambda r: r[0] or 0):
                if ready_only and state != READY:
                    continue
                entry: dict[str, Any] = {"name": name, "state": state, "reason": reason}
                if version is not None:
                    entry["version"] = str(version)
                entries.append(entry)
        return entries

    # ---- lifecycle ---------------------------------------------------------------------------

    def model_names(self) -> dict[str, Path]:
        return list_models(list(self._settings.repositories))

    async def load_all(self, names: list[str] | None = None) -> None:
        """Load every model in the repositories (or just `names`), a few at a time."""
        found = self.model_names()
        wanted = list(found) if names is None or "*" in names else names
        gate = asyncio.Semaphore(self._settings.load_concurrency)

        async def one(name: str) -> None:
            async with gate:
                with contextlib.suppress(ApplianceError):  # recorded and logged by load()
                    await self.load(name)

        # Ensembles last, so that the models they call are loaded when they check them.
        ensembles = [n for n in wanted if n in found and _is_ensemble(found[n])]
        await asyncio.gather(*(one(n) for n in wanted if n not in ensembles))
        await asyncio.gather(*(one(n) for n in ensembles))

    async def load(
        self, name: str, override: ModelConfig | None = None, source: Path | None = None
    ) -> None:
        """Load (or reload) a model; new versions serve before the old ones drain.

        `source` replaces the repository folder (a load request's file overrides).
        """
        if self._stopping:
            raise ModelNotReady("server is shutting down")
        if source is None and self.fetch is not None:
            await self.fetch(name)
        path = source or self.model_names().get(name)
        if path is None:
            raise ModelNotFound(
                f"failed to load '{name}', failed to poll from model repository: no model "
                f"folder named '{name}'"
            )
        async with self._locks.setdefault(name, asyncio.Lock()):
            record = self._models.setdefault(name, ModelRecord(name=name, path=path))
            if not record.versions:
                record.state = LOADING
            log.info("loading model '%s' from %s", name, path)
            skip = await asyncio.to_thread(self._still_rolled_back, name, path)
            try:
                prepared = await asyncio.to_thread(
                    prepare_model,
                    path,
                    self._settings.strict_model_config,
                    override,
                    self.host,
                    self._settings.manifest,
                    skip,
                    self._settings.cache_dir,
                )
            except ApplianceError as exc:
                self._count_load(name, "failure")
                if not record.versions:
                    record.state, record.reason = UNAVAILABLE, exc.message
                else:
                    record.notes = [
                        f"reload failed, the loaded versions keep serving: {exc.message}"
                    ]
                log.error("model '%s' failed to load: %s", name, exc.message)
                raise
            if prepared.ensemble is not None:
                self._check_steps(prepared)
                for step_model in prepared.ensemble.models:  # load what the ensemble calls
                    step_record = self._models.get(step_model)
                    if step_record is None or not step_record.versions:
                        await self.load(step_model)
            old = dict(record.versions)
            new = self._serve(prepared)
            # Rollback: what failed to load never replaces what serves. A version whose new
            # content failed keeps its old instance; if nothing new loaded, all old ones stay.
            kept = (
                {v: s for v, s in old.items() if v not in skip}
                if not new
                else {v: s for v, s in old.items() if v in prepared.failed and v not in skip}
            )
            prepared.failed.update(skip)
            record.versions = {**kept, **new}
            record.failed = prepared.failed
            record.notes = prepared.notes
            record.config = prepared.config if new or not old else record.config
            record.path = path
            unused = [source.parent] if source is not None and not new else []
            if new:  # the served versions come from `path` now
                if record.owned_dir is not None and record.owned_dir != (source and source.parent):
                    unused.append(record.owned_dir)
                record.owned_dir = source.parent if source is not None else None
            for version in new:
                log.info("model '%s' version %d is READY", name, version)
            self._count_load(name, "success" if new else "failure")
            for version, why in prepared.failed.items():
                if version in kept or (kept and not new):
                    log.warning(
                        "model '%s' version %d failed to load (%s); the versions already "
                        "loaded keep serving",
                        name,
                        version,
                        why,
                    )
            if record.versions:
                record.state, record.reason = READY, ""
            else:
                record.state = UNAVAILABLE
                record.reason = "; ".join(f"version {v}: {r}" for v, r in prepared.failed.items())
            await self._retire(self._watch(name, old, new, record.versions))
            for folder in unused:  # after the versions that used it have drained
                await asyncio.to_thread(shutil.rmtree, folder, True)

    # ---- automatic rollback --------------------------------------------------------------------

    def _still_rolled_back(self, name: str, path: Path) -> dict[int, str]:
        """Rolled-back versions of a model whose files have not changed since (blocking)."""
        skip: dict[int, str] = {}
        for (model, version), (print_, why) in list(self._rolled_back.items()):
            if model != name:
                continue
            if fingerprint(path / str(version)) == print_:
                skip[version] = why
            else:
                del self._rolled_back[(model, version)]  # new content: it gets a new chance
        return skip

    def _watch(
        self,
        name: str,
        old: dict[int, ServedVersion],
        new: dict[int, ServedVersion],
        now: dict[int, ServedVersion],
    ) -> list[ServedVersion]:
        """The replaced versions to retire now. With rollback on, the version now taking the
        traffic goes on probation, and the ones it replaced stay loaded until it passes."""
        replaced = [s for v, s in old.items() if now.get(v) is not s]
        replaced += [s for s in self._drop_probation(name) if now.get(s.version) is not s]
        on = self._settings.rollback_error_rate > 0
        if not (on and old and now and max(now) in new and max(now) >= max(old)):
            return replaced  # nothing replaced, or an older version came back
        # Only what the new version directly replaced is held; older holds retire now.
        held = [s for v, s in old.items() if now.get(v) is not s]
        probe = Probation(now[max(now)], held=held)
        probe.served.stats.watcher = functools.partial(self._observe, name, probe)
        self._probation[name] = probe
        return [s for s in replaced if s not in held]

    def _observe(self, name: str, probe: Probation, failed: bool) -> None:
        """One request's outcome on a version on probation (on the event loop)."""
        probe.requests += 1
        probe.failures += failed
        window, limit = self._settings.rollback_window, self._settings.rollback_error_rate
        if probe.failures > limit * window:
            self._end_probation(name, probe)
            self._roll_back(name, probe)
        elif probe.requests >= window:
            self._end_probation(name, probe)
            log.info(
                "model '%s' version %d passed its first %d requests (%d failed); unloading "
                "the version it replaced",
                name,
                probe.served.version,
                probe.requests,
                probe.failures,
            )
            self._spawn(self._retire(probe.held))

    def _end_probation(self, name: str, probe: Probation) -> None:
        probe.served.stats.watcher = None
        if self._probation.get(name) is probe:
            del self._probation[name]

    def _roll_back(self, name: str, probe: Probation) -> None:
        """Put the held versions back in place of the failing one, at once."""
        record = self._models[name]
        bad = probe.served
        why = (
            f"rolled back: {probe.failures} of its first {probe.requests} requests failed "
            f"(--model-rollback-error-rate {self._settings.rollback_error_rate:g})"
        )
        record.versions = {
            **{v: s for v, s in record.versions.items() if s is not bad},
            **{s.version: s for s in probe.held},
        }
        record.failed[bad.version] = why
        if record.path is not None:  # skipped by loads until its files change
            print_ = fingerprint(record.path / str(bad.version))
            self._rolled_back[(name, bad.version)] = (print_, why)
        self._count_load(name, "rollback")
        log.error(
            "model '%s' version %d %s; version %s serves again",
            name,
            bad.version,
            why,
            ", ".join(str(s.version) for s in probe.held) or "(none)",
        )
        self._spawn(self._retire([bad]))

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _serve(self, prepared: PreparedModel) -> dict[int, ServedVersion]:
        config = prepared.config
        inputs, outputs = tensor_rules(config.input), tensor_rules(config.output)
        labels = prepared.labels
        queue_size = self._settings.scheduling.max_queue_size
        if config.HasField("dynamic_batching"):
            configured = config.dynamic_batching.default_queue_policy.max_queue_size
            queue_size = configured if configured > 0 else queue_size
        served: dict[int, ServedVersion] = {}
        levels, default_level, policies = _queue_settings(config)
        for pv in prepared.versions:
            stats = ModelStats(
                latency=LatencyHistogram() if self._settings.latency_histograms else None
            )
            label = f"model '{config.name}' version {pv.version}"
            scheduler: Scheduler | SequenceScheduler
            if config.HasField("sequence_batching"):
                scheduler = SequenceScheduler(label, pv.workers, config, stats)
                scheduler.start()
                served[pv.version] = ServedVersion(
                    config.name, pv.version, config, inputs, outputs, labels, scheduler, stats
                )
                continue
            scheduler = Scheduler(
                label=label,
                workers=pv.workers,
                policy=_policy(config),
                stats=stats,
                max_queue_size=queue_size,
                preserve_ordering=config.dynamic_batching.preserve_ordering,
                inline_budget_ns=self._settings.scheduling.inline_budget_us * 1000,
                priority_levels=levels,
                default_priority_level=default_level,
                queue_policies=policies,
                rate_limiter=self.rate_limiter,
                max_queue_wait_ns=self._settings.scheduling.max_queue_wait_ms * 1_000_000,
            )
            scheduler.start()
            served[pv.version] = ServedVersion(
                config.name,
                pv.version,
                config,
                inputs,
                outputs,
                labels,
                scheduler,
                stats,
                ensemble=prepared.ensemble,
            )
        return served

    def _count_load(self, name: str, result: str) -> None:
        key = (name, result)
        self.load_results[key] = self.load_results.get(key, 0) + 1

    def _check_steps(self, prepared: PreparedModel) -> None:
        """An ensemble loads only when every model it calls is in a repository."""
        assert prepared.ensemble is not None
        found = self.model_names()
        for step in prepared.ensemble.steps:
            if step.model_name not in found:
                message = (
                    f"ensemble '{prepared.name}' step {step.index} calls model "
                    f"'{step.model_name}', which is not in the model repository"
                )
                record = self._models[prepared.name]
                if not record.versions:
                    record.state, record.reason = UNAVAILABLE, message
                log.error("%s", message)
                raise ConfigError(message)

    async def unload_with_dependents(self, name: str) -> None:
        """Unload an ensemble and the models it calls that no other loaded ensemble calls."""
        record = self.record(name)
        calls: set[str] = set()
        for served in record.versions.values():
            if served.ensemble is not None:
                calls |= served.ensemble.models
        await self.unload(name)
        still_used = {
            m
            for r in self._models.values()
            for v in r.versions.values()
            if v.ensemble is not None
            for m in v.ensemble.models
        }
        for model in sorted(calls - still_used):
            if model in self._models:
                await self.unload(model)

    async def unload(self, name: str) -> None:
        record = self.record(name)
        async with self._locks.setdefault(name, asyncio.Lock()):
            old = list(record.versions.values()) + self._drop_probation(name)
            record.versions, record.failed = {}, {}
            record.state, record.reason = UNAVAILABLE, "unloaded"
            await self._retire(old)
            if record.owned_dir is not None:
                await asyncio.to_thread(shutil.rmtree, record.owned_dir, True)
                record.owned_dir = None
            log.info("model '%s' unloaded", name)

    def _drop_probation(self, name: str) -> list[ServedVersion]:
        """End a model's probation; the versions it held loaded, to retire."""
        probe = self._probation.pop(name, None)
        if probe is None:
            return []
        probe.served.stats.watcher = None
        return probe.held

    async def _retire(self, versions: list[ServedVersion]) -> None:
        """Drain in-flight requests of versions no longer served, then free their instances."""
        for served in versions:
            await served.scheduler.drain(self._settings.drain_timeout_s)
            await asyncio.to_thread(served.scheduler.stop_workers)
            if not self._stopping:
                log.info("model '%s' version %d drained and unloaded", served.name, served.version)

    async def stop(self) -> None:
        self._stopping = True
        for name, record in self._models.items():
            old = list(record.versions.values()) + self._drop_probation(name)
            record.versions = {}
            await self._retire(old)
        for task in list(self._tasks):
            await task

    def require_explicit(self, mode: str) -> None:
        if mode != "explicit":
            raise Unsupported(
                f"explicit model load / unload is not allowed in model control mode '{mode}'"
            )
