"""`fleet status`: versions x devices, per label, from the devices' reports and verdicts.

What it reads: one listing of `.fleet/devices/` and a GET per report (in parallel), a delimiter
listing of the models, each model's rollout.json, and one listing of `.fleet/verdicts/<model>/`
(keys only: the verdict is in the key). Silence is judged by the bucket's clock (the report's
LastModified against the listing's Date), so a device or operator with a wrong clock does not
look silent or alive. `summarize` is pure; `render` and `as_json` print it.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from appliance.fleet import control
from appliance.fleet.bucket import FleetBucket, FleetError
from appliance.repository import rollout
from appliance.repository.local import version_number
from appliance.repository.rollout import RolloutDocument
from appliance.repository.rollout_policy import StageCheck

DEFAULT_SILENT_AFTER_S = 900.0  # three of the devices' default report intervals (300 s)
# A device's report is a few hundred bytes a model; one over this is not read (a device, or
# whoever can write its key, must not make the operator's command fetch gigabytes).
MAX_REPORT_BYTES = 1 << 20
_READERS = 16  # reports fetched at once
ALL, NO_LABEL, NO_REPORT = "all", "-", "?"


@dataclass(frozen=True)
class DeviceReport:
    device: str
    labels: dict[str, str]
    modified_s: float  # when the bucket got it, by the bucket's clock
    models: dict[str, dict[str, Any]]
    last_poll_ok: bool | None = None
    server_version: str = ""
    frozen_since: str = ""  # TUF mode: "updates frozen since" this UTC time ('' : not frozen)


@dataclass
class Snapshot:
    """What the bucket says, read once."""

    url: str
    now_s: float  # the bucket's clock
    reports: list[DeviceReport] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)  # report keys that did not parse
    rollouts: dict[str, RolloutDocument | None] = field(default_factory=dict)
    # model -> version -> device -> verdict
    verdicts: dict[str, dict[int, dict[str, str]]] = field(default_factory=dict)
    currents: dict[str, control.Current] = field(default_factory=dict)  # as read, progress too


@dataclass
class Row:
    group: str
    version: int
    devices: int = 0  # serving it
    probation: int = 0  # serving it, in probation
    passed: int = 0  # verdicts
    failed: int = 0
    silent: int = 0  # serving it (as last reported) and silent


@dataclass
class ModelView:
    model: str
    rollout: RolloutDocument | None
    halted_by: str = ""  # "", "operator", "verdicts"
    passed: int = 0  # the target's verdicts
    failed: int = 0
    in_stage: int = 0  # reporting devices the current stage holds
    in_stage_on_target: int = 0
    outside_on_target: int = 0  # devices outside the stage that serve the target
    behind: int = 0  # devices that reported an older revision of the document
    rows: list[Row] = field(default_factory=list)
    check: StageCheck | None = None  # an automatic rollout's stage: advances, waits, halts
    # devices that would take the target but wait, by why: a window, a deferral, the budget
    waiting: dict[str, int] = field(default_factory=dict)
    holding_back: list[str] = field(default_factory=list)  # deferring past the maximum


@dataclass
class FleetView:
    url: str
    now_s: float
    by: str
    silent_after_s: float
    devices: int
    silent: list[str]
    unreachable: list[str]  # devices whose last poll failed
    unreadable: list[str]
    models: list[ModelView]
    reports: list[DeviceReport] = field(default_factory=list)  # by device id


# -- reading -----------------------------------------------------------------------------------


def parse_report(key: str, modified_s: float, data: bytes) -> DeviceReport:
    """A report from its bytes; ValueError saying what is wrong when it is not one."""
    if len(data) > MAX_REPORT_BYTES:
        raise ValueError(f"{len(data)} bytes, more than the {MAX_REPORT_BYTES} a report may have")
    try:
        raw = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise ValueError("not UTF-8") from None
    except RecursionError:
        raise ValueError("not JSON: nested too deep") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("device"), str):
        raise ValueError("not a device report")
    if not rollout.DEVICE_ID.fullmatch(raw["device"]):
        raise ValueError("'device' is not a device id")
    models = raw.get("models") or {}
    labels = raw.get("labels") or {}
    if not isinstance(models, dict) or not isinstance(labels, dict):
        raise ValueError("'models' and 'labels' must be objects")
    if not all(isinstance(v, str) for v in labels.values()):
        raise ValueError("'labels' values must be strings")
    poll_ok = raw.get("last_poll_ok")
    frozen = raw.get("updates_frozen_since")
    return DeviceReport(
        device=raw["device"],
        labels={str(k): str(v) for k, v in labels.items()},
        modified_s=modified_s,
        models={str(k): _model_entry(str(k), v) for k, v in models.items()},
        last_poll_ok=poll_ok if isinstance(poll_ok, bool) else None,
        server_version=str(raw.get("server_version", "")),
        frozen_since=frozen if isinstance(frozen, str) else "",
    )


def _model_entry(model: str, entry: Any) -> dict[str, Any]:
    """One model of a report, checked for what the view reads of it (ValueError if wrong)."""
    if not isinstance(entry, dict):
        raise ValueError(f"'models.{model}' must be an object")
    serving = entry.get("serving") or []
    if not isinstance(serving, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in serving
    ):
        raise ValueError(f"'models.{model}.serving' must be a list of versions")
    for field_name in ("probation", "reason"):
        if not isinstance(entry.get(field_name, ""), str):
            raise ValueError(f"'models.{model}.{field_name}' must be a string")
    return entry


def gather(bucket: FleetBucket, only: str | None = None) -> Snapshot:
    """Read the reports, the rollout documents and the verdicts."""
    listed, now_s = bucket.listing(rollout.reports_prefix("").lstrip("/"))
    snapshot = Snapshot(bucket.url, now_s)

    def fetch(obj: Any) -> tuple[Any, bytes | None]:
        return obj, bucket.get(obj.key[len(bucket.prefix) :])

    reports = [o for o in listed if o.key.endswith(".json")]
    for obj in reports:
        if obj.size > MAX_REPORT_BYTES:  # not fetched at all
            snapshot.unreadable.append(
                f"{obj.key}: {obj.size} bytes, more than the {MAX_REPORT_BYTES} a report may have"
            )
    reports = [o for o in reports if o.size <= MAX_REPORT_BYTES]
    with ThreadPoolExecutor(max_workers=_READERS) as pool:
        for obj, data in pool.map(fetch, reports):
            if data is None:
                continue  # deleted since the listing
            try:
                snapshot.reports.append(parse_report(obj.key, obj.modified_s, data))
            except ValueError as exc:  # this device's report only: the rest is shown
                snapshot.unreadable.append(f"{obj.key}: malformed report: {exc}")
    models = {m for m in bucket.folders() if not m.startswith(".")}
    models |= {m for r in snapshot.reports for m in r.models}
    for model in sorted(models):
        if only is not None and model != only:
            continue
        try:
            current = control.read(bucket, model)
            snapshot.currents[model] = current
            snapshot.rollouts[model] = current.document
        except FleetError as exc:  # a malformed document: say so, show the rest
            snapshot.unreadable.append(str(exc))
            snapshot.rollouts[model] = None
        snapshot.verdicts[model] = read_verdicts(bucket, model)
    return snapshot


def read_verdicts(bucket: FleetBucket, model: str) -> dict[int, dict[str, str]]:
    """version -> device -> verdict, from one listing (a device with both keys: failed)."""
    base = f"{rollout.FLEET}/verdicts/{model}/"
    objects, _ = bucket.listing(base)
    found: dict[int, dict[str, str]] = defaultdict(dict)
    for obj in objects:
        version, _, _ = obj.key[len(bucket.key(base)) :].partition("/")
        if version_number(version) is None:  # '²' is isdigit() and no int()
            continue
        listed = rollout.verdict_prefix(bucket.prefix, model, int(version))
        parsed = rollout.parse_verdict_key(listed, obj.key)
        if parsed is not None:
            verdict, device = parsed
            devices = found[int(version)]
            if devices.get(device) != rollout.FAILED:
                devices[device] = verdict
    return dict(found)


# -- the view (pure) ---------------------------------------------------------------------------


def _waiting_kind(why: str) -> str:
    """A device's `waiting` words, as a kind: 'window closed', 'deferred', 'for a slot'."""
    if not why:
        return ""
    if "window" in why:
        return "in a closed window"
    if why.startswith("deferred"):
        return "deferred"
    if "probation slot" in why:
        return "for a probation slot"
    return "other"


