"""Fleet rollouts: the rollout document, stage membership, the halt rule and the fleet keys.

The format is documented in docs/fleet.md. Per model, `<prefix>/<model>/rollout.json` says which
version is rolled out (`target`), which one a device outside the stage serves (`baseline`) and
which devices are in the current stage. Every device decides alone: stage membership is a pure
function of the document, the device id and its labels, and the union over stages `0..stage`,
so advancing a rollout only ever adds devices. Devices report under `<prefix>/.fleet/`.

Pure: this module parses and builds bytes and keys; the S3 source reads and writes them.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from appliance.repository.rollout_policy import (
    AUTO,
    MANUAL,
    PROGRESS,
    STAGE_RULE_KEYS,
    BudgetRule,
    DeferRule,
    PolicyError,
    Progress,
    ShadowRule,
    StageRule,
    WindowRule,
    parse_windows,
)

FORMAT = 1
ROLLOUT = "rollout.json"
ROLLOUT_SIGNATURE = "rollout.json.sig"
FLEET = ".fleet"  # the dot-folder beside the models, never a model
PASSED, FAILED = "passed", "failed"
VERDICTS = (PASSED, FAILED)
# A report's probation state of a model's target.
NONE, RUNNING, HALTED = "none", "running", "halted"
PROBATION_STATES = (NONE, RUNNING, PASSED, FAILED, HALTED)

# A rollout document is read by every device at every change and parsed on the loop: a real
# one is under 2 KB (a few stages), so 64 KiB and 100 stages leave room and keep a parse under
# a millisecond (a million stages stalled the loop for seconds at every poll). The signature
# is 64 bytes.
MAX_ROLLOUT_BYTES = 64 * 1024
MAX_STAGES = 100
MAX_ROLLOUT_SIGNATURE_BYTES = 1024

DEVICE_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")
_LABEL_KEY = re.compile(r"[A-Za-z0-9._/-]{1,128}")
_LABEL_VALUE = re.compile(r"[^,=\s]{1,256}")
_TOP_FIELDS = (
    "format",
    "model",
    "revision",
    "target",
    "baseline",
    "stages",
    "stage",
    "probation",
    "halt",
    "halted",
    "reason",
    "advance",
    "windows",
    "budget",
    "defer",
    "shadow",
)


class RolloutError(ValueError):
    """A rollout document, a device id or a label is malformed."""


@dataclass(frozen=True)
class Stage:
    """One stage: a share of the fleet by hash (`percent`) or the devices with these labels."""

    percent: float | None = None
    labels: tuple[tuple[str, tuple[str, ...]], ...] = ()  # sorted (key, accepted values)
    rule: StageRule | None = None  # when an automatic rollout leaves it (None: the defaults)

    def holds(self, device_id: str, labels: Mapping[str, str], model: str, target: int) -> bool:
        if self.percent is not None:
            return hash_share(device_id, model, target) < self.percent
        return all(labels.get(key) in values for key, values in self.labels)

    def to_json(self) -> dict[str, Any]:
        rule = self.rule.to_json() if self.rule is not None else {}
        if self.percent is not None:
            return {"percent": _number(self.percent), **rule}
        return {"labels": {k: v[0] if len(v) == 1 else list(v) for k, v in self.labels}, **rule}

    @property
    def advance_rule(self) -> StageRule:
        return self.rule or StageRule()


@dataclass(frozen=True)
class ProbationRule:
    """The thresholds of a device's probation of the target (override the device's flags).

    `max_latency_ratio`: the target fails when its median latency over the window exceeds
    this many times the median of the version it replaced, measured before the switch (None:
    latency is not judged)."""

    window_requests: int
    max_error_rate: float
    max_latency_ratio: float | None = None


@dataclass(frozen=True)
class HaltRule:
    """When the fleet's verdicts halt the rollout, and whether devices on the target go back."""

    max_failed_share: float
    min_verdicts: int
    rollback: bool


