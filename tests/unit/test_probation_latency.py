"""Probation on latency: a switched-in version whose median latency over its window exceeds the
ratio times the median of the versions served before the switch is rolled back."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import cast

import pytest

from appliance.common.model_config import ModelConfig
from appliance.common.settings import ServerSettings
from appliance.flags.serve import add_serve_flags, settings_from_args
from appliance.repository.rollout import ProbationRule
from appliance.runtime.probation import (
    LATENCY_FLOOR_MS,
    MIN_BASELINE_LATENCIES,
    RollbackGuard,
    median_ms,
    too_slow,
)
from appliance.runtime.registry import ModelRegistry, ServedVersion
from appliance.runtime.settings import RuntimeSettings
from appliance.scheduling.contract import ModelScheduler
from appliance.scheduling.stats import RECENT_LATENCIES, ModelStats

MS = 1_000_000  # ns


def _version(number: int) -> ServedVersion:
    return ServedVersion(
        "m", number, ModelConfig(), {}, {}, {}, cast(ModelScheduler, object()), ModelStats()
    )


class Switch:
    """Model m serving version 1 with the given latencies, then switched to version 2."""

    def __init__(
        self,
        baseline_ms: list[float],
        error_rate: float = 0.0,
        window: int = 4,
        latency_ratio: float = 2.0,
        rule: ProbationRule | None = None,
    ) -> None:
        self.registry = ModelRegistry()
        self.record = self.registry.add("m", Path("m"))
        self.old, self.new = _version(1), _version(2)
        for ms in baseline_ms:
            self.old.stats.record_success(round(ms * MS))
        self.retired: list[list[int]] = []
        self.counted: list[str] = []
        self.verdicts: list[tuple[int, str]] = []
        self.guard = RollbackGuard(
            self.registry,
            error_rate,
            window,
            lambda versions: self.retired.append([s.version for s in versions]),
            lambda name, result: self.counted.append(result),
            lambda name, version, why: self.verdicts.append((version, why)),
            lambda name, version: rule,
            latency_ratio,
        )
        self.record.versions = {2: self.new}
        held = self.guard.watch("m", {1: self.old}, {2: self.new}, {2: self.new})
        assert held == []  # version 1 stays loaded during the probation

    def serve(self, *latencies_ms: float) -> None:
        for ms in latencies_ms:
            self.new.stats.record_success(round(ms * MS))

    @property
    def why(self) -> str:
        assert len(self.verdicts) == 1, self.verdicts
        version, why = self.verdicts[0]
        assert version == 2
        return why


def test_median_and_the_comparison_in_numbers() -> None:
    assert median_ms([]) is None
    assert median_ms([3 * MS, 1 * MS, 2 * MS]) == 2.0
    assert median_ms([1 * MS, 2 * MS, 3 * MS, 100 * MS]) == 2.5  # the middle two
    assert too_slow(4.01, 2.0, 2.0)
    assert not too_slow(4.0, 2.0, 2.0)  # exactly the ratio passes
    # Below the floor a latency counts as the floor: 0.1 -> 0.5 ms is jitter, 0.1 -> 2.5 is not.
    assert LATENCY_FLOOR_MS == 1.0
    assert not too_slow(0.5, 0.1, 2.0)
    assert too_slow(2.5, 0.1, 2.0)


def test_a_target_over_the_ratio_is_rolled_back_and_names_its_latency() -> None:
    switch = Switch([2.0] * 10)  # baseline median 2 ms; the ratio 2 allows 4 ms
    switch.serve(5.0, 5.0, 4.0, 6.0)  # median 5 ms
    assert switch.why == (
        "rolled back: its median latency over its first 4 requests was 5 ms, 2.5 times the "
        "2 ms of version 1 before the switch (--model-rollback-latency-ratio 2)"
    )
    assert switch.record.versions == {1: switch.old}  # version 1 serves again, at once
    assert switch.record.failed[2] == switch.why
    assert switch.retired == [[2]]
    assert switch.counted == ["rollback"]
    assert switch.guard.on_probation("m") is None
    assert switch.new.stats.watcher is None


def test_a_target_within_the_ratio_passes_and_the_replaced_version_retires() -> None:
    switch = Switch([2.0] * 10)
    switch.serve(3.9, 3.9, 3.9, 3.9)
    assert switch.why == ""
    assert switch.record.versions == {2: switch.new}
    assert switch.retired == [[1]]


def test_the_median_ignores_a_few_slow_requests_in_the_window() -> None:
    switch = Switch([10.0] * 10)
    switch.serve(10.0, 1000.0, 10.0, 10.0)  # one slow first request: p90 would fail it
    assert switch.why == ""


def test_the_window_is_judged_only_when_it_ends() -> None:
    switch = Switch([1.0] * 10, window=4)
    switch.serve(50.0, 50.0, 50.0)
    assert switch.verdicts == []
    assert switch.guard.on_probation("m") == 2
    switch.serve(50.0)
    assert "median latency over its first 4 requests was 50 ms" in switch.why


def test_the_baseline_is_the_replaced_versions_recent_latencies() -> None:
    # Version 1 was slow long ago and fast lately: only its last 512 successes count.
    switch = Switch([100.0] * 1000 + [2.0] * RECENT_LATENCIES)
    switch.serve(*[5.0] * 4)
    assert "2.5 times the 2 ms of version 1" in switch.why


def test_too_few_baseline_latencies_leave_latency_unjudged() -> None:
    switch = Switch([1.0] * (MIN_BASELINE_LATENCIES - 1))
    switch.serve(*[500.0] * 4)
    assert switch.why == ""
    enough = Switch([1.0] * MIN_BASELINE_LATENCIES)
    enough.serve(*[500.0] * 4)
    assert "500 times" in enough.why


def test_latency_alone_does_not_judge_errors() -> None:
    switch = Switch([2.0] * 10, error_rate=0.0, latency_ratio=2.0)
    switch.new.stats.record_failure("BACKEND", MS)
    switch.new.stats.record_failure("BACKEND", MS)
    switch.serve(2.0, 2.0)
    assert switch.why == ""  # 2 of 4 failed: with the error-rate flag off that is not judged


def test_errors_still_roll_back_before_the_window_ends() -> None:
    switch = Switch([2.0] * 10, error_rate=0.25, latency_ratio=2.0)
    switch.new.stats.record_failure("BACKEND", MS)
    switch.new.stats.record_failure("BACKEND", MS)
    assert switch.why.startswith("rolled back: 2 of its first 2 requests failed")


def test_both_flags_off_is_no_probation() -> None:
    registry = ModelRegistry()
    registry.add("m", Path("m"))
    old, new = _version(1), _version(2)
    guard = RollbackGuard(registry, 0.0, 4, lambda v: None, lambda n, r: None)
    assert guard.watch("m", {1: old}, {2: new}, {2: new}) == [old]
    assert guard.on_probation("m") is None


def test_a_rollouts_rule_sets_the_ratio_and_names_itself() -> None:
    rule = ProbationRule(window_requests=4, max_error_rate=0.5, max_latency_ratio=3.0)
    switch = Switch([2.0] * 10, latency_ratio=0.0, rule=rule)  # the device's flag is off
    switch.serve(*[6.5] * 4)
    assert switch.why.endswith("(the rollout's probation.max_latency_ratio 3)")
    assert "3.25 times the 2 ms" in switch.why


def test_a_rollouts_rule_without_a_ratio_replaces_the_flags() -> None:
    rule = ProbationRule(window_requests=4, max_error_rate=0.5)
    switch = Switch([2.0] * 10, latency_ratio=2.0, rule=rule)
    switch.serve(*[100.0] * 4)
    assert switch.why == ""


@pytest.mark.parametrize(("count", "expected"), [(0, []), (3, [3, 2, 1]), (600, None)])
def test_recent_latencies_read_the_ring_newest_first(count: int, expected: list[int]) -> None:
    stats = ModelStats()
    for ns in range(1, count + 1):
        stats.record_success(ns)
    got = stats.recent_latencies_ns()
    if expected is None:
        assert got == list(range(count, count - RECENT_LATENCIES, -1))
    else:
        assert got == expected
    assert stats.recent_latencies_ns(2) == expected[:2] if expected is not None else got[:2]


def _settings(*flags: str) -> ServerSettings:
    parser = argparse.ArgumentParser()
    add_serve_flags(parser)
    return settings_from_args(parser.parse_args(["--model-repository", "models", *flags]))


def test_the_latency_flag_reaches_the_runtime() -> None:
    assert _settings().rollback_latency_ratio == 0.0  # off by default
    settings = _settings("--model-rollback-latency-ratio=2.5")
    assert settings.rollback_latency_ratio == 2.5
    assert RuntimeSettings.from_server(settings).rollback_latency_ratio == 2.5


@pytest.mark.parametrize("value", ["0.5", "-1", "nan", "inf"])
def test_a_latency_ratio_below_one_stops_the_start(value: str) -> None:
    with pytest.raises(SystemExit, match=r"--model-rollback-latency-ratio must be 0 \(off\) or at"):
        _settings(f"--model-rollback-latency-ratio={value}")
