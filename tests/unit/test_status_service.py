"""The status service's pure parts: the live rings and their percentiles (from real ModelStats
counters), switches and the ledger's record, the device readings from a fake /proc, URLs
without credentials, and the ring of recent problems."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from appliance.common.model_config import ModelConfig
from appliance.common.protocol import model_config_pb2 as mc
from appliance.ops.gpu import MEMORY_TOTAL, MEMORY_USED, UTILIZATION, GpuReading
from appliance.ops.logs import RecentProblems
from appliance.repository.ledger import PROBATION, Failure, LedgerEntry
from appliance.runtime.placement import where_instances_run
from appliance.scheduling.stats import RECENT_LATENCIES, ModelStats
from appliance.services.status import (
    DeviceReader,
    LiveStats,
    shown_url,
    update_status,
    weighted_percentile,
)
from appliance.services.status_results import SwitchStatus
from appliance.services.status_samples import SwitchLog
from edge_backends.api import Placement


@dataclass
class Version:
    """A served version's counters, as the runtime's ServedVersion carries them."""

    name: str
    version: int
    stats: ModelStats = field(default_factory=ModelStats)

    def serve(self, ok: int, ok_ms: float, failed: int = 0) -> Version:
        for _ in range(ok):
            self.stats.record_success(int(ok_ms * 1e6))
        for _ in range(failed):
            self.stats.record_failure("BACKEND", 0)
        return self


def test_the_first_snapshot_is_the_baseline() -> None:
    live = LiveStats()
    m = Version("m", 1).serve(100, 2.0)
    live.sample([m], 10.0)
    assert live.numbers("m", 2.0).points == ()
    live.sample([m.serve(20, 2.0)], 12.0)
    point = live.numbers("m", 2.0).points[0]
    assert point.requests_per_s == 10.0  # 20 requests in 2 s
    assert point.errors_per_s == 0.0
    assert point.mean_ms == pytest.approx(2.0)


def test_rates_percentiles_and_error_rate_over_the_window() -> None:
    live = LiveStats()
    m = Version("m", 1)
    live.sample([m], 0.0)
    # 9 intervals with 10 requests at 1 ms each; the last with 10 at 50 ms and 10 failures.
    for i in range(10):
        live.sample([m.serve(10, 50.0 if i == 9 else 1.0, 10 if i == 9 else 0)], 2.0 * (i + 1))
    numbers = live.numbers("m", 2.0)
    assert len(numbers.points) == 10
    assert numbers.window_s == 20.0
    assert numbers.requests_per_s == 10.0  # the last interval: 10 ok + 10 failed in 2 s
    assert numbers.p50_ms == pytest.approx(1.0, rel=0.025)  # a bucket's middle: within 2.2 %
    assert numbers.p99_ms == pytest.approx(50.0, rel=0.025)
    assert numbers.error_rate == pytest.approx(10 / 110)


def test_percentiles_are_of_requests_not_of_interval_means() -> None:
    """One interval: 98 requests at 1 ms and 2 at 100 ms. Its mean (2.98 ms) is no request's
    latency; p50 is 1 ms and p99 100 ms, as the requests' own latencies say."""
    live = LiveStats()
    m = Version("m", 1)
    live.sample([m], 0.0)
    m.serve(49, 1.0).serve(1, 100.0).serve(49, 1.0).serve(1, 100.0)
    live.sample([m], 2.0)
    numbers = live.numbers("m", 2.0)
    assert numbers.points[0].mean_ms == pytest.approx(2.98)
    assert numbers.p50_ms == pytest.approx(1.0, rel=0.025)
    assert numbers.p99_ms == pytest.approx(100.0, rel=0.025)


def test_a_busy_interval_is_weighted_by_its_count_not_by_the_ring() -> None:
    """3000 requests at 1 ms in one interval (the ring keeps the last 512 of them), then 20 at
    10 ms: 0.66 % of the requests, so p99 is 1 ms (counting the ring's 512 alone, 10 ms would
    be 3.8 % and p99). 20 more at 10 ms make 1.3 %: p99 is 10 ms."""
    assert RECENT_LATENCIES < 3000
    live = LiveStats()
    m = Version("m", 1)
    live.sample([m], 0.0)
    live.sample([m.serve(3000, 1.0)], 2.0)
    live.sample([m.serve(20, 10.0)], 4.0)
    numbers = live.numbers("m", 2.0)
    assert numbers.p50_ms == pytest.approx(1.0, rel=0.025)
    assert numbers.p99_ms == pytest.approx(1.0, rel=0.025)
    live.sample([m.serve(20, 10.0)], 6.0)
    assert live.numbers("m", 2.0).p99_ms == pytest.approx(10.0, rel=0.025)


