"""The memory budget's accounting and decisions (pure): how large the budget is, what a model
is expected to cost before it loads, and which idle models make room for it (least recently
used first), or why nothing can.

The runtime's side (measuring a load, unloading, the idle timer, loads on demand) is
runtime/on_demand.py; docs/memory.md explains the flags.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

MiB = 1 << 20
# The config parameter that keeps a model loaded whatever the budget and the idle timer.
RESIDENT_PARAMETER = "resident"
COSTS_FILE = "memory-costs.json"  # in the state directory: the last measured cost per version
_MAX_COSTS = 4096  # entries kept in it
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class BudgetSpec:
    """--model-memory-budget as given: bytes, or a percentage of what the machine offers."""

    bytes: int = 0
    percent: float = 0.0

    @property
    def enabled(self) -> bool:
        return bool(self.bytes or self.percent)


def parse_budget(text: str) -> BudgetSpec:
    """'2G', '512M', '1500000000', '2GiB' or '40%'; ValueError with the reason otherwise."""
    value = text.strip()
    if value.endswith("%"):
        try:
            percent = float(value[:-1])
        except ValueError:
            raise ValueError(f"'{text}' is not a percentage (e.g. 40%)") from None
        if not 0 < percent <= 100:
            raise ValueError(f"a percentage must be above 0 and at most 100, got '{text}'")
        return BudgetSpec(percent=percent)
    match = _SIZE.match(value)
    if match is None:
        raise ValueError(f"'{text}' is not a size (BYTES, or with K, M, G: e.g. 2G) or N%")
    size = int(float(match.group(1)) * _UNITS[match.group(2).upper()])
    if size <= 0:
        raise ValueError(f"the budget must be above 0, got '{text}'")
    return BudgetSpec(bytes=size)


def resolve_budget(spec: BudgetSpec, available: int | None, cgroup_max: int | None) -> int:
    """The budget in bytes: as given, or the percentage of the cgroup's memory.max where one
    is set, else of MemAvailable at start. 0 when off (or a percentage of nothing known)."""
    if spec.bytes:
        return spec.bytes
    if not spec.percent:
        return 0
    base = cgroup_max if cgroup_max is not None else available
    return int(base * spec.percent / 100) if base else 0


def folder_bytes(folder: Path) -> int:
    """The size of every file under a version folder (blocking): the first estimate of what
    loading it costs."""
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name)).st_size
            except OSError:
                continue
    return total


@dataclass(frozen=True)
class Estimate:
    """What loading a version is expected to cost, and where the number comes from."""

    bytes: int
    measured: bool  # the last load of the same content measured it; else the files' size

    @property
    def how(self) -> str:
        return "measured" if self.measured else "estimated from its files"


class CostBook:
    """The last measured cost of each version (model/version, with its files' total size to
    tell new content), kept in the state directory so that a restart or a reload after an
    eviction estimates from it. In memory only without a state directory."""

    def __init__(self, state_dir: Path | None) -> None:
        self._path = None if state_dir is None else state_dir / COSTS_FILE
        self._costs: dict[str, dict[str, int]] = {}
        if self._path is not None:
            try:
                data = json.loads(self._path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                data = {}
            if isinstance(data, dict):
                self._costs = {
                    str(k): {"bytes": int(v["bytes"]), "files": int(v["files"])}
                    for k, v in data.items()
                    if isinstance(v, dict)
                    and isinstance(v.get("bytes"), int)
                    and isinstance(v.get("files"), int)
                }

    def estimate(self, name: str, version: int, files: int) -> Estimate:
        known = self._costs.get(f"{name}/{version}")
        if known is not None and known["files"] == files:
            return Estimate(known["bytes"], True)
        return Estimate(files, False)

    def scale(self, name: str, freed: int, cost: int) -> None:
        """An unload gave back only `freed` of the model's measured `cost` (the rest was
        one-time runtime state the first load carried): its next loads are estimated at that
        share, never below their files. In memory; written with the next `record`."""
        if cost <= 0:
            return
        for key, known in self._costs.items():
            if key.rpartition("/")[0] == name:
                known["bytes"] = max(known["files"], known["bytes"] * max(0, freed) // cost)

    def record(self, name: str, version: int, files: int, cost: int) -> None:
        """Remember a measurement and write the file (blocking; a failed write is logged)."""
        self._costs[f"{name}/{version}"] = {"bytes": cost, "files": files}
        while len(self._costs) > _MAX_COSTS:
            del self._costs[next(iter(self._costs))]
        if self._path is None:
            return
        try:
            staged = self._path.with_suffix(".tmp")
            staged.write_text(json.dumps(self._costs, sort_keys=True), encoding="utf-8")
            os.replace(staged, self._path)
        except OSError as exc:
            log.warning("could not keep the measured model costs in %s: %s", self._path, exc)


@dataclass(frozen=True)
class Resident:
    """A loaded model as the budget sees it."""

    name: str
    bytes: int  # the measured cost of its loaded versions
    last_used: float  # monotonic seconds of its last request (or its load)
    busy: bool = False  # requests in flight or queued, a sequence open, or a load under way
    pinned: bool = False  # resident by its config or --model-resident


@dataclass(frozen=True)
class Room:
    """The budget's answer to a load: unload `evict` (least recently used first) and go on,
    or, with `refused`, do not load; `wait`: only busy models stand in the way, so asking
    again once they are idle may succeed."""

    evict: tuple[str, ...] = ()
    refused: str = ""
    wait: bool = False


def _mib(size: int) -> str:
    return f"{size / MiB:.1f} MiB"


def describe(residents: Iterable[Resident]) -> str:
    """What is resident, for a refusal: 'a 12.0 MiB (pinned), b 30.0 MiB (in use)'."""
    parts = []
    for r in sorted(residents, key=lambda r: -r.bytes):
        why = " (pinned)" if r.pinned else " (in use)" if r.busy else ""
        parts.append(f"'{r.name}' {_mib(r.bytes)}{why}")
    return ", ".join(parts) or "nothing"


def make_room(
    name: str,
    need: Estimate,
    budget: int,
    residents: Iterable[Resident],
    keep: Iterable[str] = (),
    loading: int = 0,
) -> Room:
    """Room for `name` (`need` more bytes once loaded, and `loading` more while it loads:
    the file read, the copies the runtime makes of it) under `budget`, given what is
    resident: the idle, unpinned models to unload, least recently used first, until it fits;
    never `name` itself nor one in `keep` (the loaded versions of a model that reloads stay
    counted)."""
    residents = list(residents)
    used = sum(r.bytes for r in residents)
    total = need.bytes + loading
    if used + total <= budget:
        return Room()
    while_loading = f" and {_mib(loading)} more while it loads" if loading else ""
    head = (
        f"model '{name}' needs {_mib(need.bytes)} ({need.how}){while_loading}; the memory "
        f"budget is {_mib(budget)}, {_mib(used)} of it used"
    )
    if total > budget:
        holds = " with what its load holds" if loading else ""
        return Room(refused=f"{head}: the model{holds} is larger than the whole budget")
    kept = set(keep) | {name}
    movable = sorted(
        (r for r in residents if not r.pinned and not r.busy and r.name not in kept),
        key=lambda r: r.last_used,
    )
    evict: list[str] = []
    freed = 0
    for r in movable:
        if used - freed + total <= budget:
            break
        evict.append(r.name)
        freed += r.bytes
    if used - freed + total <= budget:
        return Room(evict=tuple(evict))
    busy = sum(r.bytes for r in residents if r.busy and not r.pinned and r.name not in kept)
    short = (
        " (it would not fit with every idle model unloaded)" if len(evict) == len(movable) else ""
    )
    return Room(
        refused=f"{head} by {describe(residents)}; nothing more can be unloaded{short}",
        wait=used - freed - busy + total <= budget,
    )


def idle_models(residents: Iterable[Resident], now: float, idle_s: float) -> list[str]:
    """The models to unload for being idle at least `idle_s` (never pinned or busy ones),
    least recently used first."""
    return [
        r.name
        for r in sorted(residents, key=lambda r: r.last_used)
        if not r.pinned and not r.busy and now - r.last_used >= idle_s
    ]


def split_cost(total: int, files: Mapping[int, int]) -> dict[int, int]:
    """A load's measured cost shared among the versions it loaded, by their files' sizes."""
    if not files:
        return {}
    whole = sum(files.values())
    if whole <= 0:
        share = max(0, total) // len(files)
        return dict.fromkeys(files, share)
    return {v: max(0, total) * size // whole for v, size in files.items()}
