"""Models on demand under a memory budget: the runtime's side of runtime/budget.py.

`Residency` (one per `ModelRuntime`) holds the budget and what each loaded version cost:

- before a load, it estimates the versions' cost (the last measurement of the same content,
  else their files' size), makes room by unloading idle models least recently used first, or
  refuses the load with the numbers (`OverBudget`); loads under a budget run one at a time, so
  that each one's cost is measured alone: the PSS of the server and its model processes after
  the load less before it (appliance/ops/memory.py);
- with --model-load-on-demand, a request for a model that is in a repository but not loaded
  starts its load and waits for it (`ensure`); concurrent first requests share one load;
- with --model-idle-unload-secs, models idle that long are unloaded.

A model with requests in flight or queued, an open sequence, a load under way, or a request
in the last GRACE_S (validated, about to be queued) is busy: never unloaded. A pinned model
(config parameter `resident: "true"`, or --model-resident) never is either, by the budget or
the timer; an operator's explicit unload still unloads it, and a model the operator unloaded
is not loaded again on demand until it is loaded explicitly.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from appliance.common.errors import ApplianceError, ModelNotReady
from appliance.common.model_config import ModelConfig, read_config
from appliance.common.settings import MemorySettings
from appliance.ops.memory import available_bytes, cgroup_limit_bytes, tree_bytes, trim_heap
from appliance.repository.local import version_number
from appliance.runtime.budget import (
    RESIDENT_PARAMETER,
    BudgetSpec,
    CostBook,
    Estimate,
    Resident,
    describe,
    folder_bytes,
    idle_models,
    make_room,
    resolve_budget,
    split_cost,
)
from appliance.runtime.history import LoadPlan
from appliance.runtime.loader import PreparedModel
from appliance.runtime.registry import ModelRecord, ModelRegistry
from appliance.runtime.version_policy import select_versions

log = logging.getLogger(__name__)

LOADING_FACTOR = 2.0  # a load's transient memory, in times its files' size (bench.memory_budget)
KEPT = "(what unloaded models kept)"
RETAINED_MIN = 4 << 20  # an unload that gives back this much less than its cost is noted
GRACE_S = 0.25  # a model asked for this recently counts as busy
BUSY_RETRY_S = 0.05  # a load that only busy models stand in the way of asks again this often
FAILED_RETRY_S = 5.0  # a model whose on-demand load failed is not tried again sooner
NOT_LOADED = "not loaded: loads on its first request (--model-load-on-demand)"


def _release_memory() -> None:
    """What an unloaded model held, given back before the next measurement (blocking)."""
    gc.collect()
    trim_heap()


class OverBudget(ModelNotReady):
    """A load the memory budget has no room for (UNAVAILABLE: it may fit later)."""


class Loads(Protocol):
    """What the residency calls back in the runtime (ModelRuntime)."""

    registry: ModelRegistry

    def model_names(self) -> dict[str, Path]: ...

    async def load(self, name: str) -> None: ...

    async def unload(self, name: str, evicted: str = "") -> None: ...

    def is_loading(self, name: str) -> bool: ...


def is_pinned(config: ModelConfig | None, name: str, flagged: Iterable[str]) -> bool:
    """Resident by --model-resident or by the config's `resident` parameter."""
    if name in flagged:
        return True
    if config is None or RESIDENT_PARAMETER not in config.parameters:
        return False
    return str(config.parameters[RESIDENT_PARAMETER].string_value).strip().lower() == "true"


@dataclass
class Ticket:
    """One admitted load: the room made for it and, once measured, its versions' costs."""

    name: str
    files: dict[int, int]  # version -> its files' size
    need: Estimate
    before: int = 0  # the process tree's bytes before the load
    costs: dict[int, int] = field(default_factory=dict)  # version -> measured bytes