def test_the_window_forgets_what_left_the_chart() -> None:
    live = LiveStats(points=2)
    m = Version("m", 1)
    live.sample([m], 0.0)
    live.sample([m.serve(10, 40.0)], 1.0)
    assert live.numbers("m", 1.0).p50_ms == pytest.approx(40.0, rel=0.025)
    live.sample([m.serve(10, 2.0)], 2.0)
    live.sample([m.serve(10, 2.0)], 3.0)  # the 40 ms interval left the window
    assert live.numbers("m", 1.0).p99_ms == pytest.approx(2.0, rel=0.025)
    live.sample([m], 4.0)
    live.sample([m], 5.0)  # no request in the window: no latency to tell
    assert live.numbers("m", 1.0).p50_ms is None


def test_versions_add_up_and_a_new_version_counts_from_zero() -> None:
    live = LiveStats()
    v1, v2 = Version("m", 1).serve(100, 1.0), Version("m", 2)
    live.sample([v1], 0.0)
    live.sample([v1.serve(10, 1.0), v2.serve(6, 1.0)], 2.0)
    assert live.numbers("m", 2.0).points[-1].requests_per_s == 8.0  # (10 + 6) / 2 s
    # Version 1 left and came back with fresh counters: counted from zero, never negative.
    live.sample([Version("m", 1).serve(4, 1.0), v2], 4.0)
    assert live.numbers("m", 2.0).points[-1].requests_per_s == 2.0


def test_the_ring_is_bounded_and_unserved_models_leave_it() -> None:
    live = LiveStats(points=3)
    m, n = Version("m", 1), Version("n", 1)
    for i in range(10):
        live.sample([m.serve(1, 1.0), n.serve(1, 1.0)], float(i))
    assert len(live.numbers("m", 1.0).points) == 3
    live.sample([m.serve(1, 1.0)], 10.0)
    assert live.numbers("n", 1.0).points == ()
    assert live.numbers("never", 1.0).p50_ms is None


def test_weighted_percentile() -> None:
    assert weighted_percentile([], 0.5) is None
    assert weighted_percentile([(5.0, 0)], 0.5) is None
    assert weighted_percentile([(1.0, 1), (9.0, 3)], 0.5) == 9.0
    assert weighted_percentile([(1.0, 99), (9.0, 1)], 0.99) == 1.0
    assert weighted_percentile([(1.0, 98), (9.0, 2)], 0.99) == 9.0
    assert weighted_percentile([(1.0, 0.1)] * 99 + [(9.0, 0.1)], 0.99) == 1.0


def test_switches_are_seen_between_samples() -> None:
    switches = SwitchLog()
    one, two, n1 = object(), object(), object()
    switches.observe({"m": {1: one}, "n": {}}, 1.0)
    # Loaded before the first sample: the process served nothing when it started (a page
    # opened then still shows the load, whichever ran first at start-up).
    assert switches.last == {"m": SwitchStatus(1.0, (), (1,))}
    switches.observe({"m": {1: one}, "n": {}}, 2.0)
    assert switches.last == {"m": SwitchStatus(1.0, (), (1,))}
    switches.observe({"m": {2: two}, "n": {}}, 3.0)
    assert switches.last["m"] == SwitchStatus(3.0, (1,), (2,))
    switches.observe({"m": {1: one}, "n": {1: n1}}, 4.0)  # a rollback; n's first load
    assert switches.last["m"] == SwitchStatus(4.0, (2,), (1,))
    assert switches.last["n"] == SwitchStatus(4.0, (), (1,))
    switches.observe({"m": {1: object()}, "n": {1: n1}}, 5.0)  # m's version 1 reloaded
    assert switches.last["m"] == SwitchStatus(5.0, (1,), (1,))
    assert switches.last["n"].time_s == 4.0


