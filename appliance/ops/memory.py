"""Freed heap memory given back to the system after a load (glibc's `malloc_trim`).

A burst of large requests leaves glibc holding the freed memory: request messages, the tensors
decoded from them and the responses are malloc'd by gRPC, protobuf, numpy and ONNX Runtime on
several threads (several malloc arenas), and glibc returns little of it by itself (only the top
of each heap, and large blocks only while under its sliding mmap threshold). Measured with
bench/grpc_memory.py (256 clients, 588 KiB requests, 15 s, no bound on the calls in flight):
RSS idle 146 MiB, 1,073 at the peak, still 785 ten seconds after the load; one
`malloc_trim(0)` (through gdb) took it below idle. MALLOC_ARENA_MAX=2 left 804, a fixed mmap
threshold (MALLOC_MMAP_THRESHOLD_=131072) 290. With this trimmer: back to 126-138 within 5 s.

`HeapTrimmer` calls `malloc_trim(0)` every few seconds on a worker thread: with nothing to give
back it costs microseconds; over a heap fragmented into 100,000 free blocks about 20 ms, during
which threads allocating from an arena being trimmed wait. Without glibc (musl) it does nothing.
It runs for as long as the server does, whichever listeners are on (appliance/server/app.py): HTTP
bodies leave the same freed heap behind as gRPC messages.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import logging
import os
from collections.abc import Callable

log = logging.getLogger(__name__)

TRIM_INTERVAL_S = 5.0


def _malloc_trim() -> Callable[[], int] | None:
    """glibc's malloc_trim(0), or None where the C library has none."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        function = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_size_t]
    function.restype = ctypes.c_int
    return lambda: int(function(0))


def rss_bytes() -> int:
    """This process's resident memory, from /proc (0 where there is none)."""
    try:
        with open("/proc/self/statm", "rb") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class HeapTrimmer:
    """Every `interval_s`, give the heap's free memory back to the system (off the loop)."""

    def __init__(
        self, interval_s: float = TRIM_INTERVAL_S, trim: Callable[[], int] | None = None
    ) -> None:
        self.interval_s = interval_s
        self._trim = trim if trim is not None else _malloc_trim()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._trim is None:
            log.debug("no malloc_trim in this C library: freed heap memory stays with glibc")
            return
        self._task = asyncio.get_running_loop().create_task(self._run(self._trim))

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self, trim: Callable[[], int]) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            before = rss_bytes()
            if await asyncio.to_thread(trim) and log.isEnabledFor(logging.DEBUG):
                log.debug("malloc_trim: RSS %.0f -> %.0f MiB", before / 2**20, rss_bytes() / 2**20)


# ---- what the server and its model processes hold (the memory budget, runtime/budget.py) ----


def _children(pid: int) -> list[int]:
    """The pids of a process's children, from /proc (none where it cannot be read)."""
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children", "rb") as handle:
                found += [int(word) for word in handle.read().split()]
        except (OSError, ValueError):
            continue
    return found


def _process_bytes(pid: int) -> int:
    """One process's proportional set size (PSS: its shared pages split among their users),
    else its RSS; 0 for a process that is gone."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as handle:
            for line in handle:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        with open(f"/proc/{pid}/statm", "rb") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def tree_bytes(pid: int | None = None) -> int:
    """The memory of a process and all its descendants (the server and its Python models'
    worker processes): the sum of their PSS (RSS where PSS cannot be read). Blocking: a few
    milliseconds, for the reads of /proc."""
    root = os.getpid() if pid is None else pid
    seen: set[int] = set()
    todo = [root]
    total = 0
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        total += _process_bytes(current)
        todo += _children(current)
    return total


def trim_heap() -> None:
    """Give glibc's free heap memory back to the system now (nothing without glibc)."""
    trim = _TRIM
    if trim is not None:
        trim()


_TRIM = _malloc_trim()


def available_bytes(meminfo: str = "/proc/meminfo") -> int | None:
    """MemAvailable (what can be allocated without swapping), or None where unknown."""
    try:
        with open(meminfo, "rb") as handle:
            for line in handle:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def cgroup_limit_bytes(
    proc_root: str = "/proc/self", fs_root: str = "/sys/fs/cgroup"
) -> int | None:
    """The memory.max of this process's own cgroup (cgroup v2), or None when it sets none
    ('max') or there is no cgroup v2."""
    try:
        with open(f"{proc_root}/cgroup", encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return None
    for line in lines:
        hierarchy, _, path = line.partition("::")
        if hierarchy != "0" or not path:
            continue
        try:
            with open(f"{fs_root}{path.rstrip('/')}/memory.max", encoding="utf-8") as handle:
                text = handle.read().strip()
        except OSError:
            return None
        return None if text == "max" else int(text) if text.isdigit() else None
    return None
