"""What the status page samples: a ring of live numbers per model from the counters the
server keeps, the changes of served versions, and the device's CPU, memory, disk and GPU
readings."""

from __future__ import annotations

import bisect
import contextlib
import itertools
import logging
import math
import os
import shutil
import socket
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from appliance.ops.gpu import (
    MEMORY_TOTAL,
    MEMORY_USED,
    POWER_USAGE,
    UTILIZATION,
    GpuSource,
)
from appliance.scheduling.stats import RECENT_LATENCIES, ModelStats
from appliance.services.status_results import (
    DeviceStatus,
    GpuStatus,
    LiveNumbers,
    RatePoint,
    SwitchStatus,
)

log = logging.getLogger(__name__)

# One sample every 2 s, 150 kept: the last 5 minutes, 150 x 4 numbers per model.
SAMPLE_INTERVAL_S = 2.0
RING_POINTS = 150
# Latencies are counted in log buckets, BUCKETS_PER_OCTAVE to each doubling: a bucket is 4.4 %
# wide and its middle, reported for a percentile, is within 2.2 % of every latency in it.
BUCKETS_PER_OCTAVE = 16


class CountedVersion(Protocol):
    """A served version's counters (runtime/registry.py's ServedVersion)."""

    @property
    def name(self) -> str: ...
    @property
    def version(self) -> int: ...
    @property
    def stats(self) -> ModelStats: ...


@dataclass(slots=True)
class _Seen:
    """A version's counters at one sample; `stats` tells a reloaded version (new counters)."""

    stats: ModelStats | None = None
    requests: int = 0
    failures: int = 0
    successes: int = 0
    success_ns: int = 0


@dataclass
class _Interval:
    requests: int = 0
    failures: int = 0
    successes: int = 0
    success_ns: int = 0
    latencies: dict[int, float] = field(default_factory=dict)  # bucket -> requests

    def add_latencies(self, stats: ModelStats, successes: int, new: int) -> None:
        """The latencies of the last `new` of `successes` successes, from the ring of the
        last RECENT_LATENCIES, each standing for new / taken requests."""
        taken = min(new, RECENT_LATENCIES)
        if taken <= 0:
            return
        ring = np.array(stats.recent_ns, dtype=np.float64)  # a copy: the ring moves on
        if taken < RECENT_LATENCIES:
            ring = ring[(successes - np.arange(taken)) % RECENT_LATENCIES]
        # latency_bucket() for all at once: numpy, as one tick reads up to 512 per version.
        found, counts = np.unique(
            (np.log2(np.maximum(ring, 1.0)) * BUCKETS_PER_OCTAVE).astype(np.int64),
            return_counts=True,
        )
        weight, buckets = new / taken, self.latencies
        for bucket, count in zip(found.tolist(), counts.tolist(), strict=True):
            buckets[bucket] = buckets.get(bucket, 0.0) + count * weight


def latency_bucket(ns: int) -> int:
    return int(math.log2(max(ns, 1)) * BUCKETS_PER_OCTAVE)


def bucket_ms(bucket: int) -> float:
    """The middle (geometric) of a latency bucket, in ms."""
    return float(2 ** ((bucket + 0.5) / BUCKETS_PER_OCTAVE) / 1e6)


def weighted_percentile(values: Sequence[tuple[float, float]], fraction: float) -> float | None:
    """The value below which `fraction` of the weight lies; (value, weight) pairs."""
    pairs = sorted((v, w) for v, w in values if w > 0)
    if not pairs:
        return None
    cumulative: list[float] = []
    total = 0.0
    for _, weight in pairs:
        total += weight
        cumulative.append(total)
    at = bisect.bisect_left(cumulative, fraction * total * (1 - 1e-12))
    return pairs[min(at, len(pairs) - 1)][0]


