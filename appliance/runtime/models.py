"""ModelRuntime: the lifecycle of model versions: load, warm up, swap, drain, roll back, stop.

The registry (registry.py) answers which version a request runs on; the loader (loader.py)
turns a model folder into ready instances; specs.py builds each version's scheduler from its
config; probation.py watches a switched-in version and rolls it back. Repositories (local
folders and the model store the remote sources sync into) feed it model folders.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import shutil
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any, NoReturn

from appliance.common.errors import (
    ApplianceError,
    ConfigError,
    ModelNotFound,
    ModelNotReady,
    Unsupported,
)
from appliance.common.host_policy import HostPolicy
from appliance.common.model_config import ENSEMBLE, ConfigBounds, ModelConfig, read_config
from appliance.repository.ledger import ModelLedger, record_pin
from appliance.repository.local import fingerprint, list_models, list_versions, plain_name
from appliance.repository.rollout import ProbationRule
from appliance.repository.rollout_policy import ShadowRule
from appliance.runtime.history import RECORDED, LoadPlan, Recorded, UpdateHistory
from appliance.runtime.loader import PreparedModel, prepare_model, tensor_rules
from appliance.runtime.on_demand import NOT_LOADED, OverBudget, Residency
from appliance.runtime.probation import RollbackGuard
from appliance.runtime.registry import (
    LOADING,
    READY,
    UNAVAILABLE,
    UNLOADED,
    ModelRecord,
    ModelRegistry,
    ServedVersion,
)
from appliance.runtime.settings import RuntimeSettings, release_version
from appliance.runtime.shadow import ShadowTrial, ShadowTrials, fits_beside, mem_available_bytes
from appliance.runtime.specs import build_scheduler, with_decoupled_steps
from appliance.scheduling.ensemble import (
    EnsemblePlan,
    EnsembleStep,
    StepEmit,
    StepRequest,
    StepTensor,
)
from appliance.scheduling.rate_limiter import RateLimiter
from appliance.scheduling.stats import LatencyHistogram, LatencySummaries, ModelStats
from edge_backends.api import InferenceHost

log = logging.getLogger(__name__)

SHUTTING_DOWN = "server is shutting down"


def _join(*parts: str) -> str:
    return "; ".join(part for part in parts if part)


def _left(gone: list[ServedVersion]) -> list[str]:
    return [f"version {s.version} left the repository" for s in gone]


async def _no_step_runner(
    step: EnsembleStep,
    inputs: dict[str, StepTensor],
    request: StepRequest,
    each: StepEmit | None = None,
) -> dict[str, StepTensor]:
    raise Unsupported(f"ensemble step {step.index} has no inference service to run on")


def _is_ensemble(model_dir: Path, config_name: str) -> bool:
    try:
        config, _ = read_config(model_dir, config_name)
    except ApplianceError:
        return False
    return bool(config.platform == ENSEMBLE)


class ModelRuntime:
    """Loads models from the repositories and hands out ready versions."""

    def __init__(self, settings: RuntimeSettings, ledger: ModelLedger | None = None) -> None:
        self._settings = settings
        self.registry = ModelRegistry(settings.namespacing)
        # The hot-path lookups, bound once.
        self.get = self.registry.get
        self.is_ready = self.registry.is_ready
        self.record = self.registry.record
        self.ready_versions = self.registry.ready_versions
        self.all_ready = self.registry.all_ready
        self.host: InferenceHost | None = None  # blocking inference entry for backends (BLS)
        self.run_step = _no_step_runner  # ensemble steps: set by the inference service
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
        self._tasks: set[asyncio.Future[None]] = set()
        # Fleet rollouts (repository/fleet_agent.py, wired by the composition root): the
        # rollout's probation thresholds for a version, and who hears probation's verdicts.
        self.probation_rule: Callable[[str, int], ProbationRule | None] = lambda n, v: None
        self.on_verdict: Callable[[str, int, str], None] = lambda n, v, why: None
        # The rollout's shadow rule for a version its choice switches to (None: none), and
        # the trials of targets on shadow probation (shadow.py).
        self.shadow_rule: Callable[[str, int], ShadowRule | None] = lambda n, v: None
        self.shadows = ShadowTrials(self._shadow_done)
        # Models loaded only because an ensemble calls them (never by a load of their own):
        # the ones an unload with unload_dependents takes along, as tritonserver's
        # dependency graph does (a node not `explicitly_load_`).
        self._implicit: set[str] = set()
        self._guard = RollbackGuard(
            self.registry,
            settings.rollback_error_rate,
            settings.rollback_window,
            lambda versions: self._spawn(self._retire(versions)),
            self._count_load,
            self._verdict,
            self._probation_thresholds,
            settings.rollback_latency_ratio,
        )
        # What failed, the last good versions and pins, kept across restarts (memory only
        # without a state directory: check, tune).
        self.history = UpdateHistory(ledger or ModelLedger(None), self._spawn)
        # The memory budget, loads on demand, the idle timer (runtime/on_demand.py).
        self.residency = Residency(settings.memory, settings.state_dir, settings.config_name)
        self.residency.attach(self)

    # ---- lifecycle ---------------------------------------------------------------------------

    def model_names(self) -> dict[str, Path]:
        return list_models(list(self._settings.repositories), self._settings.namespacing)

    def step_model(self, step: EnsembleStep) -> str:
        """The key of the model an ensemble step calls (with --model-namespacing: its own
        repository's copy of a shared name first)."""
        if not step.namespace:
            return step.model_name
        return self.registry.resolve_in(step.model_name, step.namespace)

    @property
    def namespacing(self) -> bool:
        return self._settings.namespacing

    def copies_on_disk(self, name: str) -> list[str]:
        """The keys of the copies of a name that more than one repository holds (with
        --model-namespacing; [] otherwise)."""
        if not self._settings.namespacing:
            return []
        return sorted(key for key in self.model_names() if key != name and plain_name(key) == name)

    async def load_all(self, names: list[str] | None = None) -> None:
        """Load every model in the repositories (or just `names`), a few at a time."""
        found = self.model_names()
        wanted = list(found) if names is None or "*" in names else names
        if self.residency.on_demand:  # the others load on their first request
            if names is None:
                wanted = await asyncio.to_thread(self.residency.resident_names, found)
            for name in sorted(set(found) - set(wanted)):
                record = self.registry.add(name, found[name])
                if not record.versions:
                    record.state, record.reason, record.on_demand = UNAVAILABLE, NOT_LOADED, True
        gate = asyncio.Semaphore(self._settings.load_concurrency)

        async def one(name: str) -> None:
            async with gate:
                try:
                    await self.load(name, evict=False)  # start-up unloads nothing
                except ApplianceError:  # recorded and logged by load()
                    pass
                except Exception as exc:  # a bug in one model's load stops no other model
                    log.error("model '%s' failed to load: internal error", name, exc_info=exc)
                    self._mark_failed(name, f"internal error ({type(exc).__name__}); see the log")

        # Ensembles last, so that the models they call are loaded when they check them.
        config_name = self._settings.config_name
        ensembles = [n for n in wanted if n in found and _is_ensemble(found[n], config_name)]
        await asyncio.gather(*(one(n) for n in wanted if n not in ensembles))
        await asyncio.gather(*(one(n) for n in ensembles))

    async def load(
        self,
        name: str,
        override: ModelConfig | None = None,
        source: Path | None = None,
        pin: int | Recorded | None = RECORDED,
        retry_failed: bool = False,
        evict: bool = True,
        explicit: bool = True,
    ) -> None:
        """Load (or reload) a model; new versions serve before the old ones drain.

        `source` replaces the repository folder (a load request's file overrides). Versions
        whose content failed before (the ledger) are skipped (unless `retry_failed`: a
        client's load request tries those that failed to load again, as Triton does), the
        recorded pin (or `pin`) is applied, and a version no longer in the repository leaves
        service whatever happens to the others. Under a memory budget the load first has room
        made for it (`evict`: by unloading idle models), or is refused (OverBudget); what
        serves keeps serving. `explicit` false: loaded because an ensemble calls it (see
        `unload_with_dependents`).
        """
        if explicit:
            self._implicit.discard(name)
        else:
            self._implicit.add(name)
        try:
            await self._load(name, override, source, pin, evict, retry_failed)
        except OverBudget:
            record = self.registry.find(name)
            swap = self._settings.memory.swap_unavailable and source is None and override is None
            if not (swap and record is not None and record.versions):
                raise
            log.warning(
                "model '%s': its update does not fit in the memory budget beside the loaded "
                "versions; unloading them first (--model-memory-swap-unavailable)",
                name,
            )
            await self.unload(name, evicted="to load its update within the memory budget")
            await self._load(name, override, source, pin, evict, retry_failed)

    async def _load(
        self,
        name: str,
        override: ModelConfig | None,
        source: Path | None,
        pin: int | Recorded | None,
        evict: bool,
        retry_failed: bool = False,
    ) -> None:
        if self._stopping:
            raise ModelNotReady(SHUTTING_DOWN)
        if source is None and self.fetch is not None:
            await self.fetch(name)
        path = source or self.model_names().get(name)
        if path is None:
            raise ModelNotFound(
                f"failed to load '{name}', failed to poll from model repository: no model "
                f"folder named '{name}'"
            )
        async with self._locks.setdefault(name, asyncio.Lock()):
            record = self.registry.add(name, path)
            override, folder = await self._kept_override(record, override, source, path)
            if not record.versions:
                record.state = LOADING
            log.info("loading model '%s' from %s", name, path)
            plan, by_rollout = await asyncio.to_thread(
                self._plan, path, source is None, pin, frozenset(record.versions), retry_failed
            )
            shadow = None
            if by_rollout and plan.pin is not None and plan.pin not in record.versions:
                shadow = await self._shadow_for(name, path, plan.pin, bool(record.versions))
            residency = self.residency
            residency.start(self._spawn)
            ticket = None
            try:
                async with residency.admitted(name, path, plan, record, evict) as ticket:
                    prepared = await self._prepare_versions(
                        name, path, record, plan, override, source
                    )
                    await residency.measure(ticket, prepared)
                if prepared.ensemble is not None:
                    await self._prepare_ensemble(prepared, name, path)
                if source is None:  # failures on disk before anyone can see them (the index)
                    await self.history.remember(name, path, prepared, plan)
                await self._switch(
                    name, path, record, prepared, plan, by_rollout, source, shadow
                )
            except OverBudget as exc:
                self._count_load(name, "failure")
                if record.versions:  # an update that does not fit beside what serves
                    record.notes = [f"the loaded versions keep serving: {exc.message}"]
                else:
                    record.state, record.reason = UNAVAILABLE, exc.message
                raise
            finally:
                residency.serving(ticket, record)
            record.on_demand = False
            residency.operator_unloaded.discard(name)
            if source is None:
                record.override, record.override_fingerprint = override, folder

    async def _kept_override(
        self, record: ModelRecord, override: ModelConfig | None, source: Path | None, path: Path
    ) -> tuple[ModelConfig | None, str]:
        """The override a load uses, and the folder's fingerprint to keep with it: a load
        without one reuses the previous load's while the model folder is unchanged (as
        tritonserver, which reads the folder again only once it is modified)."""
        if source is not None or (override is None and record.override is None):
            return override, ""
        folder = await asyncio.to_thread(fingerprint, path)
        if override is None and folder == record.override_fingerprint:
            return record.override, folder
        return override, folder

    async def _prepare_versions(
        self,
        name: str,
        path: Path,
        record: ModelRecord,
        plan: LoadPlan,
        override: ModelConfig | None,
        source: Path | None,
    ) -> PreparedModel:
        """The load's first step: the chosen versions read, checked, placed, instantiated and
        warmed up (on a thread). A failure that leaves nothing to load is recorded and raised;
        the versions already loaded keep serving."""
        marker = self.history.loading(name, path) if source is None else None
        try:
            return await asyncio.to_thread(
                self._prepare,
                marker,
                self._settings.load_retries,
                self._settings.host_policies,
                path,
                self._settings.strict_model_config,
                override,
                self.host,
                self._settings.manifest,
                plan.skip,
                self._settings.cache_dir,
                plan.pin,
                ConfigBounds.from_settings(self._settings.scheduling),
                self._settings.config_name,
                self._settings.default_max_batch_sizes,
            )
        except ApplianceError as exc:
            self._count_load(name, "failure")
            gone = self._leave(record, plan.present)
            if not record.versions:
                record.state, record.reason = UNAVAILABLE, _join(exc.message, *_left(gone))
            else:
                record.notes = [f"reload failed, the loaded versions keep serving: {exc.message}"]
            log.error("model '%s' failed to load: %s", name, exc.message)
            await self._retire(gone)
            raise

    async def _prepare_ensemble(self, prepared: PreparedModel, key: str, path: Path) -> None:
        """An ensemble's steps checked and loaded first; a decoupled step makes it stream.
        With --model-namespacing a step calls the copy in the ensemble's own repository of a
        model that more than one repository holds, as tritonserver resolves it."""
        assert prepared.ensemble is not None
        calls = set(prepared.ensemble.models)
        if self._settings.namespacing:
            prepared.ensemble, calls = self._own_steps(prepared.ensemble, path.parent)
        self._check_steps(prepared, key)
        for step_model in sorted(calls):  # load what the ensemble calls
            step_record = self.registry.find_key(step_model)
            if step_record is None or not step_record.versions:
                await self.load(step_model, explicit=False)
        try:
            prepared.ensemble = with_decoupled_steps(
                prepared.ensemble, prepared.config, self._step_is_decoupled
            )
        except ConfigError as exc:
            self._refuse_ensemble(key, exc.message)

    def _own_steps(self, plan: EnsemblePlan, repository: Path) -> tuple[EnsemblePlan, set[str]]:
        """The plan with each step resolving its model in `repository` first (at each request:
        a copy may come or go), and the keys of the models it calls now."""
        found = self.model_names()
        calls = set()
        for step in plan.steps:
            copies = [k for k in found if k != step.model_name and plain_name(k) == step.model_name]
            own = [k for k in copies if found[k].parent == repository]
            calls.add(own[0] if own else copies[0] if len(copies) == 1 else step.model_name)
        steps = tuple(dataclasses.replace(s, namespace=str(repository)) for s in plan.steps)
        return dataclasses.replace(plan, steps=steps), calls

    async def _switch(
        self,
        name: str,
        path: Path,
        record: ModelRecord,
        prepared: PreparedModel,
        plan: LoadPlan,
        by_rollout: bool,
        source: Path | None,
        shadow: ShadowRule | None = None,
    ) -> None:
        """The load's last step: the prepared versions serve, what they replace (or what left
        the repository) drains, and the record says what serves and why. With `shadow`, a
        rollout's target goes on shadow probation beside what serves instead (shadow.py)."""
        skip = plan.skip
        gone = self._leave(record, plan.present)
        old = dict(record.versions)
        new = self._serve(prepared)
        if self._settings.namespacing and plain_name(name) != name:
            for served in new.values():
                served.key = name
        if shadow is not None and self._shadowed(name, record, old, new, shadow):
            self._count_load(name, "success")
            await self._retire(gone)
            return
        for version, served in new.items():  # a reload: the nv_* counters go on
            replaced = old.get(version)
            if replaced is not None:
                served.stats.carry(replaced.stats)
        superseded = self.shadows.drop(name)  # another switch of the model ends its trial
        if superseded is not None:
            label = superseded.shadow.label
            log.info("%s: shadow probation ended without a verdict (reloaded)", label)
            gone.append(superseded.shadow)
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
        record.notes = prepared.notes + (
            [f"version {plan.pin}: chosen by the model's fleet rollout (rollout.json)"]
            if by_rollout
            else [f"pinned to version {plan.pin} (unpin to follow the version policy)"]
            if plan.pin is not None
            else []
        )
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
            record.reason = _join(
                *(f"version {v}: {r}" for v, r in prepared.failed.items()), *_left(gone)
            )
        retire = self._guard.watch(name, old, new, record.versions) + gone
        newest = max(new, default=None)
        if source is None and newest is not None and self._guard.on_probation(name) != newest:
            await self.history.remember_good(name, path, newest)  # not on probation
        await self._retire(retire)
        for version, served in new.items():  # the versions they replaced are gone
            replaced = old.get(version)
            if replaced is not None and any(gone is replaced for gone in retire):
                served.stats.fold()
        for folder in unused:  # after the versions that used it have drained
            await asyncio.to_thread(shutil.rmtree, folder, True)

    @staticmethod
    def _prepare(
        marker: Callable[[int | None], None] | None,
        retries: int,
        policies: Mapping[str, HostPolicy],
        *args: Any,
    ) -> PreparedModel:
        """prepare_model with the ledger's "loading version N" marker set around each
        version's load and cleared when it ends, however it ends (blocking); `retries`:
        --model-load-retry-count; `policies`: --host-policy's."""
        try:
            return functools.partial(
                prepare_model, loading=marker, load_retries=retries, host_policies=policies
            )(*args)
        finally:
            if marker is not None:
                marker(None)

    def _plan(
        self,
        path: Path,
        from_repository: bool,
        pin: int | Recorded | None,
        serving: frozenset[int],
        retry_failed: bool = False,
    ) -> tuple[LoadPlan, bool]:
        """The ledger's plan, and whether a fleet rollout chose its version (blocking): with
        no pin, a rollout's choice (the ledger holds it) is served alone; while the chosen
        version is not in the store (or failed here), what serves keeps serving."""
        plan = self.history.plan(path, from_repository, pin, retry_failed)
        if not from_repository or plan.pin is not None:
            return plan, False
        chosen = self.history.ledger.entry(path).rollout
        if chosen is None:
            return plan, False
        if chosen not in plan.present or chosen in plan.skip:
            kept = sorted(v for v in serving if v in plan.present and v not in plan.skip)
            if not kept:
                return plan, False
            chosen = kept[-1]
        return dataclasses.replace(plan, pin=chosen), True

    async def _shadow_for(
        self, name: str, path: Path, version: int, serving: bool
    ) -> ShadowRule | None:
        """The rollout's shadow rule for the version a load switches to, when it can run
        beside what serves; else None (today's probation, logged and reported)."""
        rule = self.shadow_rule(name, version)
        if rule is None:
            return None
        why = "" if serving else "nothing serves yet to mirror requests from"
        if not why:
            why = await asyncio.to_thread(fits_beside, path / str(version), mem_available_bytes())
        if why:
            log.warning(
                "model '%s' version %d: shadow probation skipped (%s); today's probation instead",
                name,
                version,
                why,
            )
            self.shadows.fell_back(name, version, why)
            return None
        return rule

    def _shadowed(
        self,
        name: str,
        record: ModelRecord,
        old: dict[int, ServedVersion],
        new: dict[int, ServedVersion],
        rule: ShadowRule,
    ) -> bool:
        """Start the new version's shadow trial beside `old` (which keeps serving); False
        when it cannot be one (then the switch goes on as today's)."""
        if len(new) != 1 or not old or set(new) & set(old):
            return False
        (served,) = new.values()
        if served.ensemble is not None or served.sequence or served.decoupled:
            why = "an ensemble, sequence or decoupled model is not mirrored"
            log.warning("%s: shadow probation skipped (%s); today's probation", served.label, why)
            self.shadows.fell_back(name, served.version, why)
            return False
        dropped = self.shadows.drop(name)
        if dropped is not None:
            self._spawn(self._retire([dropped.shadow]))
        self.shadows.start(name, served, list(old.values()), rule)
        record.notes = [
            f"version {served.version}: on shadow probation (requests mirrored to it; "
            f"clients on version {', '.join(map(str, sorted(old)))})"
        ]
        return True

    def _shadow_done(self, trial: ShadowTrial, why: str) -> None:
        """A shadow trial's end (on the loop): a failure retires the target, which clients
        never saw; a pass switches them to it."""
        name, bad = trial.name, trial.shadow
        if why:
            record = self.registry.record(name)
            record.failed[bad.version] = why
            record.notes = [f"version {bad.version}: {why}"]
            log.error("%s %s; clients stayed on the served version", bad.label, why)
            self._verdict(name, bad.version, why)
            self._spawn(self._retire([bad]))
            return
        log.info("%s passed its shadow probation: %s", bad.label, trial.numbers())
        self._spawn(self._promote(name, trial))

    async def _promote(self, name: str, trial: ShadowTrial) -> None:
        """Clients move to a target that passed its shadow probation; today's probation then
        watches it as after any switch."""
        async with self._locks.setdefault(name, asyncio.Lock()):
            record = self.registry.record(name)
            served = trial.shadow
            old = dict(record.versions)
            new = {served.version: served}
            record.versions = dict(new)
            record.notes = [f"version {served.version}: chosen by the model's fleet rollout"]
            retire = self._guard.watch(name, old, new, record.versions)
            log.info(
                "model '%s' version %d is READY (after its shadow probation)", name, served.version
            )
            if self._guard.on_probation(name) != served.version:
                self._verdict(name, served.version, "")
            await self._retire(retire)

    def shadow_numbers(self, name: str, version: int) -> dict[str, object] | None:
        """A version's shadow probation, for the fleet report (None: it had none)."""
        return self.shadows.numbers(name, version)

    def _probation_thresholds(self, name: str, version: int) -> ProbationRule | None:
        return self.probation_rule(name, version)  # set after the guard is built

    def on_probation(self, name: str) -> int | None:
        """The version of a model on probation now (shadow probation included), if any."""
        trial = self.shadows.trials.get(name)
        return trial.shadow.version if trial is not None else self._guard.on_probation(name)

    def _verdict(self, name: str, version: int, why: str) -> None:
        """Probation's verdict on a version ('' : it passed), kept in the ledger."""
        record = self.registry.find(name)
        if record is not None and record.path is not None and record.owned_dir is None:
            self.history.verdict(name, record.path, version, why)
        self.on_verdict(name, version, why)

    @staticmethod
    def _leave(record: ModelRecord, present: frozenset[int]) -> list[ServedVersion]:
        """Take the served versions that left the repository out of `record` (whatever
        happens to the other versions); they are to retire."""
        gone = [s for v, s in sorted(record.versions.items()) if v not in present]
        for served in gone:
            log.info("%s left the repository; taking it out of service", served.label)
            del record.versions[served.version]
        return gone

    async def pin(self, name: str, version: int | None) -> None:
        """Serve `version` of a model alone from now on, across reloads and restarts, whatever
        its version policy (None: unpin, and follow the policy again). The pin is kept only
        when the version then serves; otherwise what served before keeps serving."""
        if self._stopping:
            raise ModelNotReady(SHUTTING_DOWN)
        if self.fetch is not None:
            await self.fetch(name)
        path = self.model_names().get(name)
        if path is None:
            raise ModelNotFound(f"cannot pin '{name}': no model folder named '{name}'")
        present = await asyncio.to_thread(list_versions, path)
        if version is not None and version not in present:
            raise ModelNotFound(
                f"cannot pin model '{name}' to version {version}: no version {version} in "
                f"'{path}' (found {present or 'none'})"
            )
        await self.load(name, pin=version)  # recorded only once it serves
        record = self.registry.record(name)
        if version is not None and version not in record.versions:
            why = record.failed.get(version, record.reason)
            with contextlib.suppress(ApplianceError):  # back to what the ledger says
                await self.load(name)
            raise ConfigError(
                f"cannot pin model '{name}' to version {version}: it did not load: {why}"
            )
        ledger = self.history.ledger
        ledger.change(path, record_pin(version))
        await asyncio.to_thread(ledger.save, path)
        log.info(
            "model '%s' %s",
            name,
            f"pinned to version {version}" if version is not None else "unpinned",
        )

    def _mark_failed(self, name: str, reason: str) -> None:
        """A model whose load ended in an unexpected error: UNAVAILABLE with `reason` unless
        versions of it serve."""
        record = self.registry.find(name)
        if record is not None and not record.versions:
            record.state, record.reason = UNAVAILABLE, reason

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _serve(self, prepared: PreparedModel) -> dict[int, ServedVersion]:
        config = prepared.config
        inputs, outputs = tensor_rules(config.input), tensor_rules(config.output)
        served: dict[int, ServedVersion] = {}
        for pv in prepared.versions:
            quantiles = self._settings.summary_quantiles
            stats = ModelStats(
                latency=LatencyHistogram() if self._settings.latency_histograms else None,
                summaries=LatencySummaries(quantiles) if quantiles else None,
            )
            scheduler = build_scheduler(
                config,
                f"model '{config.name}' version {pv.version}",
                pv.workers,
                stats,
                self._settings.scheduling,
                self.rate_limiter,
                prepared.ensemble,
                self.run_step,
            )
            scheduler.start()
            served[pv.version] = ServedVersion(
                config.name,
                pv.version,
                config,
                inputs,
                outputs,
                prepared.labels,
                scheduler,
                stats,
                ensemble=prepared.ensemble,
                instances=tuple(worker.instance for worker in pv.workers),
            )
        return served

    def _count_load(self, name: str, result: str) -> None:
        key = (name, result)
        self.load_results[key] = self.load_results.get(key, 0) + 1

    def _step_is_decoupled(self, step: EnsembleStep) -> bool:
        try:
            return self.registry.get(self.step_model(step), step.model_version).decoupled
        except ApplianceError:  # not ready: the step's requests will say so
            return False

    def _check_steps(self, prepared: PreparedModel, key: str) -> None:
        """An ensemble loads only when every model it calls is in a repository (with
        --model-namespacing: in its own, or in just one other)."""
        assert prepared.ensemble is not None
        found = self.model_names()
        repository = Path(prepared.ensemble.steps[0].namespace) if prepared.ensemble.steps else None
        for step in prepared.ensemble.steps:
            if step.model_name not in found:
                copies = [k for k in found if plain_name(k) == step.model_name]
                if any(found[k].parent == repository for k in copies):
                    continue  # the copy in the ensemble's own repository
                where = (
                    f"which {len(copies)} other repositories hold (ambiguous)"
                    if copies
                    else "which is not in the model repository"
                )
                self._refuse_ensemble(
                    key,
                    f"ensemble '{prepared.name}' step {step.index} calls model "
                    f"'{step.model_name}', {where}",
                )

    def _refuse_ensemble(self, key: str, message: str) -> NoReturn:
        record = self.registry.record(key)
        if not record.versions:
            record.state, record.reason = UNAVAILABLE, message
        log.error("%s", message)
        raise ConfigError(message)

    async def unload_with_dependents(self, name: str) -> None:
        """Unload an ensemble and the models it calls that were loaded only for an ensemble
        (not by a load of their own) and that no other loaded ensemble calls; an ensemble so
        unloaded takes its own along (tritonserver's cascading removal)."""
        record = self.record(name)
        calls: set[str] = set()
        for served in record.versions.values():
            if served.ensemble is not None:
                calls |= served.ensemble.models
        await self.unload(name)
        still_used = {
            m
            for r in self.registry.records()
            for v in r.versions.values()
            if v.ensemble is not None
            for m in v.ensemble.models
        }
        for model in sorted(calls - still_used):
            if model in self._implicit and self.registry.find(model) is not None:
                self._implicit.discard(model)
                await self.unload_with_dependents(model)

    async def unload_callers(self, name: str) -> None:
        """After an operator's unload of `name`: each loaded ensemble that calls it is
        unloaded too (and the ensembles that call those), as tritonserver's dependency graph
        does: an ensemble whose step has no loaded version is not served. Its reason is
        tritonserver's; loading it again loads the step."""
        step = plain_name(name)
        for record in self.registry.records():
            if record.name == name:
                continue
            versions = record.versions.values()
            if any(v.ensemble is not None and step in v.ensemble.models for v in versions):
                await self.unload(record.name)
                record.reason = (
                    f"ensemble '{record.name}' depends on '{step}' which has no loaded version."
                )
                await self.unload_callers(record.name)

    def is_loading(self, name: str) -> bool:
        lock = self._locks.get(name)
        return lock is not None and lock.locked()

    async def unload(self, name: str, evicted: str = "") -> None:
        """Unload a model: the operator's (or the poller's) unload, or with `evicted` (why)
        the memory budget's or the idle timer's, after which a request loads it again under
        --model-load-on-demand."""
        record = self.record(name)
        async with self._locks.setdefault(name, asyncio.Lock()):
            old = list(record.versions.values()) + self._guard.drop(name)
            record.versions, record.failed = {}, {}
            record.state, record.reason = UNAVAILABLE, UNLOADED
            if evicted:
                record.on_demand = self.residency.on_demand
                record.reason = f"unloaded {evicted}" + (
                    "; loads again on its next request" if record.on_demand else ""
                )
            else:
                record.on_demand = False
                record.override = None  # tritonserver forgets it with the unload
                self.residency.operator_unloaded.add(name)
            await self._retire(old)
            if record.owned_dir is not None:
                await asyncio.to_thread(shutil.rmtree, record.owned_dir, True)
                record.owned_dir = None
            log.info("model '%s' unloaded", name)

    async def _retire(self, versions: list[ServedVersion]) -> None:
        """Drain in-flight requests of versions no longer served, then free their instances;
        every version at once, so N versions take one drain timeout, not N."""
        timeout_s = self._settings.drain_timeout_s
        await asyncio.gather(*(release_version(s, timeout_s, "was unloaded") for s in versions))
        if not self._stopping:
            for served in versions:
                log.info("%s drained and unloaded", served.label)

    async def stop(self, timeout_s: float) -> list[str]:
        """Stop every version at once: in-flight requests get timeout_s, the rest fail with
        "server is shutting down". One line per version that had work cancelled."""
        self._stopping = True
        trials = [self.shadows.drop(name) for name in list(self.shadows.trials)]
        # A load cut short by the shutdown is not the version's fault.
        await asyncio.to_thread(self.history.end_loads)
        versions = [trial.shadow for trial in trials if trial is not None]
        for record in self.registry.records():
            versions += list(record.versions.values()) + self._guard.drop(record.name)
            record.versions = {}
        lines = await asyncio.gather(
            *(release_version(s, timeout_s, SHUTTING_DOWN) for s in versions)
        )
        for task in list(self._tasks):  # retirements already under way (replaced versions)
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        return [line for line in lines if line]

    def require_explicit(self, mode: str) -> None:
        if mode != "explicit":
            # tritonserver's words and code (UNAVAILABLE) in modes none and poll alike
            raise ModelNotReady(
                "explicit model load / unload is not allowed if polling is enabled"
            )
