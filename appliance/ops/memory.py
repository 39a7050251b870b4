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

Between trims the freed heap stays for reuse (`hold_freed_heap`, when the trimmer starts):
glibc's own sliding thresholds give memory back to the system as soon as more than twice the
largest block freed so far lies free at the top of a heap, so under load each large request
faulted fresh pages in again: a SqueezeNet input over gRPC (588 KiB, issue 34's point) about 270
page faults a request one at a time, 76-93 two at a time; with the thresholds fixed, 2-5
(tests/integration/test_large_request_faults.py).
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


# mallopt's parameters (malloc.h) and what they are set to: blocks up to the largest size glibc's
# sliding threshold would ever reach (32 MiB on 64-bit) come from the heap, and up to 4 MiB may
# lie free at a heap's top before free() gives it back (a few requests' worth of 588 KiB
# tensors). Not more: malloc_trim gives back the free blocks inside every heap but the top only
# of the main one, so the tops of the threads' heaps are what a burst leaves behind (at 64 MiB,
# 230 MiB RSS after tests/integration/test_grpc_memory.py's burst against 157 idle).
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 4 << 20


def hold_freed_heap() -> bool:
    """Keep freed heap memory for reuse until the next trim (glibc's mallopt); False where
    the C library has no mallopt."""
    name = ctypes.util.find_library("c")
    try:
        mallopt = ctypes.CDLL(name).mallopt if name else None
    except (OSError, AttributeError):
        mallopt = None
    if mallopt is None:
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    # Both or neither: either one alone stops glibc's threshold from sliding (at 128 KiB).
    return bool(
        mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )


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
        self._hold = trim is None  # the real trimmer: freed memory waits for it (not a test's)
        self._trim = trim if trim is not None else _malloc_trim()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._trim is None:
            log.debug("no malloc_trim in this C library: freed heap memory stays with glibc")
            return
        if self._hold:
            hold_freed_heap()
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