@dataclass
class _Ring:
    """One model's last RING_POINTS intervals: the chart's points and their latencies, with
    the window's bucket totals kept as intervals come and go (a tick touches the buckets of
    the interval that arrives and the one that leaves, not the whole window)."""

    points: deque[RatePoint]
    latencies: deque[dict[int, float]]
    window: dict[int, float] = field(default_factory=dict)  # bucket -> requests, all intervals
    p50_ms: float | None = None
    p99_ms: float | None = None

    def add(self, point: RatePoint, latencies: dict[int, float]) -> None:
        window = self.window
        if len(self.latencies) == self.latencies.maxlen:
            for bucket, weight in self.latencies[0].items():
                left = window[bucket] - weight
                if left > 1e-6:
                    window[bucket] = left
                else:
                    del window[bucket]  # float sums: what is left of nothing is rounding
        self.points.append(point)
        self.latencies.append(latencies)
        for bucket, weight in latencies.items():
            window[bucket] = window.get(bucket, 0.0) + weight
        pairs = [(bucket_ms(b), w) for b, w in window.items()]
        self.p50_ms = weighted_percentile(pairs, 0.5)
        self.p99_ms = weighted_percentile(pairs, 0.99)


class LiveStats:
    """A bounded ring of rate points and latencies per model, fed by the served versions'
    counters (pure: the caller gives the time). Sampling reads counters and the latency
    ring each version keeps (scheduling/stats.py): nothing on the inference path."""

    def __init__(self, points: int = RING_POINTS) -> None:
        self._points = points
        self._rings: dict[str, _Ring] = {}
        self._previous: dict[tuple[str, int], _Seen] | None = None
        self._previous_s = 0.0

    def sample(self, versions: Iterable[CountedVersion], now_s: float) -> None:
        """Add one point per model from every served version's counters, read now."""
        seen: dict[tuple[str, int], _Seen] = {}
        for served in versions:
            s = served.stats
            seen[(served.name, served.version)] = _Seen(
                s, s.success.count + s.fail.count, s.fail.count, s.success.count, s.success.ns
            )
        previous, elapsed_s = self._previous, now_s - self._previous_s
        self._previous, self._previous_s = seen, now_s
        if previous is None or elapsed_s <= 0:
            return  # the first snapshot is the baseline
        per_model: dict[str, _Interval] = {}
        for key, now in seen.items():
            before = previous.get(key)
            if before is None or before.stats is not now.stats:
                before = _Seen()  # a version that came in since: all its requests are new
            delta = per_model.setdefault(key[0], _Interval())
            delta.requests += now.requests - before.requests
            delta.failures += now.failures - before.failures
            delta.successes += now.successes - before.successes
            delta.success_ns += now.success_ns - before.success_ns
            if now.stats is not None:
                delta.add_latencies(now.stats, now.successes, now.successes - before.successes)
        for name in list(self._rings):
            if name not in per_model:
                del self._rings[name]  # no version serves: its chart starts again when one does
        for name, delta in per_model.items():
            ring = self._rings.get(name)
            if ring is None:
                ring = self._rings[name] = _Ring(
                    deque(maxlen=self._points), deque(maxlen=self._points)
                )
            mean_ms = delta.success_ns / delta.successes / 1e6 if delta.successes else None
            # Rounded once here: the page shows 3 digits, and each poll sends every point.
            point = RatePoint(
                round(now_s, 3),
                round(delta.requests / elapsed_s, 2),
                round(delta.failures / elapsed_s, 2),
                None if mean_ms is None else round(mean_ms, 4),
            )
            ring.add(point, delta.latencies)

    def numbers(self, name: str, interval_s: float, since_s: float = 0.0) -> LiveNumbers:
        """A model's numbers over the window; the chart's points after `since_s` only (a page
        that has the older ones asks for what is new: a poll stays small)."""
        ring = self._rings.get(name)
        if ring is None or not ring.points:
            return LiveNumbers(0.0, 0.0, None, None, 0.0, 0, ())
        points = ring.points
        requests = sum(p.requests_per_s for p in points)
        errors = sum(p.errors_per_s for p in points)
        new = len(points)
        while new and points[new - 1].time_s > since_s:
            new -= 1
        return LiveNumbers(
            window_s=len(points) * interval_s,
            requests_per_s=points[-1].requests_per_s,
            p50_ms=ring.p50_ms,
            p99_ms=ring.p99_ms,
            error_rate=errors / requests if requests else 0.0,
            ring_points=len(points),
            points=tuple(itertools.islice(points, new, None)),
        )


