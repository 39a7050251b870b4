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
