"""The latency summaries of --metrics-config summary_latencies=true: quantiles over the last
60 s of observations (weighted by the requests of an execution), count and sum since start,
and a fixed number of observations kept."""

from __future__ import annotations

import math

from appliance.flags.values import parse_quantiles
from appliance.scheduling.stats import (
    SUMMARY_SAMPLES,
    SUMMARY_WINDOW_NS,
    LatencySummaries,
    LatencySummary,
    ModelStats,
)


def test_quantiles_of_the_observations() -> None:
    summary = LatencySummary()
    for us in range(1, 101):
        summary.observe(us * 1000, 1, now_ns=0)
    assert summary.quantiles([0.5, 0.9, 0.99, 1.0], now_ns=0) == [50.0, 90.0, 99.0, 100.0]
    assert summary.count == 100
    assert summary.sum_us == 5050.0


def test_an_execution_of_several_requests_weighs_as_many() -> None:
    summary = LatencySummary()
    summary.observe(1000, 9, now_ns=0)  # nine requests of 1 us
    summary.observe(50_000, 1, now_ns=0)
    assert summary.quantiles([0.5, 0.9, 0.95], now_ns=0) == [1.0, 1.0, 50.0]
    assert summary.count == 10


def test_the_window_forgets_old_observations_but_not_the_totals() -> None:
    summary = LatencySummary()
    summary.observe(5_000_000, 1, now_ns=0)
    summary.observe(1000, 1, now_ns=SUMMARY_WINDOW_NS // 2)
    later = SUMMARY_WINDOW_NS + 1
    assert summary.quantiles([0.99], now_ns=later) == [1.0]
    assert summary.count == 2
    gone = summary.quantiles([0.5], now_ns=later + SUMMARY_WINDOW_NS)
    assert math.isnan(gone[0])
    assert summary.count == 2


def test_memory_is_bounded() -> None:
    summary = LatencySummary()
    for i in range(SUMMARY_SAMPLES * 3):
        summary.observe(i, 1, now_ns=0)
    assert len(summary.samples) == SUMMARY_SAMPLES


def test_model_stats_feed_the_summaries() -> None:
    stats = ModelStats(summaries=LatencySummaries())
    stats.record_success(2000)
    stats.record_execution(4, 4, 100, 3000, 100, (500, 700))  # two requests succeeded
    by_name = stats.summaries.by_name if stats.summaries else {}
    assert by_name["request"].count == 1
    assert by_name["queue"].count == 2  # each request that succeeded, with its own wait
    assert by_name["compute_infer"].count == 2  # each request of the execution
    assert ModelStats().summaries is None  # off unless asked


def test_summary_quantiles_are_read_as_tritonserver_writes_them() -> None:
    assert parse_quantiles("0.5:0.05,0.9:0.01") == ((0.5, 0.05), (0.9, 0.01))
    assert parse_quantiles("") == ()
