"""appliance/ops/memory.py: the heap trimmer calls malloc_trim off the loop at its interval, and
stops with its owner."""

from __future__ import annotations

import asyncio
import ctypes.util
import threading

import pytest

from appliance.ops.memory import HeapTrimmer, _malloc_trim, rss_bytes


async def test_trims_at_its_interval_on_a_worker_thread_until_stopped() -> None:
    threads: list[int] = []
    three = threading.Event()

    def trim() -> int:
        threads.append(threading.get_ident())
        if len(threads) >= 3:
            three.set()
        return 1

    trimmer = HeapTrimmer(interval_s=0.01, trim=trim)
    trimmer.start()
    assert await asyncio.to_thread(three.wait, 30)
    await trimmer.stop()
    calls = len(threads)
    await asyncio.sleep(0.05)
    assert len(threads) == calls
    assert threading.get_ident() not in threads  # never on the event loop's thread


async def test_stop_without_start_and_twice() -> None:
    trimmer = HeapTrimmer(interval_s=0.01, trim=lambda: 0)
    await trimmer.stop()
    trimmer.start()
    await trimmer.stop()
    await trimmer.stop()


@pytest.mark.skipif("libc.so" not in (ctypes.util.find_library("c") or ""), reason="not glibc")
def test_glibc_malloc_trim_is_found_and_callable() -> None:
    trim = _malloc_trim()
    assert trim is not None
    assert trim() in (0, 1)
    assert rss_bytes() > 0
