"""The nv_* counters' totals of a model version, carried across reloads (ModelStats.carry /
fold): tritonserver's metric reporter outlives a reload of the same version."""

from __future__ import annotations

from appliance.scheduling.stats import LatencyHistogram, ModelStats


def _served(requests: int) -> ModelStats:
    stats = ModelStats(latency=LatencyHistogram())
    for _ in range(requests):
        stats.record_success(2_000_000)
        stats.record_execution(1, 1, 10, 20, 30, (5,))
    stats.record_failure("BACKEND", 100)
    return stats


def test_a_reloaded_version_counts_on_from_the_one_it_replaced() -> None:
    first = _served(3)
    second = _served(2)
    second.carry(first)
    totals = second.metric_totals()
    assert (totals.success, totals.execution_count, totals.inference_count) == (5, 5, 5)
    assert totals.failures == {"BACKEND": 2}
    assert totals.ns["queue"] == 25
    assert sum(totals.latency_counts) == 5
    first.record_success(1)  # the replaced version drains: its late answers still count
    assert second.metric_totals().success == 6
    assert second.success.count == 2  # the statistics extension's own counts start again


def test_folding_keeps_the_totals_and_drops_the_replaced_statistics() -> None:
    first, second, third = _served(1), _served(1), _served(1)
    second.carry(first)
    second.fold()
    assert second.previous is None
    third.carry(second)
    third.fold()
    assert third.previous is None
    assert third.carried is not None
    assert third.metric_totals().success == 3  # a chain of reloads, folded as it goes
    assert third.metric_totals().failures == {"BACKEND": 3}
    assert ModelStats().metric_totals().success == 0
