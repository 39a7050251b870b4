"""A rollout's policy beyond its stages: automatic advance, windows, a disruption budget, local
deferral and shadow probation (docs/fleet.md, "Rollouts that run themselves").

Pure: the rules as parsed from the rollout document, the progress object that the advancers
(any device's agent, `edge-appliance fleet operator`) write with compare-and-swap, and the
decisions: whether a stage advances, halts or waits (and why), whether a window is open at a
local time, which probation slots are free. rollout.py parses the document with these; the
agent (fleet_agent.py) and the operator's commands (appliance/fleet/) act on the decisions.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

PROGRESS = "rollout.progress.json"
MAX_PROGRESS_BYTES = 16 * 1024
MANUAL, AUTO = "manual", "auto"
ADVANCE, HALT, WAIT, DONE = "advance", "halt", "wait", "done"

Where = Callable[[str], str]  # a field's name -> "rollout.json field '...'"


class PolicyError(ValueError):
    """A policy field of the rollout document (or the progress object) is malformed."""


# -- small checks (the rollout document's wording) ---------------------------------------------


def _number(raw: Mapping[str, Any], key: str, what: str, where: Where, low: float = 0.0) -> float:
    value = raw[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise PolicyError(f"{where(what)} must be a number, got {json.dumps(value)}")
    if value < low:
        raise PolicyError(f"{where(what)} must be at least {low:g}, got {value}")
    return float(value)


def _share(raw: Mapping[str, Any], key: str, what: str, where: Where) -> float:
    value = _number(raw, key, what, where)
    if value > 1:
        raise PolicyError(f"{where(what)} must be between 0 and 1, got {value}")
    return value


def _count(raw: Mapping[str, Any], key: str, what: str, where: Where, low: int = 0) -> int:
    value = raw[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise PolicyError(f"{where(what)} must be an integer, got {json.dumps(value)}")
    if value < low:
        raise PolicyError(f"{where(what)} must be at least {low}, got {value}")
    return value


def _keys(value: Any, what: str, where: Where, allowed: tuple[str, ...]) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise PolicyError(f"{where(what)} must be a JSON object, got {json.dumps(value)}")
    unknown = sorted(k for k in value if k not in allowed)
    if unknown:
        raise PolicyError(f"{where(what)} has unknown key(s) {', '.join(map(repr, unknown))}")
    return value


def _text(value: float) -> int | float:
    return int(value) if float(value).is_integer() else value


# -- a stage's advance rule ----------------------------------------------------------------------

STAGE_RULE_KEYS = ("soak_s", "min_verdicts", "min_passed_share")


@dataclass(frozen=True)
class StageRule:
    """When an automatic rollout leaves a stage: after `soak_s` seconds in it (by the bucket's
    clock), with at least `min_verdicts` verdicts for the target (all stages' so far) of which
    at least `min_passed_share` passed. Below the share (with enough verdicts) it halts."""

    soak_s: float = 0.0
    min_verdicts: int = 1
    min_passed_share: float = 1.0

    @classmethod
    def parse(cls, raw: Mapping[str, Any], what: str, where: Where) -> StageRule:
        return cls(
            _number(raw, "soak_s", f"{what}.soak_s", where) if "soak_s" in raw else 0.0,
            _count(raw, "min_verdicts", f"{what}.min_verdicts", where, 1)
            if "min_verdicts" in raw
            else 1,
            _share(raw, "min_passed_share", f"{what}.min_passed_share", where)
            if "min_passed_share" in raw
            else 1.0,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "soak_s": _text(self.soak_s),
            "min_verdicts": self.min_verdicts,
            "min_passed_share": _text(self.min_passed_share),
        }


# -- windows -----------------------------------------------------------------------------------

_DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_SPAN = re.compile(r"(?:(?P<days>[A-Za-z,-]+)\s+)?(?P<a>\d\d):(?P<b>\d\d)-(?P<c>\d\d):(?P<d>\d\d)")


@dataclass(frozen=True)
class Span:
    """'[DAYS ]HH:MM-HH:MM' in the device's local time; past midnight when the end is earlier
    than the start (the part after midnight belongs to the start's day)."""

    days: frozenset[int]  # 0 = Monday
    start_min: int
    end_min: int  # exclusive; 1440 for 24:00
    text: str

    @classmethod
    def parse(cls, text: Any, what: str, where: Where) -> Span:
        match = _SPAN.fullmatch(text.strip()) if isinstance(text, str) else None
        bad = f"{where(what)}: {json.dumps(text)} is not '[DAYS ]HH:MM-HH:MM' (e.g. '01:00-05:00'"
        bad += ", 'Mon-Fri 22:00-04:00')"
        if match is None:
            raise PolicyError(bad)
        a, b, c, d = (int(match[k]) for k in "abcd")
        if a > 23 or b > 59 or d > 59 or c > 24 or (c == 24 and d):
            raise PolicyError(bad)
        start, end = a * 60 + b, c * 60 + d
        if start == end:
            raise PolicyError(f"{where(what)}: {json.dumps(text)} is empty (use 00:00-24:00)")
        return cls(_days(match["days"], bad), start, end, text.strip())

    def holds(self, weekday: int, minute: int) -> bool:
        if self.start_min < self.end_min:
            return weekday in self.days and self.start_min <= minute < self.end_min
        if minute >= self.start_min:  # past midnight: today's evening part ...
            return weekday in self.days
        return minute < self.end_min and (weekday - 1) % 7 in self.days  # ... or yesterday's


def _days(text: str | None, bad: str) -> frozenset[int]:
    if not text:
        return frozenset(range(7))
    days: set[int] = set()
    for part in text.lower().split(","):
        first, dash, last = part.partition("-")
        if first not in _DAYS or (dash and last not in _DAYS):
            raise PolicyError(bad)
        i, j = _DAYS.index(first), _DAYS.index(last) if dash else _DAYS.index(first)
        days.update((i + k) % 7 for k in range((j - i) % 7 + 1))
    return frozenset(days)


def _spans(value: Any, what: str, where: Where) -> tuple[Span, ...]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items:
        raise PolicyError(f"{where(what)} must be a window or a non-empty list of them")
    return tuple(Span.parse(item, f"{what}[{i}]", where) for i, item in enumerate(items))


def open_at(spans: tuple[Span, ...], local: time.struct_time) -> bool:
    """Whether any span holds at a local time (no spans: always open)."""
    minute = local.tm_hour * 60 + local.tm_min
    return not spans or any(s.holds(local.tm_wday, minute) for s in spans)


@dataclass(frozen=True)
class WindowRule:
    """The download and switch windows of the devices with these labels (none: every device)."""

    labels: tuple[tuple[str, tuple[str, ...]], ...] = ()
    download: tuple[Span, ...] = ()  # empty: always
    switch: tuple[Span, ...] = ()

    def holds(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(key) in values for key, values in self.labels)

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {}
        if self.labels:
            body["labels"] = {k: v[0] if len(v) == 1 else list(v) for k, v in self.labels}
        if self.download:
            body["download"] = [s.text for s in self.download]
        if self.switch:
            body["switch"] = [s.text for s in self.switch]
        return body


def parse_windows(
    value: Any,
    where: Where,
    parse_labels: Callable[[Any, str], tuple[tuple[str, tuple[str, ...]], ...]],
) -> tuple[WindowRule, ...]:
    if not isinstance(value, list):
        raise PolicyError(f"{where('windows')} must be a list")
    rules = []
    for i, item in enumerate(value):
        what = f"windows[{i}]"
        raw = _keys(item, what, where, ("labels", "download", "switch"))
        rules.append(
            WindowRule(
                parse_labels(raw["labels"], f"{what}.labels") if "labels" in raw else (),
                _spans(raw["download"], f"{what}.download", where) if "download" in raw else (),
                _spans(raw["switch"], f"{what}.switch", where) if "switch" in raw else (),
            )
        )
    return tuple(rules)


def window_for(rules: Iterable[WindowRule], labels: Mapping[str, str]) -> WindowRule | None:
    """The first window rule that holds the device (None: its windows are always open)."""
    return next((r for r in rules if r.holds(labels)), None)


# -- the disruption budget, deferral, shadow probation -------------------------------------------


@dataclass(frozen=True)
class BudgetRule:
    """At most `max_devices` devices, and at most `max_percent` of the devices, of a group
    (the devices with the same value of label `group_by`; none: the whole fleet) switch to the
    target and run its probation at once (either or both; at least one slot). A group's size
    is the devices that registered in it for the target (every device that read the document
    does, once); early in a rollout that is fewer than all, so the budget errs low. A slot
    older than `lease_s` (a device that died holding it) is free again."""

    max_devices: int | None = None
    group_by: str = ""
    lease_s: float = 1800.0
    max_percent: float | None = None

    @classmethod
    def parse(cls, value: Any, where: Where) -> BudgetRule:
        raw = _keys(value, "budget", where, ("max_devices", "max_percent", "group_by", "lease_s"))
        if "max_devices" not in raw and "max_percent" not in raw:
            raise PolicyError(f"{where('budget')} lacks 'max_devices' or 'max_percent'")
        group = raw.get("group_by", "")
        if not isinstance(group, str):
            raise PolicyError(f"{where('budget.group_by')} must be a label key")
        percent = None
        if "max_percent" in raw:
            percent = _number(raw, "max_percent", "budget.max_percent", where)
            if not 0 < percent <= 100:
                raise PolicyError(f"{where('budget.max_percent')} must be above 0, at most 100")
        return cls(
            _count(raw, "max_devices", "budget.max_devices", where, 1)
            if "max_devices" in raw
            else None,
            group,
            _number(raw, "lease_s", "budget.lease_s", where, 1.0) if "lease_s" in raw else 1800.0,
            percent,
        )

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {}
        if self.max_devices is not None:
            body["max_devices"] = self.max_devices
        if self.max_percent is not None:
            body["max_percent"] = _text(self.max_percent)
        if self.group_by:
            body["group_by"] = self.group_by
        body["lease_s"] = _text(self.lease_s)
        return body

    def group(self, labels: Mapping[str, str]) -> str:
        """The slot folder of a device's group ('all', or 'site=berlin'; '-' for no value)."""
        if not self.group_by:
            return "all"
        return f"{self.group_by}={labels.get(self.group_by, '-')}"

    def slots(self, members: int) -> int:
        """How many devices of a group of `members` may be on probation at once."""
        limits = [self.max_devices] if self.max_devices is not None else []
        if self.max_percent is not None:
            limits.append(max(1, math.floor(members * self.max_percent / 100 + 1e-9)))
        return min(limits)


def free_slot(
    rule: BudgetRule, taken: Mapping[int, float], now_s: float, members: int = 0
) -> tuple[int, bool] | None:
    """A slot to claim, and whether it is a stale one to take over (its holder's lease is
    over), from the slots taken (index -> when written, by the bucket's clock) in a group of
    `members` devices. None: the budget is used up."""
    slots = rule.slots(members)
    for index in range(slots):
        if index not in taken:
            return index, False
    stale = [i for i, at in sorted(taken.items()) if i < slots and now_s - at > rule.lease_s]
    return (stale[0], True) if stale else None


@dataclass(frozen=True)
class DeferRule:
    """A device may defer its switch (a local "not now") for at most `max_s` seconds; past it,
    it reports itself as holding back (it still defers: the device knows what it records)."""

    max_s: float

    @classmethod
    def parse(cls, value: Any, where: Where) -> DeferRule:
        raw = _keys(value, "defer", where, ("max_s",))
        if "max_s" not in raw:
            raise PolicyError(f"{where('defer')} lacks 'max_s'")
        return cls(_number(raw, "max_s", "defer.max_s", where))

    def to_json(self) -> dict[str, Any]:
        return {"max_s": _text(self.max_s)}


SHADOW_KEYS = (
    "share",
    "requests",
    "max_error_rate",
    "max_latency_ratio",
    "max_abs_diff",
    "min_top1_agreement",
    "timeout_s",
)


@dataclass(frozen=True)
class ShadowRule:
    """Before clients move, the target runs beside the served version on a `share` of the live
    requests (mirrored; clients get the served version's answers) until `requests` mirrored
    requests are judged: more than `max_error_rate` failing, a median latency over
    `max_latency_ratio` times the served version's, outputs further than `max_abs_diff`
    (optional), or top-1 agreement under `min_top1_agreement` (optional, classifiers) fail it.
    Not judged within `timeout_s` (too little traffic): it fails."""

    share: float = 1.0
    requests: int = 20
    max_error_rate: float = 0.0
    max_latency_ratio: float | None = None
    max_abs_diff: float | None = None
    min_top1_agreement: float | None = None
    timeout_s: float = 3600.0

    @classmethod
    def parse(cls, value: Any, where: Where) -> ShadowRule:
        raw = _keys(value, "shadow", where, SHADOW_KEYS)
        share = _share(raw, "share", "shadow.share", where) if "share" in raw else 1.0
        if share <= 0:
            raise PolicyError(f"{where('shadow.share')} must be above 0")
        ratio = raw.get("max_latency_ratio")
        return cls(
            share,
            _count(raw, "requests", "shadow.requests", where, 1) if "requests" in raw else 20,
            _share(raw, "max_error_rate", "shadow.max_error_rate", where)
            if "max_error_rate" in raw
            else 0.0,
            _number(raw, "max_latency_ratio", "shadow.max_latency_ratio", where, 1.0)
            if ratio is not None
            else None,
            _number(raw, "max_abs_diff", "shadow.max_abs_diff", where)
            if raw.get("max_abs_diff") is not None
            else None,
            _share(raw, "min_top1_agreement", "shadow.min_top1_agreement", where)
            if raw.get("min_top1_agreement") is not None
            else None,
            _number(raw, "timeout_s", "shadow.timeout_s", where, 1.0)
            if "timeout_s" in raw
            else 3600.0,
        )

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "share": _text(self.share),
            "requests": self.requests,
            "max_error_rate": _text(self.max_error_rate),
        }
        for key in ("max_latency_ratio", "max_abs_diff", "min_top1_agreement"):
            value = getattr(self, key)
            if value is not None:
                body[key] = _text(value)
        body["timeout_s"] = _text(self.timeout_s)
        return body


# -- the progress object -------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """One automatic move, kept in the progress object's history."""

    stage: int  # the stage moved to (or halted at)
    at: str  # UTC text, the writer's clock
    by: str  # a device id, or 'operator'
    passed: int
    failed: int
    action: str = ADVANCE  # or HALT

    def to_json(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "action": self.action,
            "at": self.at,
            "by": self.by,
            "passed": self.passed,
            "failed": self.failed,
        }


@dataclass(frozen=True)
class Progress:
    """`<prefix>/<model>/rollout.progress.json`: how far an automatic rollout of one document
    revision got. Written only as a compare-and-swap over the one read (S3 conditional
    writes), so of two advancers that saw the same stage pass, one moves it."""

    model: str
    revision: int  # the document revision it applies to
    target: int
    stage: int
    halted: bool = False
    reason: str = ""
    history: tuple[Step, ...] = field(default=())

    def applies_to(self, model: str, revision: int, target: int) -> bool:
        return (self.model, self.revision, self.target) == (model, revision, target)

    def to_json(self) -> bytes:
        body = {
            "format": 1,
            "model": self.model,
            "revision": self.revision,
            "target": self.target,
            "stage": self.stage,
            "halted": self.halted,
            "reason": self.reason,
            "history": [s.to_json() for s in self.history[-100:]],
        }
        return (json.dumps(body, indent=2, ensure_ascii=False) + "\n").encode("utf-8")

    @classmethod
    def parse(cls, data: bytes, model: str) -> Progress:
        """PolicyError when it is not one (or not this model's)."""
        if len(data) > MAX_PROGRESS_BYTES:
            raise PolicyError(f"{PROGRESS} is over {MAX_PROGRESS_BYTES} bytes")
        try:
            raw = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise PolicyError(f"{PROGRESS} is not UTF-8 JSON: {exc}") from None

        def where(what: str) -> str:
            return f"{PROGRESS} field '{what}'"

        raw = _keys(
            raw,
            "(top)",
            where,
            ("format", "model", "revision", "target", "stage", "halted", "reason", "history"),
        )
        for key in ("format", "model", "revision", "target", "stage"):
            if key not in raw:
                raise PolicyError(f"{PROGRESS} lacks '{key}'")
        if raw["format"] != 1 or raw["model"] != model:
            raise PolicyError(f"{PROGRESS} is not a format 1 progress of model '{model}'")
        halted, reason = raw.get("halted", False), raw.get("reason", "")
        if not isinstance(halted, bool) or not isinstance(reason, str):
            raise PolicyError(f"{where('halted')} / 'reason' must be a boolean / a string")
        history = raw.get("history", [])
        if not isinstance(history, list):
            raise PolicyError(f"{where('history')} must be a list")
        steps = []
        for item in history[-100:]:
            if isinstance(item, dict):
                try:
                    steps.append(
                        Step(
                            int(item["stage"]),
                            str(item["at"]),
                            str(item["by"]),
                            int(item["passed"]),
                            int(item["failed"]),
                            str(item.get("action", ADVANCE)),
                        )
                    )
                except (KeyError, TypeError, ValueError):
                    continue  # history is for people; a bad entry is no reason to stop
        return cls(
            model,
            _count(raw, "revision", "revision", where),
            _count(raw, "target", "target", where, 1),
            _count(raw, "stage", "stage", where, 0),
            halted,
            reason,
            tuple(steps),
        )


# -- the advance rule ------------------------------------------------------------------------------


@dataclass(frozen=True)
class StageCheck:
    """Where an automatic rollout's current stage stands."""

    action: str  # ADVANCE, HALT, WAIT or DONE
    why: str
    soak_left_s: float = 0.0
    verdicts: int = 0
    min_verdicts: int = 0
    passed_share: float | None = None
    min_passed_share: float = 1.0

    def to_json(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "why": self.why,
            "soak_left_s": round(self.soak_left_s, 1),
            "verdicts": self.verdicts,
            "min_verdicts": self.min_verdicts,
            "passed_share": None if self.passed_share is None else round(self.passed_share, 4),
            "min_passed_share": self.min_passed_share,
        }


def check_stage(
    stage: int,
    stages: int,
    rule: StageRule,
    passed: int,
    failed: int,
    in_stage_s: float,
    halted_already: bool,
    halted_by_verdicts: bool,
) -> StageCheck:
    """Whether an automatic rollout at `stage` (of `stages`) advances, halts or waits, from the
    target's verdicts and the time the stage has run (`in_stage_s`, the bucket's clock)."""
    total = passed + failed
    share = passed / total if total else None

    def result(action: str, why: str, soak_left_s: float = 0.0) -> StageCheck:
        return StageCheck(
            action, why, soak_left_s, total, rule.min_verdicts, share, rule.min_passed_share
        )

    if halted_already:
        return result(DONE, "halted")
    if halted_by_verdicts:
        return result(HALT, f"{failed} of {total} verdicts failed (the halt rule)")
    if stage < 0:
        return result(WAIT, "not started (stage -1): `fleet advance` starts it")
    if total >= rule.min_verdicts and share is not None and share < rule.min_passed_share:
        return result(
            HALT,
            f"{passed} of {total} verdicts passed, under the stage's min_passed_share "
            f"{rule.min_passed_share:g}",
        )
    if stage >= stages - 1:
        return result(DONE, "at its last stage")
    soak_left = max(0.0, rule.soak_s - in_stage_s)
    waits = []
    if soak_left > 0:
        waits.append(f"soak {soak_left:.0f} s left of {rule.soak_s:g} s")
    if total < rule.min_verdicts:
        waits.append(f"verdicts {total}/{rule.min_verdicts}")
    if waits:
        return result(WAIT, "waiting: " + ", ".join(waits), soak_left)
    return result(
        ADVANCE,
        f"stage {stage} passed: {passed} of {total} verdicts passed (at least "
        f"{rule.min_passed_share:g} needed) after {in_stage_s:.0f} s",
    )
