"""A rollout that runs itself, the pure decisions: the advance rule, windows, the disruption
budget's slots, the progress object and the document's new fields."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from appliance.repository.rollout import RolloutDocument, RolloutError, effective
from appliance.repository.rollout_policy import (
    ADVANCE,
    DONE,
    HALT,
    WAIT,
    BudgetRule,
    PolicyError,
    Progress,
    Span,
    StageRule,
    Step,
    check_stage,
    free_slot,
    open_at,
    window_for,
)


def _where(what: str) -> str:
    return f"rollout.json field '{what}'"


def _document(**changes: Any) -> RolloutDocument:
    raw: dict[str, Any] = {
        "format": 1,
        "model": "m",
        "revision": 3,
        "target": 2,
        "baseline": 1,
        "stages": [
            {"percent": 10, "soak_s": 60, "min_verdicts": 2, "min_passed_share": 0.9},
            {"percent": 50, "min_verdicts": 4},
            {"percent": 100},
        ],
        "stage": 0,
        "advance": "auto",
        "probation": {"window_requests": 4, "max_error_rate": 0.25},
        "halt": {"max_failed_share": 0.5, "min_verdicts": 3},
    }
    raw.update(changes)
    return RolloutDocument.parse(json.dumps(raw).encode())


def _local(weekday: int, hour: int, minute: int) -> time.struct_time:
    # 2026-11-30 is a Monday.
    return time.struct_time((2026, 11, 30 + weekday, hour, minute, 0, weekday, 334, 0))


# -- the advance rule -------------------------------------------------------------------------


RULE = StageRule(soak_s=60, min_verdicts=2, min_passed_share=0.9)


def test_a_stage_waits_for_its_soak_time_and_its_verdicts_then_advances() -> None:
    waits = check_stage(0, 3, RULE, 1, 0, 20, False, False)
    assert waits.action == WAIT
    assert waits.why == "waiting: soak 40 s left of 60 s, verdicts 1/2"
    assert (waits.soak_left_s, waits.verdicts, waits.min_verdicts) == (40, 1, 2)
    soaked = check_stage(0, 3, RULE, 1, 0, 61, False, False)
    assert (soaked.action, soaked.why) == (WAIT, "waiting: verdicts 1/2")
    counted = check_stage(0, 3, RULE, 2, 0, 30, False, False)
    assert (counted.action, counted.why) == (WAIT, "waiting: soak 30 s left of 60 s")
    passes = check_stage(0, 3, RULE, 2, 0, 61, False, False)
    assert passes.action == ADVANCE
    assert passes.passed_share == 1.0


def test_a_stage_under_its_success_threshold_halts_once_it_has_its_verdicts() -> None:
    assert check_stage(0, 3, RULE, 0, 1, 100, False, False).action == WAIT  # 1 of 2 verdicts
    failing = check_stage(0, 3, RULE, 9, 2, 5, False, False)  # 9/11 = 0.82 < 0.9, soak or not
    assert failing.action == HALT
    assert "9 of 11 verdicts passed, under the stage's min_passed_share 0.9" in failing.why


def test_the_halt_rule_halts_a_halted_rollout_is_done_and_the_last_stage_does_not_move() -> None:
    assert check_stage(0, 3, RULE, 0, 3, 0, False, True).action == HALT
    assert check_stage(0, 3, RULE, 0, 3, 0, True, True).action == DONE
    assert check_stage(2, 3, RULE, 5, 0, 999, False, False).action == DONE
    assert check_stage(-1, 3, RULE, 0, 0, 999, False, False).action == WAIT


def test_stage_rules_and_policies_round_trip_through_the_document() -> None:
    document = _document(
        windows=[
            {
                "labels": {"site": "berlin"},
                "download": "01:00-05:00",
                "switch": ["Mon-Fri 02:00-04:00"],
            },
            {"switch": "00:00-24:00"},
        ],
        budget={"max_devices": 1, "group_by": "site", "lease_s": 600},
        defer={"max_s": 3600},
        shadow={"share": 0.1, "requests": 30, "max_abs_diff": 0.001, "min_top1_agreement": 0.99},
    )
    again = RolloutDocument.parse(document.to_json())
    assert again == document
    assert document.stages[0].advance_rule == RULE
    assert document.stages[2].advance_rule == StageRule()  # the defaults
    assert document.budget == BudgetRule(1, "site", 600)
    assert document.shadow is not None
    assert document.shadow.share == 0.1
    berlin = window_for(document.windows, {"site": "berlin"})
    assert berlin is not None
    assert [s.text for s in berlin.switch] == ["Mon-Fri 02:00-04:00"]
    other = window_for(document.windows, {"site": "munich"})
    assert other is not None
    assert not other.download


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"advance": "sometimes"}, 'field \'advance\' must be "manual" or "auto"'),
        (
            {"stages": [{"percent": 10, "soak": 5}]},
            'stages[0]\' must be {"percent": N} or {"labels": {...}} (with soak_s, ',
        ),
        (
            {"stages": [{"percent": 10, "min_verdicts": 0}]},
            "stages[0].min_verdicts' must be at least 1",
        ),
        ({"windows": [{"switch": "2:00-4:00"}]}, 'windows[0].switch[0]\': "2:00-4:00" is not'),
        ({"windows": [{"switch": "04:00-04:00"}]}, "is empty (use 00:00-24:00)"),
        ({"windows": [{"switch": "Mon-Fry 04:00-05:00"}]}, "is not '[DAYS ]HH:MM-HH:MM'"),
        ({"windows": [{"when": "04:00-05:00"}]}, "windows[0]' has unknown key(s) 'when'"),
        ({"budget": {"max_devices": 0}}, "budget.max_devices' must be at least 1"),
        ({"budget": {"percent": 5}}, "budget' has unknown key(s) 'percent'"),
        ({"budget": {"group_by": "site"}}, "budget' lacks 'max_devices' or 'max_percent'"),
        ({"budget": {"max_percent": 0}}, "budget.max_percent' must be above 0, at most 100"),
        ({"shadow": {"share": 0}}, "shadow.share' must be above 0"),
        ({"shadow": {"share": 1.5}}, "shadow.share' must be between 0 and 1"),
        ({"defer": {}}, "defer' lacks 'max_s'"),
    ],
)
def test_a_bad_policy_field_is_refused_by_name(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(RolloutError) as caught:
        _document(**changes)
    assert message in str(caught.value)


# -- windows ----------------------------------------------------------------------------------


def test_a_window_holds_in_its_span_and_one_past_midnight_belongs_to_its_start_day() -> None:
    day = Span.parse("02:00-04:00", "w", _where)
    assert open_at((day,), _local(0, 2, 0))
    assert open_at((day,), _local(0, 3, 59))
    assert not open_at((day,), _local(0, 4, 0))
    assert not open_at((day,), _local(0, 1, 59))
    night = Span.parse("Mon-Fri 22:00-04:00", "w", _where)
    assert open_at((night,), _local(0, 23, 0))  # Monday night
    assert open_at((night,), _local(1, 3, 0))  # Tuesday early: Monday's window
    assert open_at((night,), _local(5, 1, 0))  # Saturday early: Friday's window
    assert not open_at((night,), _local(5, 23, 0))  # Saturday night: none
    assert not open_at((night,), _local(0, 3, 0))  # Monday early: Sunday had none
    weekend = Span.parse("Sat,Sun 00:00-24:00", "w", _where)
    assert open_at((weekend,), _local(6, 12, 0))
    assert not open_at((weekend,), _local(4, 12, 0))
    assert open_at((), _local(3, 12, 0))  # no spans: always open
    wrap = Span.parse("Sat-Mon 10:00-11:00", "w", _where)
    assert wrap.days == frozenset({5, 6, 0})


def test_a_malformed_window_is_a_policy_error() -> None:
    for text in ("25:00-26:00", "10:60-11:00", "24:30-01:00", "10:00", 7):
        with pytest.raises(PolicyError):
            Span.parse(text, "w", _where)


# -- the disruption budget --------------------------------------------------------------------


def test_a_free_slot_is_the_lowest_untaken_else_a_stale_one_else_none() -> None:
    rule = BudgetRule(max_devices=2, lease_s=100)
    assert free_slot(rule, {}, 1000) == (0, False)
    assert free_slot(rule, {0: 990}, 1000) == (1, False)
    assert free_slot(rule, {0: 990, 1: 995}, 1000) is None  # used up: at most 2 at once
    assert free_slot(rule, {0: 850, 1: 995}, 1000) == (0, True)  # its holder's lease ran out
    assert free_slot(rule, {0: 990, 1: 995, 5: 0}, 1000) is None  # beyond max_devices: ignored
    percent = BudgetRule(max_percent=25, lease_s=100)
    assert [percent.slots(n) for n in (0, 1, 4, 7, 8, 100)] == [1, 1, 1, 1, 2, 25]
    assert free_slot(percent, {0: 990}, 1000, members=4) is None  # 25% of 4: one at a time
    assert free_slot(percent, {0: 990}, 1000, members=8) == (1, False)
    both = BudgetRule(max_devices=3, max_percent=50)
    assert (both.slots(2), both.slots(100)) == (1, 3)  # the lower of the two
    assert BudgetRule(1, "site").group({"site": "berlin"}) == "site=berlin"
    assert BudgetRule(1, "site").group({}) == "site=-"
    assert BudgetRule(1).group({"site": "berlin"}) == "all"


# -- progress ---------------------------------------------------------------------------------


def test_progress_moves_the_stage_of_its_revision_only_and_never_back() -> None:
    document = _document()
    progress = Progress("m", 3, 2, 1, history=(Step(1, "t", "dev-1", 2, 0),))
    again = Progress.parse(progress.to_json(), "m")
    assert again == progress
    assert effective(document, progress).stage == 1
    assert effective(document, Progress("m", 2, 2, 2)).stage == 0  # an older revision's
    assert effective(document, Progress("m", 3, 5, 2)).stage == 0  # another target's
    assert effective(document, Progress("m", 3, 2, 9)).stage == 2  # capped at the last stage
    assert effective(_document(stage=2), progress).stage == 2  # never lower than the document
    assert effective(_document(advance="manual"), progress).stage == 0  # manual: ignored
    stopped = effective(
        document, Progress("m", 3, 2, 0, halted=True, reason="halted by the fleet: x")
    )
    assert stopped.halted
    assert stopped.reason == "halted by the fleet: x"
    with pytest.raises(PolicyError, match="not a format 1 progress of model 'm'"):
        Progress.parse(Progress("n", 3, 2, 1).to_json(), "m")
    with pytest.raises(PolicyError, match="not UTF-8 JSON"):
        Progress.parse(b"\xff", "m")
