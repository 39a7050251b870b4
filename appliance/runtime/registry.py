"""The registry: which models and versions serve, and the hot-path lookup of a request's version."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from appliance.common.errors import (
    ApplianceError,
    InvalidInput,
    ModelNotFound,
    ModelNotReady,
    UnknownModel,
)
from appliance.common.model_config import ModelConfig
from appliance.repository.local import NAMESPACE_SEPARATOR, plain_name
from appliance.runtime.loader import TensorRule
from appliance.scheduling.contract import ModelScheduler
from appliance.scheduling.ensemble import EnsemblePlan
from appliance.scheduling.stats import ModelStats
from edge_backends.api import ModelInstance

READY, UNAVAILABLE, LOADING, UNLOADING = "READY", "UNAVAILABLE", "LOADING", "UNLOADING"


class Mirror(Protocol):
    """A version on shadow probation beside a served one (runtime/shadow.py's ShadowTrial)."""

    shadow: ServedVersion

    def take(self) -> bool: ...

    def skip(self) -> None: ...

    def observe(
        self,
        served_ns: int,
        served_outputs: dict[str, Any],
        shadow_ns: int,
        shadow_outputs: dict[str, Any] | None,
        error: str = "",
    ) -> None: ...


@dataclass
class ServedVersion:
    """One ready model version: its config, tensor rules, scheduler and statistics."""

    name: str
    version: int
    config: ModelConfig
    inputs: dict[str, TensorRule]
    outputs: dict[str, TensorRule]
    labels: dict[str, list[str]]
    scheduler: ModelScheduler
    stats: ModelStats
    ensemble: EnsemblePlan | None = None
    # Its model instances (none for an ensemble), for what they report (custom metrics).
    instances: tuple[ModelInstance, ...] = ()
    # Read on every request: plain attributes, not protobuf lookups.
    max_batch_size: int = 0
    all_outputs: tuple[str, ...] = ()
    cache_enabled: bool = False
    sequence: bool = False
    decoupled: bool = False
    # A rollout's target on shadow probation beside this version (runtime/shadow.py): the
    # inference service mirrors a share of this version's successful requests to it.
    mirror: Mirror | None = None
    # The memory budget's (runtime/on_demand.py): what loading it cost (bytes, measured; 0
    # without a budget), and the monotonic ns of its last request (set as it is validated).
    memory_bytes: int = 0
    last_used_ns: int = field(default_factory=time.monotonic_ns)
    # With --model-namespacing, the registry key of a copy of a name that more than one
    # repository holds (repository/local.py's namespaced_key); "" otherwise.
    key: str = ""
    # The signatures of plain requests already validated for this version: the inference
    # service's plain lane (services/plain.py's PlainLane), set by it; none at first.
    plain: tuple[Any, ...] = ()

    @property
    def metric_name(self) -> str:
        """The `model` label of its metrics: a shared name's copies each have their own."""
        return self.key or self.name

    def __post_init__(self) -> None:
        self.max_batch_size = int(self.config.max_batch_size)
        self.all_outputs = tuple(self.outputs)
        self.cache_enabled = bool(self.config.response_cache.enable)
        self.sequence = self.config.HasField("sequence_batching")
        self.decoupled = bool(self.config.model_transaction_policy.decoupled)

    @property
    def label(self) -> str:
        return f"model '{self.name}' version {self.version}"

    @property
    def asks_readiness(self) -> bool:
        """Whether a readiness check asks an instance's model (a Python model's is_ready()),
        a round trip to call off the event loop."""
        return any(instance.asks_readiness for instance in self.instances)

    def instances_ready(self) -> bool:
        """Every instance says it can serve (Triton asks each instance's backend); blocking
        for as long as a backend's bounded check takes when `asks_readiness`."""
        return all(instance.ready() for instance in self.instances)


UNLOADED = "unloaded"  # the reason of a model a client (or the poller) unloaded


@dataclass
class ModelRecord:
    """One model as the runtime knows it: its served versions, state and why."""

    name: str
    path: Path | None
    state: str = UNAVAILABLE
    reason: str = ""
    config: ModelConfig | None = None
    versions: dict[int, ServedVersion] = field(default_factory=dict)
    failed: dict[int, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # e.g. GPU instances running on CPU
    owned_dir: Path | None = None  # a folder the server made for it (file overrides)
    # The config override of the last load that gave one, and its folder's fingerprint then: a
    # load without one keeps it while the folder is unchanged (tritonserver's model info).
    override: ModelConfig | None = None
    override_fingerprint: str = ""
    # Unloaded by the memory budget or the idle timer (or never loaded under
    # --model-load-on-demand): the next request loads it; not counted against readiness.
    on_demand: bool = False


class ModelRegistry:
    """Model records by key (the model's name; with `namespacing`, a name that more than one
    repository holds has a key per copy: repository/local.py's namespaced_key); `get` is the
    one lookup every request makes."""

    def __init__(self, namespacing: bool = False) -> None:
        self._models: dict[str, ModelRecord] = {}
        self._namespacing = namespacing
        self._copies: dict[str, list[str]] = {}  # a shared name -> its copies' keys

    def _lookup(self, name: str) -> ModelRecord | None:
        """The record of a key, or of a plain name that stands for one copy only; a name that
        stands for several is refused, as tritonserver refuses it."""
        if not self._copies or name not in self._copies:
            return self._models.get(name) or self._exact(name)
        candidates = self._candidates(name)
        if len(candidates) > 1:
            raise InvalidInput(
                f"There are {len(candidates)} identifiers of model '{name}' in global map, "
                "model namespace must be provided to resolve ambiguity."
            )
        return candidates[0] if candidates else None

    def _candidates(self, name: str) -> list[ModelRecord]:
        """The records a shared name stands for now: those loaded or loading (a copy that left
        its repository, or was unloaded, no longer counts), else every one it ever had."""
        keys = [name, *self._copies[name]] if name in self._models else self._copies[name]
        records = [self._models[key] for key in keys]
        live = [r for r in records if r.versions or r.state != UNAVAILABLE]
        return live or [r for r in records if r.name != name] or records

    def _exact(self, name: str) -> ModelRecord | None:
        """The record of `NAME\\`: the model keyed by the plain name itself, even while other
        copies of the name make the plain name ambiguous (what resolve_in answers for it)."""
        if not name.endswith(NAMESPACE_SEPARATOR):
            return None
        return self._models.get(name[: -len(NAMESPACE_SEPARATOR)])

    def _exact_key(self, record: ModelRecord) -> str:
        shared = record.name in self._copies
        return record.name + NAMESPACE_SEPARATOR if shared else record.name

    def resolve_in(self, name: str, namespace: str) -> str:
        """The key of the model an ensemble step of `namespace` (its repository) calls by
        `name`: the copy in that repository first, else the one copy there is, as tritonserver
        resolves a step; several and none of them there: refused as ambiguous."""
        if name not in self._copies:
            return name
        candidates = self._candidates(name)
        for record in candidates:
            if record.path is not None and str(record.path.parent) == namespace:
                return self._exact_key(record)
        return self._exact_key(candidates[0] if len(candidates) == 1 else self.record(name))

    def copies(self, name: str) -> list[str]:
        """The keys of the copies a plain name stands for (with --model-namespacing)."""
        return list(self._copies.get(name, ()))

    def get(self, name: str, version: str = "") -> ServedVersion:
        """The version to run a request on; raises ModelNotFound / ModelNotReady."""
        copies = self._copies  # the hot path: one dict lookup unless a name is shared
        record = self._lookup(name) if copies and name in copies else self._models.get(name)
        if record is None and copies:
            record = self._exact(name)
        if record is None:
            raise UnknownModel(f"Request for unknown model: '{name}' is not found")
        if version:
            # ASCII digits only: int() reads other scripts' digits too (u0661 is 1), which
            # tritonserver's routes do not take.
            if not (version.isascii() and version.lstrip("-").isdigit()):
                raise InvalidInput(
                    f"failed to get model version from specified version string '{version}', "
                    f"version should be an integral value > 0 (model '{name}')"
                )
            wanted = int(version)
            if wanted < 0:
                raise InvalidInput(
                    f"invalid model version specified '{version}', version should be an "
                    f"integral value > 0 (model '{name}')"
                )
            served = record.versions.get(wanted)
            if served is None:
                if wanted in record.failed:
                    # tritonserver's words (a version it knows that is not READY)
                    raise ModelNotReady(
                        f"Request for unknown model: '{name}' version {wanted} is not at ready "
                        "state"
                    )
                raise ModelNotFound(
                    f"Request for unknown model: '{name}' version {wanted} is not found"
                )
            return served
        if not record.versions:
            # tritonserver's words and code (NOT_FOUND) for a known model with no READY version;
            # then, where its load failed, why (tritonserver says it only in its log)
            why = f": {record.reason}" if record.reason not in ("", UNLOADED) else ""
            raise ModelNotFound(
                f"Request for unknown model: '{name}' has no available versions{why}"
            )
        return record.versions[max(record.versions)]

    def is_ready(self, name: str, version: str = "") -> bool:
        """Served, and every instance says it can serve (blocking: see `instances_ready`)."""
        try:
            served = self.get(name, version)
        except ApplianceError:
            return False
        return served.instances_ready()

    def record(self, name: str) -> ModelRecord:
        record = self._lookup(name)
        if record is None:
            raise UnknownModel(f"Request for unknown model: '{name}' is not found")
        return record

    def find(self, name: str) -> ModelRecord | None:
        return self._lookup(name)

    def find_key(self, key: str) -> ModelRecord | None:
        """The record of a key only (never of a shared name's copy)."""
        return self._models.get(key)

    def add(self, name: str, path: Path) -> ModelRecord:
        """The model's record, made (UNAVAILABLE, nothing served) if it has none yet."""
        record = self._models.get(name)
        if record is None:
            record = self._models[name] = ModelRecord(name=name, path=path)
            plain = plain_name(name)
            if self._namespacing and plain != name:
                self._copies.setdefault(plain, []).append(name)
        return record

    def records(self) -> list[ModelRecord]:
        return [self._models[name] for name in sorted(self._models)]

    def ready_versions(self) -> list[ServedVersion]:
        return [v for r in self._models.values() for _, v in sorted(r.versions.items())]

    def all_ready(self) -> bool:
        return all(r.state == READY or r.on_demand for r in self._models.values())