class Residency:
    """The memory budget, loads on demand and the idle timer of one runtime."""

    def __init__(
        self, settings: MemorySettings, state_dir: Path | None, config_name: str = ""
    ) -> None:
        spec = BudgetSpec(settings.budget_bytes, settings.budget_percent)
        limit = cgroup_limit_bytes()
        self.budget = resolve_budget(spec, available_bytes(), limit)
        self.budget_source = (
            ""
            if not spec.enabled
            else "bytes"
            if spec.bytes
            else "memory.max"
            if limit is not None
            else "MemAvailable"
        )
        self.on_demand = settings.load_on_demand
        self.wait_s = settings.load_wait_ms / 1000
        self.idle_s = settings.idle_unload_secs
        self.flagged = frozenset(settings.resident)
        self._config_name = config_name
        self.book = CostBook(state_dir if self.budget else None)
        self._lock = asyncio.Lock()
        self._loads: dict[str, asyncio.Future[None]] = {}
        self._failed: dict[str, tuple[float, ApplianceError]] = {}
        self._reserved: dict[str, int] = {}  # measured, not yet serving
        self.operator_unloaded: set[str] = set()
        self._logged: set[str] = set()  # refusals already logged
        # Counters (services/metrics.py).
        self.loads_on_demand: dict[str, int] = {}
        self.evictions: dict[tuple[str, str], int] = {}  # (model, idle|budget) -> count
        self.refusals: dict[str, int] = {}
        self.estimates: dict[str, Estimate] = {}  # model -> its last estimate (status page)
        self._runtime: Loads | None = None
        self._idle = False  # the idle timer runs
        self._announced = False  # the budget's log line
        # The process tree before the first load under the budget, and what it held beyond
        # the models' costs at the last look (runtime state, free heap): counted as used.
        self._base: int | None = None
        self.retained = 0

    @property
    def active(self) -> bool:
        return bool(self.budget or self.on_demand or self.idle_s)

    def attach(self, runtime: Loads) -> None:
        self._runtime = runtime

    # ---- what is resident ---------------------------------------------------------------------

    def used(self) -> int:
        residents = sum(r.bytes for r in self.residents())
        return residents + sum(self._reserved.values()) + self.retained

    def residents(self) -> list[Resident]:
        runtime = self._runtime
        if runtime is None:
            return []
        records = [r for r in runtime.registry.records() if r.versions]
        now_ns = time.monotonic_ns()
        busy: set[str] = set(self._loads)
        for record in records:
            for served in record.versions.values():
                scheduler = served.scheduler
                if (
                    scheduler.in_flight
                    or scheduler.open_sequences
                    or now_ns - served.last_used_ns < GRACE_S * 1e9
                ):
                    busy.add(record.name)
                    if served.ensemble is not None:  # its steps are in use between steps too
                        busy |= served.ensemble.models
        return [
            Resident(
                record.name,
                sum(v.memory_bytes for v in record.versions.values()),
                max(v.last_used_ns for v in record.versions.values()) / 1e9,
                record.name in busy or runtime.is_loading(record.name),
                is_pinned(record.config, record.name, self.flagged),
            )
            for record in records
        ]

    def resident_names(self, found: dict[str, Path]) -> list[str]:
        """The models that load at start under --model-load-on-demand: the pinned ones
        (blocking: reads their configs)."""
        names = []
        for name, path in found.items():
            config = None
            with contextlib.suppress(ApplianceError):
                config, _ = read_config(path, self._config_name)
            if is_pinned(config, name, self.flagged):
                names.append(name)
        return names

    # ---- a load under the budget ----------------------------------------------------------------

    def _version_files(self, path: Path, plan: LoadPlan) -> dict[int, int]:
        """The versions this load will bring in and their files' size (blocking)."""
        available = sorted(v for v in plan.present if v not in plan.skip)
        if plan.pin is not None:
            chosen = [plan.pin] if plan.pin in available else []
        else:
            try:
                config, _ = read_config(path, self._config_name)
                chosen = select_versions(config.version_policy, available)
            except ApplianceError:
                chosen = available[-1:]
        folders = {version_number(entry.name): entry for entry in path.iterdir()}
        return {v: folder_bytes(folders[v]) if v in folders else 0 for v in chosen}

    @contextlib.asynccontextmanager
    async def admitted(
        self, name: str, path: Path, plan: LoadPlan, record: ModelRecord, evict: bool
    ) -> AsyncIterator[Ticket | None]:
        """Around a load's preparation: room made for it (or OverBudget raised), one load at
        a time; `measure` the ticket after it. None (and nothing done) without a budget."""
        if not self.budget:
            yield None
            return
        async with self._lock:
            if not self._announced:
                self._announced = True
                log.info(
                    "memory budget for models: %.1f MiB (%s)", self.budget / 2**20,
                    self.budget_source,
                )
            if self._base is None:
                await asyncio.to_thread(_release_memory)
                self._base = await asyncio.to_thread(tree_bytes)
            files = await asyncio.to_thread(self._version_files, path, plan)
            parts = [self.book.estimate(name, v, size) for v, size in files.items()]
            need = Estimate(sum(p.bytes for p in parts), all(p.measured for p in parts))
            self.estimates[name] = need
            # While it loads, its files are read and copied: room for them too (LOADING_FACTOR
            # times their size), so that the peak stays within the budget, not only the rest.
            loading = int(sum(files.values()) * LOADING_FACTOR)
            await self._make_room(name, need, loading, evict, record)
            ticket = Ticket(name, files, need)
            await asyncio.to_thread(trim_heap)
            ticket.before = await asyncio.to_thread(tree_bytes)
            self._reserved[name] = need.bytes
            try:
                yield ticket
            except BaseException:
                self._reserved.pop(name, None)
                raise

    async def measure(self, ticket: Ticket | None, prepared: PreparedModel) -> None:
        """A prepared load's cost: the process tree's growth, shared among its versions by
        their files' size; kept for the next estimate. Still counted (reserved) until
        `serving` hands it to the served versions."""
        if ticket is None:
            return
        await asyncio.to_thread(trim_heap)
        loaded = {pv.version: ticket.files.get(pv.version, 0) for pv in prepared.versions}
        # At least its files: the weights are in memory; less is memory freed meanwhile.
        grown = max(sum(loaded.values()), await asyncio.to_thread(tree_bytes) - ticket.before)
        ticket.costs = split_cost(grown, loaded)
        self._reserved[ticket.name] = grown
        for version, cost in ticket.costs.items():
            await asyncio.to_thread(self.book.record, ticket.name, version, loaded[version], cost)
        if loaded:
            log.info(
                "model '%s' loaded: %.1f MiB measured (%s MiB %s before); budget %.1f MiB, "
                "%.1f MiB used",
                ticket.name,
                grown / 2**20,
                f"{ticket.need.bytes / 2**20:.1f}",
                "measured" if ticket.need.measured else "estimated",
                self.budget / 2**20,
                (self.used() - self._reserved.get(ticket.name, 0) + grown) / 2**20,
            )

    def serving(self, ticket: Ticket | None, record: ModelRecord) -> None:
        """The load is over: its served versions carry their costs; nothing stays reserved."""
        if ticket is None:
            return
        self._reserved.pop(ticket.name, None)
        for version, cost in ticket.costs.items():
            served = record.versions.get(version)
            if served is not None:
                served.memory_bytes = cost

    async def _make_room(
        self, name: str, need: Estimate, loading: int, evict: bool, record: ModelRecord
    ) -> None:
        """Unload idle models (least recently used first) until `need` (and `loading` more
        while it loads) fits, waiting up to --model-load-wait-ms while only busy ones stand
        in the way; OverBudget otherwise."""
        deadline = time.monotonic() + self.wait_s
        while True:
            residents = self.residents()
            # What the process tree holds above its base (the server before its first load)
            # beyond the loaded models' costs: one-time runtime state, free heap the process
            # keeps. Unloading does not free it, so it counts as a pinned resident.
            held = await asyncio.to_thread(tree_bytes) - (self._base or 0)
            self.retained = max(0, held - sum(r.bytes for r in residents))
            if self.retained:
                residents.append(Resident(KEPT, self.retained, 0.0, pinned=True))
            room = make_room(name, need, self.budget, residents, loading=loading)
            if not room.refused and not room.evict:
                return
            if room.evict and evict:
                victim = room.evict[0]
                why = f"to make room for '{name}'"
                await self._unload(victim, why, "budget", residents)
                continue
            if room.wait and time.monotonic() < deadline:
                await asyncio.sleep(BUSY_RETRY_S)
                continue
            why = room.refused or (
                f"model '{name}' needs {need.bytes / 2**20:.1f} MiB ({need.how}) and the memory "
                f"budget of {self.budget / 2**20:.1f} MiB is held by {describe(residents)} "
                "(start-up loads unload nothing)"
            )
            self.refusals[name] = self.refusals.get(name, 0) + 1
            if why not in self._logged:
                self._logged.add(why)
                log.warning("load refused: %s", why)
            if not record.versions:
                record.on_demand = self.on_demand
            raise OverBudget(f"load refused: {why}")

    async def _unload(self, name: str, why: str, kind: str, residents: list[Resident]) -> None:
        runtime = self._runtime
        assert runtime is not None
        cost = next((r.bytes for r in residents if r.name == name), 0)
        key = (name, kind)
        self.evictions[key] = self.evictions.get(key, 0) + 1
        numbers = (
            f" ({cost / 2**20:.1f} MiB; budget {self.budget / 2**20:.1f} MiB, "
            f"{sum(r.bytes for r in residents) / 2**20:.1f} MiB used before)"
            if self.budget
            else ""
        )
        log.info("unloading model '%s' %s%s", name, why, numbers)
        before = await asyncio.to_thread(tree_bytes)
        await runtime.unload(name, evicted=why)
        await asyncio.to_thread(_release_memory)
        freed = before - await asyncio.to_thread(tree_bytes)
        if self.budget and cost - freed > max(RETAINED_MIN, cost // 10):
            self.book.scale(name, freed, cost)  # its next load: the share it gave back
            log.info(
                "model '%s' gave back %.1f MiB of its %.1f MiB (runtime state, or free heap "
                "the process keeps)",
                name, max(0, freed) / 2**20, cost / 2**20,
            )

    # ---- the idle timer -----------------------------------------------------------------------

    def start(self, spawn: Callable[[Coroutine[Any, Any, None]], None]) -> None:
        """Start the idle timer (on the loop), once, where --model-idle-unload-secs is set."""
        if self.idle_s > 0 and not self._idle:
            self._idle = True
            spawn(self._idle_loop())

    async def _idle_loop(self) -> None:
        period = max(0.1, min(5.0, self.idle_s / 4))
        while True:
            await asyncio.sleep(period)
            async with self._lock:
                residents = self.residents()
                for name in idle_models(residents, time.monotonic(), self.idle_s):
                    try:
                        await self._unload(name, f"idle for {self.idle_s:g} s", "idle", residents)
                    except ApplianceError as exc:
                        log.warning("model '%s' could not be unloaded: %s", name, exc.message)

    # ---- loads on demand ----------------------------------------------------------------------

    def loads_on_request(self, name: str) -> bool:
        """Whether a request for `name`, which its lookup refuses now, may load it first
        (`ensure`): with --model-load-on-demand, a model not unloaded by the operator with
        nothing loaded (or not known yet: it may be in a repository). Front ends refuse the
        others before reading their bodies (InferenceService.admit)."""
        runtime = self._runtime
        if not self.on_demand or runtime is None or name in self.operator_unloaded:
            return False
        try:
            record = runtime.registry.find(name)
        except ApplianceError:  # a shared name that stands for several copies
            return False
        return record is None or not record.versions

    async def ensure(self, name: str, wait_s: float | None = None) -> None:
        """A request for `name`, which is not ready: with --model-load-on-demand, a model in
        a repository with nothing loaded is loaded (one load for every request that asks
        meanwhile) and waited for, at most `wait_s` (or --model-load-wait-ms). Returns with
        nothing done otherwise: the request's lookup says why it cannot run."""
        runtime = self._runtime
        if not self.on_demand or runtime is None or name in self.operator_unloaded:
            return
        record = runtime.registry.find(name)
        if record is not None and record.versions:
            return  # loaded: the version asked for is not, and a load would not change that
        task = self._loads.get(name)
        if task is None:
            failed = self._failed.get(name)
            if failed is not None and time.monotonic() - failed[0] < FAILED_RETRY_S:
                raise failed[1]
            task = asyncio.ensure_future(self._load(runtime, name))
            self._loads[name] = task
            task.add_done_callback(lambda _: self._loads.pop(name, None))
        wait = self.wait_s if wait_s is None else min(wait_s, self.wait_s)
        try:
            await asyncio.wait_for(asyncio.shield(task), max(0.0, wait))
        except asyncio.TimeoutError:
            raise ModelNotReady(
                f"model '{name}' is loading on demand and was not ready within "
                f"{wait * 1000:.0f} ms; retry"
            ) from None

    async def _load(self, runtime: Loads, name: str) -> None:
        if name not in await asyncio.to_thread(runtime.model_names):
            return  # not in a repository: the request's lookup says so
        self.loads_on_demand[name] = self.loads_on_demand.get(name, 0) + 1
        log.info("loading model '%s' on demand (a request asked for it)", name)
        try:
            await runtime.load(name)
        except OverBudget:
            raise
        except ApplianceError as exc:
            self._failed[name] = (time.monotonic(), exc)
            raise
        self._failed.pop(name, None)
