"""The status service's pure parts: the live rings, the percentiles, the device readings from a
fake /proc, URLs without credentials, and the ring of recent problems."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from appliance.gpu_metrics import MEMORY_TOTAL, MEMORY_USED, UTILIZATION, GpuReading
from appliance.logs import RecentProblems
from appliance.services.results import InferStatistics, ModelStatistics, StatisticDuration
from appliance.services.status import DeviceReader, LiveStats, shown_url, weighted_percentile


def _stats(name: str, version: int, ok: int, ok_ms: float, failed: int = 0) -> ModelStatistics:
    zero = StatisticDuration()
    return ModelStatistics(
        name=name,
        version=version,
        last_inference_ms=0,
        inference_count=ok,
        execution_count=ok,
        inference_stats=InferStatistics(
            success=StatisticDuration(ok, int(ok * ok_ms * 1e6)),
            fail=StatisticDuration(failed, 0),
            queue=zero,
            compute_input=zero,
            compute_infer=zero,
            compute_output=zero,
            cache_hit=zero,
            cache_miss=zero,
        ),
        batch_stats=(),
    )


def test_the_first_snapshot_is_the_baseline() -> None:
    live = LiveStats()
    live.sample([_stats("m", 1, 100, 2.0)], 10.0)
    assert live.numbers("m", 2.0).points == ()
    live.sample([_stats("m", 1, 120, 2.0)], 12.0)
    point = live.numbers("m", 2.0).points[0]
    assert point.requests_per_s == 10.0  # 20 requests in 2 s
    assert point.errors_per_s == 0.0
    assert point.mean_ms == pytest.approx(2.0)


def test_rates_percentiles_and_error_rate_over_the_window() -> None:
    live = LiveStats()
    live.sample([_stats("m", 1, 0, 0)], 0.0)
    # 9 intervals at 1 ms with 10 requests each, one at 50 ms with 10 requests and 10 failures.
    total_ok, total_ns_ms, t = 0, 0.0, 0.0
    for i in range(10):
        t += 2.0
        total_ok += 10
        total_ns_ms += 10 * (50.0 if i == 9 else 1.0)
        failed = 10 if i == 9 else 0
        live.sample([_stats("m", 1, total_ok, total_ns_ms / total_ok, failed)], t)
    numbers = live.numbers("m", 2.0)
    assert len(numbers.points) == 10
    assert numbers.window_s == 20.0
    assert numbers.requests_per_s == 10.0  # the last interval: 10 ok + 10 failed in 2 s
    assert numbers.p50_ms == pytest.approx(1.0)
    assert numbers.p99_ms == pytest.approx(50.0)
    assert numbers.error_rate == pytest.approx(10 / 110)


def test_versions_add_up_and_a_new_version_counts_from_zero() -> None:
    live = LiveStats()
    live.sample([_stats("m", 1, 100, 1.0)], 0.0)
    live.sample([_stats("m", 1, 110, 1.0), _stats("m", 2, 6, 1.0)], 2.0)
    assert live.numbers("m", 2.0).points[-1].requests_per_s == 8.0  # (10 + 6) / 2 s
    # Version 1 left and came back with fresh counters: counted from zero, never negative.
    live.sample([_stats("m", 1, 4, 1.0), _stats("m", 2, 6, 1.0)], 4.0)
    assert live.numbers("m", 2.0).points[-1].requests_per_s == 2.0


def test_the_ring_is_bounded_and_unserved_models_leave_it() -> None:
    live = LiveStats(points=3)
    for i in range(10):
        live.sample([_stats("m", 1, i, 1.0), _stats("n", 1, i, 1.0)], float(i))
    assert len(live.numbers("m", 1.0).points) == 3
    live.sample([_stats("m", 1, 10, 1.0)], 10.0)
    assert live.numbers("n", 1.0).points == ()
    assert live.numbers("never", 1.0).p50_ms is None


def test_weighted_percentile() -> None:
    assert weighted_percentile([], 0.5) is None
    assert weighted_percentile([(5.0, 0)], 0.5) is None
    assert weighted_percentile([(1.0, 1), (9.0, 3)], 0.5) == 9.0
    assert weighted_percentile([(1.0, 99), (9.0, 1)], 0.99) == 1.0
    assert weighted_percentile([(1.0, 98), (9.0, 2)], 0.99) == 9.0


def test_device_readings_from_proc(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "meminfo").write_text("MemTotal: 1000 kB\nMemFree: 10 kB\nMemAvailable: 400 kB\n")
    (proc / "stat").write_text("cpu  100 0 100 700 100 0 0 0 0 0\ncpu0 1 2 3\n")
    reader = DeviceReader(tmp_path / "store" / "not-yet", root=tmp_path)
    first = reader.read()
    assert first.cpu_percent is None  # needs two readings
    assert first.memory_total_bytes == 1000 * 1024
    assert first.memory_available_bytes == 400 * 1024
    assert first.store_free_bytes is not None  # the nearest existing folder's file system
    assert first.gpus == ()
    (proc / "stat").write_text("cpu  150 0 150 750 150 0 0 0 0 0\n")
    assert reader.read().cpu_percent == 50.0  # 100 busy of 200


def test_device_readings_without_proc(tmp_path: Path) -> None:
    reading = DeviceReader(tmp_path, root=tmp_path / "none").read()
    assert reading.cpu_percent is None
    assert reading.memory_total_bytes is None
    assert reading.cpu_count >= 1


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("s3://bucket/models", "s3://bucket/models"),
        ("s3://key:secret@host:9000/bucket/m", "s3://host:9000/bucket/m"),
        ("s3://user@host/b", "s3://host/b"),
        ("/local/path", "/local/path"),
    ],
)
def test_urls_are_shown_without_credentials(url: str, shown: str) -> None:
    assert shown_url(url) == shown


def test_recent_problems_keep_the_newest_warnings_and_errors() -> None:
    ring = RecentProblems(capacity=2)
    logger = logging.getLogger("appliance.test_status")
    logger.propagate = False
    logger.addHandler(ring)
    logger.setLevel(logging.DEBUG)
    try:
        logger.info("not a problem")
        logger.warning("model '%s' version 1 failed: %s", "resnet", "bad\ntraceback")
        logger.error("disk full")
        logger.error("x" * 1000)
    finally:
        logger.removeHandler(ring)
        logger.propagate = True
    problems = ring.recent()
    assert [p.message[:9] for p in problems] == ["disk full", "x" * 9]
    assert len(problems[1].message) == 500
    assert problems[0].level == "ERROR"
    assert problems[0].model == ""
    ring = RecentProblems()
    record = logging.LogRecord(
        "appliance.x", logging.WARNING, __file__, 1, "model '%s': %s", ("resnet", "a\nb"), None
    )
    ring.handle(record)
    assert ring.recent()[0].model == "resnet"
    assert ring.recent()[0].message == "model 'resnet': a"


class _FakeGpu:
    def __init__(self, fail: bool = False) -> None:
        self.fail = fail

    def read(self) -> list[GpuReading]:
        if self.fail:
            raise RuntimeError("driver went away")
        return [
            GpuReading("GPU-1", {UTILIZATION: 0.5, MEMORY_TOTAL: 8e9, MEMORY_USED: 2e9}),
        ]


def test_gpu_readings_come_from_the_gpu_metrics_source(tmp_path: Path) -> None:
    (gpu,) = DeviceReader(tmp_path, gpu=_FakeGpu()).read().gpus
    assert (gpu.uuid, gpu.utilization, gpu.memory_total_bytes) == ("GPU-1", 0.5, 8e9)
    assert gpu.memory_used_bytes == 2e9
    assert gpu.power_watts is None  # the device does not report it
    assert DeviceReader(tmp_path, gpu=_FakeGpu(fail=True)).read().gpus == ()
