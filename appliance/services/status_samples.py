"""What the status page samples: a ring of live numbers per model from the statistics the
server keeps, and the device's CPU, memory, disk and GPU readings."""

from __future__ import annotations

import bisect
import contextlib
import logging
import os
import shutil
import socket
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from appliance.gpu_metrics import (
    MEMORY_TOTAL,
    MEMORY_USED,
    POWER_USAGE,
    UTILIZATION,
    GpuSource,
)
from appliance.services.results import ModelStatistics
from appliance.services.status_results import (
    DeviceStatus,
    GpuStatus,
    LiveNumbers,
    RatePoint,
)

log = logging.getLogger(__name__)

# One sample every 2 s, 150 kept: the last 5 minutes, 150 x 4 numbers per model.
SAMPLE_INTERVAL_S = 2.0
RING_POINTS = 150


@dataclass
class _Counters:
    requests: int = 0
    failures: int = 0
    success_ns: int = 0
    successes: int = 0


def _totals(rows: Iterable[ModelStatistics]) -> dict[tuple[str, int], _Counters]:
    found: dict[tuple[str, int], _Counters] = {}
    for row in rows:
        stats = row.inference_stats
        found[(row.name, row.version)] = _Counters(
            stats.success.count + stats.fail.count,
            stats.fail.count,
            stats.success.ns,
            stats.success.count,
        )
    return found


def weighted_percentile(values: Sequence[tuple[float, int]], fraction: float) -> float | None:
    """The value below which `fraction` of the weight lies; (value, weight) pairs."""
    pairs = sorted((v, w) for v, w in values if w > 0)
    if not pairs:
        return None
    cumulative: list[int] = []
    total = 0
    for _, weight in pairs:
        total += weight
        cumulative.append(total)
    at = bisect.bisect_left(cumulative, fraction * total)
    return pairs[min(at, len(pairs) - 1)][0]


class LiveStats:
    """A bounded ring of rate points per model, fed by statistics snapshots (pure: the caller
    gives the time)."""

    def __init__(self, points: int = RING_POINTS) -> None:
        self._points = points
        self._rings: dict[str, deque[RatePoint]] = {}
        self._previous: dict[tuple[str, int], _Counters] | None = None
        self._previous_s = 0.0

    def sample(self, rows: Iterable[ModelStatistics], now_s: float) -> None:
        """Add one point per model from a snapshot of every served version's counters."""
        totals = _totals(rows)
        previous, elapsed_s = self._previous, now_s - self._previous_s
        self._previous, self._previous_s = totals, now_s
        if previous is None or elapsed_s <= 0:
            return  # the first snapshot is the baseline
        per_model: dict[str, _Counters] = {}
        for key, now in totals.items():
            before = previous.get(key)
            if before is None or before.requests > now.requests:
                before = _Counters()  # a version that came in since: all its requests are new
            delta = per_model.setdefault(key[0], _Counters())
            delta.requests += now.requests - before.requests
            delta.failures += now.failures - before.failures
            delta.successes += now.successes - before.successes
            delta.success_ns += now.success_ns - before.success_ns
        for name in list(self._rings):
            if name not in per_model:
                del self._rings[name]  # no version serves: its chart starts again when one does
        for name, delta in per_model.items():
            ring = self._rings.setdefault(name, deque(maxlen=self._points))
            mean_ms = delta.success_ns / delta.successes / 1e6 if delta.successes else None
            ring.append(
                RatePoint(
                    now_s, delta.requests / elapsed_s, delta.failures / elapsed_s, mean_ms
                )
            )

    def numbers(self, name: str, interval_s: float) -> LiveNumbers:
        points = tuple(self._rings.get(name, ()))
        if not points:
            return LiveNumbers(0.0, 0.0, None, None, 0.0, ())
        requests = sum(p.requests_per_s for p in points)
        errors = sum(p.errors_per_s for p in points)
        latencies = [
            (p.mean_ms, round((p.requests_per_s - p.errors_per_s) * interval_s))
            for p in points
            if p.mean_ms is not None
        ]
        return LiveNumbers(
            window_s=len(points) * interval_s,
            requests_per_s=points[-1].requests_per_s,
            p50_ms=weighted_percentile(latencies, 0.5),
            p99_ms=weighted_percentile(latencies, 0.99),
            error_rate=errors / requests if requests else 0.0,
            points=points,
        )


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