def _served(entry: dict[str, Any]) -> list[int]:
    serving = entry.get("serving")
    if not isinstance(serving, list):  # found by fuzzing: a number here raised TypeError
        return []
    return [v for v in serving if isinstance(v, int) and not isinstance(v, bool)]


def summarize(snapshot: Snapshot, by: str = "", silent_after_s: float = 900.0) -> FleetView:
    def group(labels: dict[str, str] | None) -> str:
        if labels is None:
            return NO_REPORT
        return labels.get(by, NO_LABEL) if by else ALL

    silent = {r.device for r in snapshot.reports if snapshot.now_s - r.modified_s > silent_after_s}
    labels_of = {r.device: r.labels for r in snapshot.reports}
    views = []
    for model, document in sorted(snapshot.rollouts.items()):
        view = ModelView(model, document)
        rows: dict[tuple[str, int], Row] = {}

        def row(key: tuple[str, int], rows: dict[tuple[str, int], Row] = rows) -> Row:
            return rows.setdefault(key, Row(*key))

        for report in snapshot.reports:
            entry = report.models.get(model)
            if entry is None:
                continue
            served = _served(entry)
            for version in served:
                counted = row((group(report.labels), version))
                counted.devices += 1
                counted.silent += report.device in silent
                if entry.get("probation") == rollout.RUNNING and version == entry.get("target"):
                    counted.probation += 1
            if document is None:
                continue
            revision = entry.get("rollout_revision")
            if not isinstance(revision, int) or revision < document.revision:
                view.behind += 1
            kind = _waiting_kind(str(entry.get("waiting", "")))
            if kind and entry.get("target") == document.target:
                view.waiting[kind] = view.waiting.get(kind, 0) + 1
                if entry.get("holding_back") is True:
                    view.holding_back.append(report.device)
            if rollout.membership(document, report.device, report.labels):
                view.in_stage += 1
                view.in_stage_on_target += document.target in served
            else:
                view.outside_on_target += document.target in served
        for version, devices in snapshot.verdicts.get(model, {}).items():
            for device, verdict in devices.items():
                counted = row((group(labels_of.get(device)), version))
                if verdict == rollout.FAILED:
                    counted.failed += 1
                else:
                    counted.passed += 1
        if document is not None:
            target = snapshot.verdicts.get(model, {}).get(document.target, {})
            view.failed = sum(v == rollout.FAILED for v in target.values())
            view.passed = len(target) - view.failed
            current = snapshot.currents.get(model)
            if current is not None:
                view.check = control.stage_check(
                    current, rollout.VerdictCount(view.passed, view.failed)
                )
            if document.halted and document.reason.startswith("halted by the fleet"):
                view.halted_by = "fleet"
            elif document.halted:
                view.halted_by = "operator"
            elif rollout.halted(document, view.passed, view.failed):
                view.halted_by = "verdicts"
        view.rows = [rows[k] for k in sorted(rows)]
        views.append(view)
    return FleetView(
        url=snapshot.url,
        now_s=snapshot.now_s,
        by=by,
        silent_after_s=silent_after_s,
        devices=len(snapshot.reports),
        silent=sorted(silent),
        unreachable=sorted(r.device for r in snapshot.reports if r.last_poll_ok is False),
        unreadable=snapshot.unreadable,
        models=views,
        reports=sorted(snapshot.reports, key=lambda r: r.device),
    )