class SwitchLog:
    """Each model's last change of served versions, seen by comparing samples (pure). The
    baseline is what a process serves when it starts: nothing. So a model that was loaded
    before the first sample shows as loaded at that sample, as one loaded later does at the
    sample after its load (the sampler and the first loads start together)."""

    def __init__(self) -> None:
        self._serving: dict[str, dict[int, object]] = {}
        self.last: dict[str, SwitchStatus] = {}

    def observe(self, serving: Mapping[str, Mapping[int, object]], now_s: float) -> None:
        """`serving`: model -> version -> the served version (a reload is a new object)."""
        before, self._serving = self._serving, {n: dict(v) for n, v in serving.items()}
        for name in serving.keys() | before.keys():
            old, new = before.get(name, {}), serving.get(name, {})
            if old.keys() != new.keys() or any(old[v] is not new[v] for v in new):
                self.last[name] = SwitchStatus(now_s, tuple(sorted(old)), tuple(sorted(new)))


# ---- device readings (blocking: on a thread) -------------------------------------------------


def _cpu_times(root: Path) -> tuple[int, int] | None:
    """(busy, total) jiffies of all CPUs from /proc/stat."""
    try:
        fields = (root / "proc/stat").read_text().split("\n", 1)[0].split()[1:]
        values = [int(v) for v in fields]
    except (OSError, ValueError):
        return None
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    return sum(values) - idle, sum(values)


def _meminfo(root: Path) -> tuple[int | None, int | None]:
    try:
        lines = (root / "proc/meminfo").read_text().splitlines()
    except OSError:
        return None, None
    found: dict[str, int] = {}
    for line in lines:
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            found[key] = int(parts[0]) * 1024
    return found.get("MemTotal"), found.get("MemAvailable")


@dataclass
class DeviceReader:
    """Reads the device's numbers; keeps the last CPU times for the next interval's use."""

    store_path: Path
    gpu: GpuSource | None = None
    root: Path = Path("/")
    _cpu: tuple[int, int] | None = field(default=None, repr=False)

    def read(self) -> DeviceStatus:
        cpu_now = _cpu_times(self.root)
        cpu_percent = None
        if cpu_now is not None and self._cpu is not None and cpu_now[1] > self._cpu[1]:
            busy, total = cpu_now[0] - self._cpu[0], cpu_now[1] - self._cpu[1]
            cpu_percent = round(100.0 * busy / total, 1)
        self._cpu = cpu_now
        memory_total, memory_available = _meminfo(self.root)
        store_free = store_total = None
        with contextlib.suppress(OSError):
            usage = shutil.disk_usage(self._existing(self.store_path))
            store_free, store_total = usage.free, usage.total
        load_1m = None
        with contextlib.suppress(OSError, AttributeError):
            load_1m = os.getloadavg()[0]
        return DeviceStatus(
            hostname=socket.gethostname(),
            cpu_count=os.cpu_count() or 1,
            cpu_percent=cpu_percent,
            load_1m=load_1m,
            memory_total_bytes=memory_total,
            memory_available_bytes=memory_available,
            store_path=str(self.store_path),
            store_free_bytes=store_free,
            store_total_bytes=store_total,
            gpus=self._gpus(),
        )

    def _gpus(self) -> tuple[GpuStatus, ...]:
        if self.gpu is None:
            return ()
        try:
            readings = self.gpu.read()
        except Exception:  # a driver hiccup must not end the page's readings
            log.debug("GPU reading failed", exc_info=True)
            return ()
        return tuple(
            GpuStatus(
                r.uuid,
                r.values.get(UTILIZATION),
                r.values.get(MEMORY_TOTAL),
                r.values.get(MEMORY_USED),
                r.values.get(POWER_USAGE),
            )
            for r in readings
        )

    @staticmethod
    def _existing(path: Path) -> Path:
        """The path, or its nearest existing parent (the store may not exist yet)."""
        path = path.absolute()
        while not path.exists() and path != path.parent:
            path = path.parent
        return path


def unread(store_path: Path) -> DeviceStatus:
    """The device before the first sample: what needs no I/O."""
    return DeviceStatus(
        socket.gethostname(), os.cpu_count() or 1, None, None, None, None, str(store_path),
        None, None, (),
    )
