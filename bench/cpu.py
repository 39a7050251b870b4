"""How much CPU other people's processes took while a point was measured.

The machine is shared, so each point records the CPU time the whole machine spent busy minus the
time this benchmark's own processes spent (this process, its waited-for children such as the
load generator, and the live servers: the server under test and the ceilings), as a percentage
of one core over the point's wall time.
"""

from __future__ import annotations

import os
import resource
import threading
import time
from dataclasses import dataclass
from pathlib import Path

USER_HZ = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class CpuSnapshot:
    wall_s: float
    machine_busy_s: float
    own_s: float


def machine_busy_s() -> float:
    """CPU seconds all cores spent in user, nice, system, irq and softirq since boot."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq = fields[:7]
    return (user + nice + system + irq + softirq) / USER_HZ


def process_cpu_s(pid: int) -> float:
    """utime + stime of a live process (all its threads); 0 once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    after_name = stat.rsplit(")", 1)[1].split()
    return (int(after_name[11]) + int(after_name[12])) / USER_HZ


def own_cpu_s(server_pids: tuple[int | None, ...]) -> float:
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total + sum(process_cpu_s(pid) for pid in server_pids if pid)


def snapshot(*server_pids: int | None) -> CpuSnapshot:
    """Now; `server_pids`: the live servers this benchmark started (the server, the ceilings)."""
    return CpuSnapshot(time.monotonic(), machine_busy_s(), own_cpu_s(server_pids))


class CpuSampler:
    """One process's CPU time, sampled on a thread while a point runs (`with CpuSampler(pid)`).

    busy_rate() is the CPU it used per second of wall time over the middle half of the span in
    which it was busy (so the load generator's start, warm-up and teardown are left out). Divided
    by the throughput it gives CPU per request, which holds up far better than throughput when
    other processes share the core (they take time from it, not CPU per request)."""

    INTERVAL_S = 0.05

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-sampler", daemon=True)

    def __enter__(self) -> CpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while True:
            self.samples.append((time.monotonic(), process_cpu_s(self.pid)))
            if self._stop.wait(self.INTERVAL_S):
                return

    def busy_rate(self) -> float | None:
        samples = self.samples
        busy = [
            t
            for (t, cpu), (_, before) in zip(samples[1:], samples[:-1], strict=True)
            if cpu > before
        ]
        if len(busy) < 4:
            return None
        quarter = (busy[-1] - busy[0]) / 4
        inside = [(t, cpu) for t, cpu in samples if busy[0] + quarter <= t <= busy[-1] - quarter]
        if len(inside) < 2 or inside[-1][0] <= inside[0][0]:
            return None
        return (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0])


def other_cpu_pct(before: CpuSnapshot, after: CpuSnapshot) -> float:
    """Other processes' CPU between two snapshots, in % of one core."""
    wall = max(1e-9, after.wall_s - before.wall_s)
    foreign = (after.machine_busy_s - before.machine_busy_s) - (after.own_s - before.own_s)
    return max(0.0, 100.0 * foreign / wall)