# -- printing ----------------------------------------------------------------------------------


def _table(header: list[str], rows: Iterable[list[str]]) -> list[str]:
    body = [header, *rows]
    widths = [max(len(r[i]) for r in body) for i in range(len(header))]
    return [
        "  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in body
    ]


def _names(devices: list[str], limit: int = 10) -> str:
    more = f" and {len(devices) - limit} more" if len(devices) > limit else ""
    return ", ".join(devices[:limit]) + more


def render(view: FleetView) -> str:
    lines = [
        f"fleet {view.url}: {view.devices} devices reporting, {len(view.silent)} silent for "
        f"over {view.silent_after_s:g} s, {len(view.unreachable)} whose last poll failed"
    ]
    if view.silent:
        lines.append(f"  silent: {_names(view.silent)}")
    if view.unreachable:
        lines.append(f"  last poll failed: {_names(view.unreachable)}")
    frozen = [f"{r.device} (since {r.frozen_since})" for r in view.reports if r.frozen_since]
    if frozen:
        lines.append(f"  updates frozen (TUF metadata expired): {_names(frozen)}")
    for what in view.unreadable:
        lines.append(f"  unreadable: {what}")
    for model in view.models:
        lines.append("")
        document = model.rollout
        if document is None:
            lines.append(f"model {model.model}: no rollout document (newest version wins)")
        else:
            lines.append(
                f"model {model.model}: rollout revision {document.revision}, version "
                f"{document.target} at {control.describe_stage(document)}, baseline "
                f"{document.baseline}"
            )
            total = model.passed + model.failed
            if model.halted_by == "fleet":
                lines.append(f"  HALTED by the automatic rollout: {document.reason}")
            elif model.halted_by == "operator":
                lines.append(f"  HALTED by an operator: {document.reason or '(no reason)'}")
            elif model.halted_by == "verdicts":
                rule = document.halt
                assert rule is not None
                lines.append(
                    f"  HALTED by the fleet: {model.failed} of {total} verdicts failed (the "
                    f"limit: over {rule.max_failed_share:.0%} with at least {rule.min_verdicts})"
                )
            if model.halted_by and document.halt is not None:
                back = "go back to" if document.halt.rollback else "keep it; none leave for"
                lines.append(
                    f"  devices on version {document.target} {back} version {document.baseline}"
                )
            lines.append(
                f"  version {document.target}: {model.in_stage} devices in the stage, "
                f"{model.in_stage_on_target} of them on it; {model.outside_on_target} outside "
                f"the stage on it; verdicts {model.passed} passed, {model.failed} failed; "
                f"{model.behind} devices behind revision {document.revision}"
            )
        if model.check is not None:
            check = model.check
            share = "-" if check.passed_share is None else f"{check.passed_share:.0%}"
            lines.append(
                f"  automatic: {check.action}: {check.why}; verdicts {check.verdicts}/"
                f"{check.min_verdicts}, passed {share} (at least {check.min_passed_share:.0%})"
            )
        if model.waiting:
            parts = ", ".join(f"{n} {kind}" for kind, n in sorted(model.waiting.items()))
            lines.append(f"  waiting to switch: {parts}")
        if model.holding_back:
            lines.append(f"  holding back (deferred too long): {_names(model.holding_back)}")
        lines += _table(
            [view.by or "group", "version", "devices", "probation", "passed", "failed", "silent"],
            (
                [
                    r.group,
                    str(r.version),
                    str(r.devices),
                    str(r.probation),
                    str(r.passed),
                    str(r.failed),
                    str(r.silent),
                ]
                for r in model.rows
            ),
        )
    return "\n".join(lines)