def test_a_models_update_status_reads_the_ledger() -> None:
    entry = LedgerEntry(
        last_good=1,
        failed={
            2: Failure(PROBATION, "rolled back: 5 of 10 failed", "c", "2026-01-02T03:04:05Z"),
            3: Failure("verification", "bad sha256", "d", ""),
        },
    )
    switches = SwitchLog()
    status = update_status("m", (1,), entry, switches)
    assert status.last_good == 1
    assert status.last_switch is None
    assert status.rollback is not None
    assert status.rollback.version == 2
    assert status.rollback.reason.startswith("rolled back")
    assert status.rollback.time_s == 1767323045.0
    assert [(f.version, f.stage, f.time_s) for f in status.failures] == [
        (2, PROBATION, 1767323045.0),
        (3, "verification", None),
    ]
    assert update_status("n", (), None, switches).rollback is None


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


@dataclass
class _Instance:
    placement: Placement | None = None


def test_where_instances_run_with_the_reason_for_a_fallback() -> None:
    config = ModelConfig()
    config.instance_group.add(name="cpu", count=1, kind=mc.ModelInstanceGroup.KIND_CPU)
    config.instance_group.add(name="fell", count=2, kind=mc.ModelInstanceGroup.KIND_CPU)
    config.instance_group.add(name="gpu", count=1, kind=mc.ModelInstanceGroup.KIND_GPU, gpus=[0, 1])
    instances = [
        _Instance(),
        _Instance(),
        _Instance(),
        _Instance(),  # gpu_0 on GPU 0
        _Instance(Placement("KIND_CPU", "the GPU session failed (out of memory)")),  # gpu_1
    ]
    notes = [
        "2 KIND_GPU instance(s) of group 'fell' run on CPU: no usable GPU (no driver)",
        "pinned to version 1 (unpin to follow the version policy)",
    ]
    places = where_instances_run(config, instances, notes)  # type: ignore[arg-type]
    assert [(p.name, p.kind, p.gpu, p.reason) for p in places] == [
        ("cpu_0", "KIND_CPU", None, ""),
        ("fell_0", "KIND_CPU", None, "no usable GPU (no driver)"),
        ("fell_1", "KIND_CPU", None, "no usable GPU (no driver)"),
        ("gpu_0", "KIND_GPU", 0, ""),
        ("gpu_1", "KIND_CPU", None, "the GPU session failed (out of memory)"),
    ]


def test_a_tensorrt_model_served_from_onnx_says_why_for_every_instance() -> None:
    config = ModelConfig()
    config.instance_group.add(name="engine", count=2, kind=mc.ModelInstanceGroup.KIND_CPU)
    note = (
        "TensorRT cannot run here (no GPU): serving model.onnx of version(s) 1 with "
        "onnxruntime on CPU"
    )
    places = where_instances_run(config, [_Instance(), _Instance()], [note])  # type: ignore[list-item]
    assert [p.reason for p in places] == [note, note]


def test_a_poll_since_a_time_gets_the_newer_points_and_the_whole_windows_numbers() -> None:
    live = LiveStats()
    m = Version("m", 1)
    live.sample([m], 0.0)
    for t in (2.0, 4.0, 6.0):
        live.sample([m.serve(10, 1.0 if t < 6 else 9.0)], t)
    everything = live.numbers("m", 2.0)
    assert [p.time_s for p in everything.points] == [2.0, 4.0, 6.0]
    newer = live.numbers("m", 2.0, since_s=4.0)
    assert [p.time_s for p in newer.points] == [6.0]
    assert newer.ring_points == everything.ring_points == 3
    assert (newer.p50_ms, newer.p99_ms, newer.window_s) == (
        everything.p50_ms,
        everything.p99_ms,
        everything.window_s,
    )
    assert live.numbers("m", 2.0, since_s=6.0).points == ()
    assert live.numbers("gone", 2.0).ring_points == 0


def test_points_are_rounded_once_when_sampled() -> None:
    live = LiveStats()
    m = Version("m", 1)
    live.sample([m], 1.0 / 3)
    live.sample([m.serve(1, 1.0 / 3)], 1.0)
    (point,) = live.numbers("m", 2.0).points
    assert point.time_s == 1.0
    assert point.requests_per_s == 1.5  # 1 request in 2/3 s, to 2 decimals
    assert point.mean_ms == 0.3333
