"""How much CPU other people's processes took while a point was measured.

The machine is shared, so each point records the CPU time the whole machine spent busy minus the
time this benchmark's own processes spent (this process, its waited-for children such as the
load generator, and the live servers: the server under test and the ceilings), as a percentage
of one core over the point's wall time.
"""

from __future__ import annotations

import os
import resource
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


def other_cpu_pct(before: CpuSnapshot, after: CpuSnapshot) -> float:
    """Other processes' CPU between two snapshots, in % of one core."""
    wall = max(1e-9, after.wall_s - before.wall_s)
    foreign = (after.machine_busy_s - before.machine_busy_s) - (after.own_s - before.own_s)
    return max(0.0, 100.0 * foreign / wall)