@dataclass(frozen=True)
class RolloutDocument:
    """One model's rollout (`<prefix>/<model>/rollout.json`)."""

    model: str
    revision: int
    target: int
    baseline: int
    stages: tuple[Stage, ...]
    stage: int = -1  # index of the current stage; -1: published, nobody has it yet
    probation: ProbationRule | None = None
    halt: HaltRule | None = None
    halted: bool = False  # set by an operator
    reason: str = ""
    format: int = field(default=FORMAT)
    # The policy of a rollout that runs itself (rollout_policy.py): who moves the stages
    # ("manual": operators; "auto": any device or `fleet operator`, by the stages' rules),
    # when a label group downloads and switches, how many switch at once, local deferral,
    # and the shadow probation before clients move.
    advance: str = MANUAL
    windows: tuple[WindowRule, ...] = ()
    budget: BudgetRule | None = None
    defer: DeferRule | None = None
    shadow: ShadowRule | None = None

    def __post_init__(self) -> None:
        validate(self)

    @classmethod
    def parse(cls, data: bytes, model: str | None = None) -> RolloutDocument:
        """The document from its bytes; RolloutError says which field is wrong.

        With `model`, the document must be for that model (the folder it was read from)."""
        if len(data) > MAX_ROLLOUT_BYTES:
            raise RolloutError(
                f"{ROLLOUT} is {len(data)} bytes, more than the {MAX_ROLLOUT_BYTES} it may have"
            )
        raw = load_json(data, ROLLOUT)
        stages = raw.get("stages") if isinstance(raw, dict) else None
        if isinstance(stages, list) and len(stages) > MAX_STAGES:
            raise RolloutError(
                f"{_where('stages')} has {len(stages)} stages, more than the {MAX_STAGES} a "
                "rollout may have"
            )
        document = from_mapping(raw)
        if model is not None and document.model != model:
            raise RolloutError(f"{ROLLOUT} in folder '{model}' is for model '{document.model}'")
        return document

    @property
    def rolls_back(self) -> bool:
        """Whether devices on the target go back to the baseline once the rollout is halted
        (an operator's halt without a halt rule rolls back)."""
        return self.halt.rollback if self.halt is not None else True

    def to_json(self) -> bytes:
        """Stable bytes: the same document always gives the same bytes (to sign them)."""
        body: dict[str, Any] = {
            "format": self.format,
            "model": self.model,
            "revision": self.revision,
            "target": self.target,
            "baseline": self.baseline,
            "stages": [s.to_json() for s in self.stages],
            "stage": self.stage,
        }
        if self.probation is not None:
            body["probation"] = {
                "window_requests": self.probation.window_requests,
                "max_error_rate": _number(self.probation.max_error_rate),
            }
            if self.probation.max_latency_ratio is not None:
                ratio = _number(self.probation.max_latency_ratio)
                body["probation"]["max_latency_ratio"] = ratio
        if self.halt is not None:
            body["halt"] = {
                "max_failed_share": _number(self.halt.max_failed_share),
                "min_verdicts": self.halt.min_verdicts,
                "rollback": self.halt.rollback,
            }
        body["halted"] = self.halted
        body["reason"] = self.reason
        if self.advance != MANUAL:
            body["advance"] = self.advance
        if self.windows:
            body["windows"] = [w.to_json() for w in self.windows]
        if self.budget is not None:
            body["budget"] = self.budget.to_json()
        if self.defer is not None:
            body["defer"] = self.defer.to_json()
        if self.shadow is not None:
            body["shadow"] = self.shadow.to_json()
        return (json.dumps(body, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def load_json(data: bytes, what: str) -> Any:
    """JSON from bytes; RolloutError when it is not UTF-8 JSON, nested too deep included
    (json raises RecursionError past about a thousand levels)."""
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise RolloutError(f"{what} is not UTF-8 JSON: {exc}") from None
    except RecursionError:
        raise RolloutError(f"{what} is not UTF-8 JSON: nested too deep") from None


def _number(value: float) -> int | float:
    return int(value) if float(value).is_integer() else value


def _where(what: str) -> str:
    return f"{ROLLOUT} field '{what}'"


def _int(raw: Mapping[str, Any], key: str, what: str, low: int) -> int:
    value = raw[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise RolloutError(f"{_where(what)} must be an integer, got {json.dumps(value)}")
    if value < low:
        raise RolloutError(f"{_where(what)} must be at least {low}, got {value}")
    return value


def _fraction(raw: Mapping[str, Any], key: str, what: str, high: float = 1.0) -> float:
    value = raw[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RolloutError(f"{_where(what)} must be a number, got {json.dumps(value)}")
    if not 0 <= value <= high:
        raise RolloutError(f"{_where(what)} must be between 0 and {high:g}, got {value}")
    return float(value)


def _ratio(raw: Mapping[str, Any], key: str, what: str) -> float:
    """A ratio of latencies: at least 1 (a target as fast as the version it replaces passes)."""
    value = raw[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RolloutError(f"{_where(what)} must be a number, got {json.dumps(value)}")
    if value < 1:
        raise RolloutError(f"{_where(what)} must be at least 1, got {value}")
    return float(value)


def _object(
    value: Any, what: str, required: tuple[str, ...], optional: tuple[str, ...] = ()
) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise RolloutError(f"{_where(what)} must be a JSON object, got {json.dumps(value)}")
    missing = [k for k in required if k not in value]
    if missing:
        raise RolloutError(f"{_where(what)} lacks {', '.join(repr(k) for k in missing)}")
    unknown = sorted(k for k in value if k not in required + optional)
    if unknown:
        raise RolloutError(f"{_where(what)} has unknown key(s) {', '.join(map(repr, unknown))}")
    return value


def check_model_name(name: Any) -> str:
    if not isinstance(name, str) or not name or "/" in name or name.startswith("."):
        raise RolloutError(
            f"{_where('model')} must be a model folder name (no '/', not starting with '.'), "
            f"got {json.dumps(name)}"
        )
    return name


def _stage(value: Any, index: int) -> Stage:
    what = f"stages[{index}]"
    kind = set(value) - set(STAGE_RULE_KEYS) if isinstance(value, dict) else set()
    if kind not in ({"percent"}, {"labels"}):
        raise RolloutError(
            f'{_where(what)} must be {{"percent": N}} or {{"labels": {{...}}}} (with '
            f"{', '.join(STAGE_RULE_KEYS)} optional), got {json.dumps(value)}"
        )
    rule = None
    if any(k in value for k in STAGE_RULE_KEYS):
        try:
            rule = StageRule.parse(value, what, _where)
        except PolicyError as exc:
            raise RolloutError(str(exc)) from None
    if "percent" in value:
        return Stage(percent=_fraction(value, "percent", f"{what}.percent", 100.0), rule=rule)
    return Stage(labels=_label_pairs(value["labels"], f"{what}.labels"), rule=rule)


def _label_pairs(labels: Any, what: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """A labels object ({KEY: VALUE or [VALUE, ...]}) as sorted (key, values) pairs."""
    if not isinstance(labels, dict) or not labels:
        raise RolloutError(f"{_where(what)} must be a non-empty object")
    pairs = []
    for key, accepted in sorted(labels.items()):
        values = accepted if isinstance(accepted, list) else [accepted]
        if (
            not _LABEL_KEY.fullmatch(key)
            or not values
            or not all(isinstance(v, str) and _LABEL_VALUE.fullmatch(v) for v in values)
        ):
            raise RolloutError(
                f"{_where(what)} entry {json.dumps(key)}: "
                f"{json.dumps(accepted)} is not a label value or a non-empty list of them"
            )
        pairs.append((key, tuple(values)))
    return tuple(pairs)


def _policy(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The self-running rollout's fields (rollout_policy.py), parsed."""
    advance = raw.get("advance", MANUAL)
    if advance not in (MANUAL, AUTO):
        raise RolloutError(f'{_where("advance")} must be "manual" or "auto"')
    try:
        return {
            "advance": advance,
            "windows": parse_windows(raw["windows"], _where, _label_pairs)
            if raw.get("windows") is not None
            else (),
            "budget": BudgetRule.parse(raw["budget"], _where)
            if raw.get("budget") is not None
            else None,
            "defer": DeferRule.parse(raw["defer"], _where)
            if raw.get("defer") is not None
            else None,
            "shadow": ShadowRule.parse(raw["shadow"], _where)
            if raw.get("shadow") is not None
            else None,
        }
    except PolicyError as exc:
        raise RolloutError(str(exc)) from None


def from_mapping(raw: Any) -> RolloutDocument:
    """The document from parsed JSON; RolloutError names the bad field."""
    if not isinstance(raw, dict):
        raise RolloutError(f"{ROLLOUT} must be a JSON object")
    required = ("format", "model", "revision", "target", "baseline", "stages")
    missing = [k for k in required if k not in raw]
    if missing:
        raise RolloutError(f"{ROLLOUT} lacks {', '.join(repr(k) for k in missing)}")
    unknown = sorted(k for k in raw if k not in _TOP_FIELDS)
    if unknown:
        raise RolloutError(f"{ROLLOUT} has unknown field(s) {', '.join(map(repr, unknown))}")
    if raw["format"] != FORMAT or isinstance(raw["format"], bool):
        raise RolloutError(
            f"{_where('format')} is {json.dumps(raw['format'])}; this device reads format {FORMAT}"
        )
    stages = raw["stages"]
    if not isinstance(stages, list) or not stages:
        raise RolloutError(f"{_where('stages')} must be a non-empty list")
    probation = None
    if raw.get("probation") is not None:
        rule = _object(
            raw["probation"],
            "probation",
            ("window_requests", "max_error_rate"),
            ("max_latency_ratio",),
        )
        probation = ProbationRule(
            _int(rule, "window_requests", "probation.window_requests", 1),
            _fraction(rule, "max_error_rate", "probation.max_error_rate"),
            _ratio(rule, "max_latency_ratio", "probation.max_latency_ratio")
            if rule.get("max_latency_ratio") is not None
            else None,
        )
    halt = None
    if raw.get("halt") is not None:
        rule = _object(raw["halt"], "halt", ("max_failed_share",), ("min_verdicts", "rollback"))
        rollback = rule.get("rollback", True)
        if not isinstance(rollback, bool):
            raise RolloutError(f"{_where('halt.rollback')} must be true or false")
        halt = HaltRule(
            _fraction(rule, "max_failed_share", "halt.max_failed_share"),
            _int(rule, "min_verdicts", "halt.min_verdicts", 1) if "min_verdicts" in rule else 1,
            rollback,
        )
    halted = raw.get("halted", False)
    if not isinstance(halted, bool):
        raise RolloutError(f"{_where('halted')} must be true or false")
    reason = raw.get("reason", "")
    if not isinstance(reason, str):
        raise RolloutError(f"{_where('reason')} must be a string")
    return RolloutDocument(
        model=check_model_name(raw["model"]),
        revision=_int(raw, "revision", "revision", 0),
        target=_int(raw, "target", "target", 1),
        baseline=_int(raw, "baseline", "baseline", 1),
        stages=tuple(_stage(s, i) for i, s in enumerate(stages)),
        stage=_int(raw, "stage", "stage", -1) if "stage" in raw else -1,
        probation=probation,
        halt=halt,
        halted=halted,
        reason=reason,
        **_policy(raw),
    )


def validate(document: RolloutDocument) -> None:
    """The rules across fields (the per-field ones are in the parser); RolloutError if broken."""
    check_model_name(document.model)
    if document.format != FORMAT:
        raise RolloutError(f"{_where('format')} must be {FORMAT}")
    if document.target < 1 or document.baseline < 1:
        raise RolloutError(f"{_where('target')} and 'baseline' must be positive versions")
    if document.target == document.baseline:
        raise RolloutError(f"{ROLLOUT}: 'target' and 'baseline' are both version {document.target}")
    if not document.stages:
        raise RolloutError(f"{_where('stages')} must be a non-empty list")
    ratio = document.probation.max_latency_ratio if document.probation is not None else None
    if ratio is not None and not (math.isfinite(ratio) and ratio >= 1):
        raise RolloutError(f"{_where('probation.max_latency_ratio')} must be at least 1")
    if not -1 <= document.stage < len(document.stages):
        raise RolloutError(
            f"{_where('stage')} is {document.stage}; with {len(document.stages)} stage(s) it "
            f"must be -1 (not started) to {len(document.stages) - 1}"
        )


# -- membership and the halt rule -------------------------------------------------------------


def hash_share(device_id: str, model: str, target: int) -> float:
    """Where a device falls in [0, 100) for a model's target: stable, uniform."""
    digest = hashlib.sha256(f"{device_id}/{model}/{target}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 * 100


def membership(document: RolloutDocument, device_id: str, labels: Mapping[str, str]) -> bool:
    """Whether the device is in the rollout at its current stage (the union of 0..stage)."""
    return any(
        s.holds(device_id, labels, document.model, document.target)
        for s in document.stages[: document.stage + 1]
    )


def halted(document: RolloutDocument, passed: int, failed: int) -> bool:
    """Whether the rollout is halted: by an operator, or by the fleet's verdicts."""
    if document.halted:
        return True
    rule = document.halt
    if rule is None or failed < rule.min_verdicts:
        return False
    return failed / (failed + passed) > rule.max_failed_share


def effective(document: RolloutDocument, progress: Progress | None) -> RolloutDocument:
    """The document as its automatic progress moved it (`advance: auto`, a progress of this
    revision and target): its stage (never below the document's) and the fleet's halt."""
    if (
        document.advance != AUTO
        or progress is None
        or not progress.applies_to(document.model, document.revision, document.target)
    ):
        return document
    stage = min(max(document.stage, progress.stage), len(document.stages) - 1)
    if progress.halted and not document.halted:
        return dataclasses.replace(document, stage=stage, halted=True, reason=progress.reason)
    return dataclasses.replace(document, stage=stage)


def choose_version(
    document: RolloutDocument, in_stage: bool, is_halted: bool, failed_here: bool, on_target: bool
) -> int:
    """The version a device serves. `failed_here`: the target failed on this device (its
    probation, load or warm-up) and is never taken again; `on_target`: the device took it."""
    if failed_here:
        return document.baseline
    if is_halted:
        return document.target if on_target and not document.rolls_back else document.baseline
    return document.target if in_stage else document.baseline


def needs_verdicts(
    document: RolloutDocument, in_stage: bool, failed_here: bool, on_target: bool
) -> bool:
    """Whether the fleet's verdicts could change this device's choice (then it lists them once
    per poll): it would take the target, or it is on it and a halt would roll it back."""
    if document.halt is None or document.halted or failed_here:
        return False
    return (in_stage and not on_target) or (on_target and document.halt.rollback)


# -- keys in the bucket ------------------------------------------------------------------------


def _join(prefix: str, *parts: str) -> str:
    prefix = prefix.strip("/")
    return "/".join([prefix, *parts] if prefix else parts)


def rollout_key(prefix: str, model: str) -> str:
    return _join(prefix, model, ROLLOUT)


def rollout_signature_key(prefix: str, model: str) -> str:
    return _join(prefix, model, ROLLOUT_SIGNATURE)


def progress_key(prefix: str, model: str) -> str:
    return _join(prefix, model, PROGRESS)


def slots_prefix(prefix: str, model: str, version: int, group: str) -> str:
    """The disruption budget's probation slots of one group (`<index>.json` under it)."""
    return _join(prefix, FLEET, "slots", model, str(version), group) + "/"


def report_key(prefix: str, device_id: str) -> str:
    return _join(prefix, FLEET, "devices", f"{device_id}.json")


def reports_prefix(prefix: str) -> str:
    return _join(prefix, FLEET, "devices") + "/"


def verdict_prefix(prefix: str, model: str, version: int) -> str:
    """What one ListObjectsV2 lists to count a version's verdicts (ends with '/')."""
    return _join(prefix, FLEET, "verdicts", model, str(version)) + "/"


def verdict_key(prefix: str, model: str, version: int, verdict: str, device_id: str) -> str:
    if verdict not in VERDICTS:
        raise ValueError(f"verdict must be one of {VERDICTS}, got {verdict!r}")
    return verdict_prefix(prefix, model, version) + f"{verdict}/{device_id}.json"


def parse_verdict_key(listed_prefix: str, key: str) -> tuple[str, str] | None:
    """(verdict, device id) of a key under verdict_prefix(), None for a key of another shape."""
    if not key.startswith(listed_prefix):
        return None
    verdict, _, name = key[len(listed_prefix) :].partition("/")
    device, dot, ext = name.rpartition(".")
    if verdict not in VERDICTS or not dot or ext != "json" or not DEVICE_ID.fullmatch(device):
        return None
    return verdict, device


@dataclass(frozen=True)
class VerdictCount:
    passed: int
    failed: int


def count_verdicts(listed_prefix: str, keys: Iterable[str]) -> VerdictCount:
    """Devices that passed and failed a version, from the keys under verdict_prefix().

    A device with both keys (it deletes its other one when it writes; a listing can fall
    between the two) counts once, as failed: a halt errs on the safe side."""
    by_device: dict[str, str] = {}
    for key in keys:
        parsed = parse_verdict_key(listed_prefix, key)
        if parsed is not None:
            verdict, device = parsed
            if by_device.get(device) != FAILED:
                by_device[device] = verdict
    failed = sum(v == FAILED for v in by_device.values())
    return VerdictCount(len(by_device) - failed, failed)


def utc_text(epoch_s: float) -> str:
    """'2026-12-01T15:00:00Z'."""
    moment = datetime.datetime.fromtimestamp(epoch_s, datetime.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def utc_text_ms(epoch_s: float) -> str:
    """'2026-12-01T15:00:00.123Z'."""
    moment = datetime.datetime.fromtimestamp(epoch_s, datetime.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def verdict_body(
    device_id: str, model: str, version: int, verdict: str, reason: str, epoch_s: float
) -> bytes:
    body = {
        "format": FORMAT,
        "device": device_id,
        "model": model,
        "version": version,
        "verdict": verdict,
        "reason": reason,
        "time": utc_text(epoch_s),
    }
    return (json.dumps(body, ensure_ascii=False) + "\n").encode("utf-8")


@dataclass(frozen=True)
class ModelReport:
    """One model in a device report."""

    serving: tuple[int, ...]
    rollout_revision: int | None = None
    target: int | None = None
    in_stage: bool | None = None
    probation: str = NONE  # one of PROBATION_STATES
    reason: str = ""
    requests: int = 0
    errors: int = 0
    p50_ms: float | None = None
    p99_ms: float | None = None
    # A rollout that runs itself (rollout_policy.py); absent from the report when unset.
    stage: int | None = None  # the stage as this device acts on it (progress included)
    waiting: str = ""  # why it does not switch to the target yet
    window: str = ""  # "open", "download closed", "switch closed"
    deferred_s: float | None = None  # deferring its switch for this long
    holding_back: bool = False  # deferring for longer than the rollout allows
    probation_started: float | None = None  # when it switched to the target (epoch s)
    probation_ended: float | None = None  # when the target's verdict came (epoch s)
    stage_check: Mapping[str, Any] | None = None  # the stage's advance check, as last made
    shadow: Mapping[str, Any] | None = None  # the shadow probation's numbers

    def to_json(self) -> dict[str, Any]:
        extra: dict[str, Any] = {}
        if self.stage is not None:
            extra["stage"] = self.stage
        for key in ("waiting", "window"):
            if getattr(self, key):
                extra[key] = getattr(self, key)
        if self.deferred_s is not None:
            extra["deferred_s"] = self.deferred_s
            extra["holding_back"] = self.holding_back
        for key in ("probation_started", "probation_ended"):
            value = getattr(self, key)
            if value is not None:
                extra[key] = utc_text_ms(value)
        if self.stage_check is not None:
            extra["stage_check"] = dict(self.stage_check)
        if self.shadow is not None:
            extra["shadow"] = dict(self.shadow)
        return {
            "serving": list(self.serving),
            "rollout_revision": self.rollout_revision,
            "target": self.target,
            "in_stage": self.in_stage,
            "probation": self.probation,
            "reason": self.reason,
            "requests": self.requests,
            "errors": self.errors,
            "p50_ms": self.p50_ms,
            "p99_ms": self.p99_ms,
        } | extra


def report_body(
    identity: DeviceIdentity,
    epoch_s: float,
    server_version: str,
    last_poll_s: float | None,
    last_poll_ok: bool | None,
    models: Mapping[str, ModelReport],
    frozen_since_s: float = 0.0,
) -> bytes:
    """A device report (`.fleet/devices/<id>.json`). `frozen_since_s`: TUF mode's freeze (the
    trusted metadata expired then; 0: not frozen)."""
    body = {
        "format": FORMAT,
        "device": identity.device_id,
        "labels": dict(identity.labels),
        "time": utc_text(epoch_s),
        "server_version": server_version,
        "last_poll": utc_text(last_poll_s) if last_poll_s else None,
        "last_poll_ok": last_poll_ok,
        "updates_frozen_since": utc_text(frozen_since_s) if frozen_since_s else None,
        "models": {name: models[name].to_json() for name in sorted(models)},
    }
    return (json.dumps(body, ensure_ascii=False) + "\n").encode("utf-8")


# -- device identity ---------------------------------------------------------------------------


def check_device_id(value: str, where: str = "--device-id") -> str:
    if not DEVICE_ID.fullmatch(value):
        raise RolloutError(f"{where} {value!r} is not a device id: 1 to 128 of A-Z a-z 0-9 . _ -")
    return value


def parse_labels(items: Iterable[str], where: str = "--device-label") -> dict[str, str]:
    """`key=value` items (flag values, or an env string split at commas) as a mapping."""
    labels: dict[str, str] = {}
    for item in items:
        key, eq, value = item.strip().partition("=")
        if not eq or not _LABEL_KEY.fullmatch(key) or not _LABEL_VALUE.fullmatch(value):
            raise RolloutError(
                f"{where} {item!r} is not key=value (key: A-Z a-z 0-9 . _ / -; value: no "
                "spaces, commas or '=')"
            )
        if key in labels:
            raise RolloutError(f"{where}: label '{key}' given twice")
        labels[key] = value
    return labels


def parse_label_text(text: str, where: str = "EDGE_DEVICE_LABELS") -> dict[str, str]:
    """'site=berlin,hw=orin-nano' (empty: no labels)."""
    return parse_labels([p for p in text.split(",") if p.strip()], where)


def device_id_from(machine_id: bytes | None, host_name: str) -> str:
    """The default device id: systemd's machine id, else the host name."""
    text = (machine_id or b"").decode("ascii", "replace").strip()
    if text:
        return check_device_id(text, "/etc/machine-id")
    return check_device_id(host_name.strip(), "the host name")


@dataclass(frozen=True)
class DeviceIdentity:
    """Who this device is in a fleet: its id and labels."""

    device_id: str
    labels: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def resolve(
        cls,
        device_id: str | None,
        labels: Iterable[str] | None,
        environ: Mapping[str, str],
        read_machine_id: Callable[[], bytes | None],
        host_name: Callable[[], str],
    ) -> DeviceIdentity:
        """From the flags, else the environment, else the machine id or host name.

        RolloutError (a start-up error) when the id or a label is malformed."""
        if device_id is None and environ.get("EDGE_DEVICE_ID"):
            device_id = check_device_id(environ["EDGE_DEVICE_ID"], "EDGE_DEVICE_ID")
        elif device_id is not None:
            device_id = check_device_id(device_id)
        else:
            device_id = device_id_from(read_machine_id(), host_name())
        if labels:
            parsed = parse_labels(labels)
        else:
            parsed = parse_label_text(environ.get("EDGE_DEVICE_LABELS", ""))
        return cls(device_id, parsed)
