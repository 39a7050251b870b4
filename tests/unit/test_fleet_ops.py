"""The operator CLI's pure parts (appliance/fleet/): stage flags, the baseline a publish picks,
and `fleet status`'s table from plain reports, verdicts and documents."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from appliance.fleet import ops, publish, view
from appliance.fleet.bucket import FleetError
from appliance.repository import rollout
from appliance.repository.rollout import HaltRule, RolloutDocument, Stage


def plan(**fields: object) -> publish.Plan:
    base: dict[str, object] = {
        "model": "m",
        "version": 3,
        "folder": Path("."),
        "stages": ("10", "100"),
        "start": False,
    }
    return publish.Plan(**{**base, **fields})  # type: ignore[arg-type]


def doc(**fields: object) -> RolloutDocument:
    base: dict[str, object] = {
        "model": "m",
        "revision": 4,
        "target": 2,
        "baseline": 1,
        "stages": (Stage(percent=10), Stage(percent=100)),
        "stage": 1,
        "halt": HaltRule(0.2, 2, True),
    }
    return RolloutDocument(**{**base, **fields})  # type: ignore[arg-type]


def test_stage_flags_keep_their_order_and_parse_percent_and_labels() -> None:
    args = ops.parser(argparse.ArgumentParser()).parse_args(
        ["publish", "s3://b/p", "m", "d", "--version", "3",
         "--stage-labels", "site=berlin|munich,hw=orin", "--stages", "10,100"]
    )  # fmt: skip
    assert args.stage_specs == ["site=berlin|munich,hw=orin", "10", "100"]
    assert publish.stage_json("10") == {"percent": 10.0}
    assert publish.stage_json("site=berlin|munich,hw=orin") == {
        "labels": {"site": ["berlin", "munich"], "hw": "orin"}
    }
    with pytest.raises(FleetError, match="neither a percentage nor key=value labels"):
        publish.stage_json("ten")


def test_a_document_from_flags_is_checked_by_the_devices_own_rules() -> None:
    built = publish.document_for(plan(stages=("1", "site=berlin", "100")), 1, 2, -1)
    assert [s.to_json() for s in built.stages] == [
        {"percent": 1},
        {"labels": {"site": "berlin"}},
        {"percent": 100},
    ]
    assert built.probation == rollout.ProbationRule(50, 0.05)
    judged = publish.document_for(plan(probation=(20, 0.1, 1.5)), 1, 2, -1)
    assert judged.probation == rollout.ProbationRule(20, 0.1, 1.5)
    with pytest.raises(FleetError, match="max_latency_ratio' must be at least 1"):
        publish.document_for(plan(probation=(20, 0.1, 0.5)), 1, 2, -1)
    with pytest.raises(FleetError, match=r"stages\[0\].percent' must be between 0 and 100"):
        publish.document_for(plan(stages=("150",)), 1, 2, -1)
    with pytest.raises(FleetError, match="'target' and 'baseline' are both version 3"):
        publish.document_for(plan(), 1, 3, -1)


@pytest.mark.parametrize(
    ("current", "versions", "baseline", "why"),
    [
        (doc(), {1, 2}, 2, "version 2's rollout completed"),
        (doc(stage=0), {1, 2}, 1, "not completed, so its baseline stays"),
        (doc(halted=True), {1, 2}, 1, "halted, so its baseline stays"),
        (doc(target=3, baseline=2), {2, 3}, 2, "the current document's baseline"),
        (None, {1, 5, 3}, 5, "the highest version in the bucket"),
        (None, {3}, None, ""),
    ],
)
def test_the_baseline_a_publish_picks(
    current: RolloutDocument | None, versions: set[int], baseline: int | None, why: str
) -> None:
    got, reason = publish.choose_baseline(plan(), current, versions)
    assert got == baseline
    assert why in reason


def test_a_rollout_the_verdicts_halted_at_its_last_stage_never_becomes_the_baseline() -> None:
    failed = rollout.VerdictCount(passed=1, failed=2)
    got, why = publish.choose_baseline(plan(), doc(), {1, 2}, failed)
    assert (got, why) == (1, "version 2's rollout was halted, so its baseline stays")
    fine = rollout.VerdictCount(passed=9, failed=1)  # under the halt rule's limit
    assert publish.choose_baseline(plan(), doc(), {1, 2}, fine)[0] == 2


def test_an_explicit_baseline_must_exist() -> None:
    assert publish.choose_baseline(plan(baseline=1), doc(), {1, 2})[0] == 1
    with pytest.raises(FleetError, match="--baseline 7: no such version in the bucket"):
        publish.choose_baseline(plan(baseline=7), doc(), {1, 2})


def report(
    device: str, serving: list[int], modified_s: float, **entry: object
) -> view.DeviceReport:
    labels = {"site": "berlin"} if device.startswith("b") else {}
    return view.DeviceReport(
        device, labels, modified_s, {"m": {"serving": serving, "rollout_revision": 4, **entry}}
    )


def test_status_rows_count_devices_probation_verdicts_and_silence_per_label() -> None:
    now = 10_000.0
    snapshot = view.Snapshot(
        "s3://b/p",
        now,
        reports=[
            report("b1", [2], now - 10, probation="running", target=2),
            report("b2", [1], now - 5000),  # silent
            report("x1", [2], now - 10, rollout_revision=3),  # behind, no site label
        ],
        rollouts={"m": doc()},
        verdicts={"m": {2: {"b1": "passed", "gone": "failed", "x1": "failed"}}},
    )
    fleet = view.summarize(snapshot, by="site", silent_after_s=900)
    assert fleet.silent == ["b2"]
    (model,) = fleet.models
    rows = {(r.group, r.version): (r.devices, r.probation, r.passed, r.failed, r.silent)
            for r in model.rows}  # fmt: skip
    assert rows == {
        ("berlin", 1): (1, 0, 0, 0, 1),
        ("berlin", 2): (1, 1, 1, 0, 0),
        (view.NO_LABEL, 2): (1, 0, 0, 1, 0),
        (view.NO_REPORT, 2): (0, 0, 0, 1, 0),  # a verdict from a device without a report
    }
    assert (model.passed, model.failed, model.halted_by) == (1, 2, "verdicts")
    assert (model.in_stage, model.in_stage_on_target, model.behind) == (3, 2, 1)
    text = view.render(fleet)
    assert "HALTED by the fleet: 2 of 3 verdicts failed" in text
    assert "  silent: b2" in text
    as_json = view.as_json(fleet)
    assert as_json["models"][0]["rollout"]["target"] == 2
    assert as_json["models"][0]["halted_by"] == "verdicts"
    assert [(r["device"], r["silent"], r["age_s"]) for r in as_json["reports"]] == [
        ("b1", False, 10.0),
        ("b2", True, 5000.0),
        ("x1", False, 10.0),
    ]
    lines = view.render_devices(fleet).splitlines()
    assert lines[0].split() == [
        "device", "labels", "age_s", "poll", "model", "serving", "probation", "reason"
    ]  # fmt: skip
    assert lines[1].split() == ["b1", "site=berlin", "10", "-", "m", "2", "running"]
    assert lines[3].split()[:6] == ["x1", "-", "10", "-", "m", "2"]


def test_an_operator_halt_and_a_model_without_a_document() -> None:
    snapshot = view.Snapshot(
        "s3://b/p",
        100.0,
        reports=[report("b1", [1], 99.0)],
        rollouts={"m": doc(halted=True, reason="p99 up"), "other": None},
    )
    fleet = view.summarize(snapshot)
    halted, plain = fleet.models
    assert halted.halted_by == "operator"
    assert plain.rollout is None
    text = view.render(fleet)
    assert "HALTED by an operator: p99 up" in text
    assert "model other: no rollout document (newest version wins)" in text


def test_a_report_that_is_not_one_is_refused() -> None:
    with pytest.raises(ValueError, match="not a device report"):
        view.parse_report("k", 0.0, b'{"models": {}}')
    parsed = view.parse_report("k", 1.0, b'{"device": "d", "models": {"m": {"serving": [1]}}}')
    assert parsed.models == {"m": {"serving": [1]}}
    assert parsed.last_poll_ok is None


def test_a_frozen_device_is_named_by_fleet_status() -> None:
    identity = rollout.DeviceIdentity("dev-07", {})
    body = rollout.report_body(identity, 2_000.0, "0.1.0", 1_990.0, False, {}, 1_000.0)
    parsed = view.parse_report(".fleet/devices/dev-07.json", 2_000.0, body)
    assert parsed.frozen_since == "1970-01-01T00:16:40Z"
    fleet = view.summarize(view.Snapshot("s3://b/p", 2_010.0, reports=[parsed], rollouts={}))
    text = view.render(fleet)
    assert "updates frozen (TUF metadata expired): dev-07 (since 1970-01-01T00:16:40Z)" in text
    assert view.as_json(fleet)["reports"][0]["updates_frozen_since"] == "1970-01-01T00:16:40Z"
    calm = rollout.report_body(identity, 2_000.0, "0.1.0", 1_990.0, True, {})
    assert view.parse_report(".fleet/devices/dev-07.json", 2_000.0, calm).frozen_since == ""