def render_devices(view: FleetView) -> str:
    """One line per device and model: what it serves, its probation and its own reason."""
    rows = []
    for report in view.reports:
        labels = ",".join(f"{k}={v}" for k, v in sorted(report.labels.items())) or "-"
        age = f"{max(0.0, view.now_s - report.modified_s):.0f}"
        poll = {True: "ok", False: "failed", None: "-"}[report.last_poll_ok]
        for model, entry in sorted(report.models.items()):
            serving = ",".join(str(v) for v in _served(entry)) or "-"
            probation, reason = str(entry.get("probation", "-")), str(entry.get("reason", ""))
            rows.append([report.device, labels, age, poll, model, serving, probation, reason])
    header = ["device", "labels", "age_s", "poll", "model", "serving", "probation", "reason"]
    return "\n".join(_table(header, rows))


def as_json(view: FleetView) -> dict[str, Any]:
    models = []
    for model in view.models:
        document = model.rollout
        models.append(
            {
                "model": model.model,
                "rollout": json.loads(document.to_json()) if document is not None else None,
                "halted_by": model.halted_by,
                "target_verdicts": {"passed": model.passed, "failed": model.failed},
                "in_stage": model.in_stage,
                "in_stage_on_target": model.in_stage_on_target,
                "outside_on_target": model.outside_on_target,
                "behind": model.behind,
                "rows": [vars(r) for r in model.rows],
                "stage_check": model.check.to_json() if model.check is not None else None,
                "waiting": model.waiting,
                "holding_back": model.holding_back,
            }
        )
    return {
        "url": view.url,
        "time": rollout.utc_text(view.now_s),
        "by": view.by,
        "silent_after_s": view.silent_after_s,
        "devices": view.devices,
        "silent": view.silent,
        "last_poll_failed": view.unreachable,
        "unreadable": view.unreadable,
        "models": models,
        "reports": [
            {
                "device": r.device,
                "labels": r.labels,
                "age_s": round(max(0.0, view.now_s - r.modified_s), 1),
                "silent": r.device in view.silent,
                "last_poll_ok": r.last_poll_ok,
                "updates_frozen_since": r.frozen_since or None,
                "server_version": r.server_version,
                "models": r.models,
            }
            for r in view.reports
        ],
    }
