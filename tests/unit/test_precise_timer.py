"""The shared thread that gives event loops sub-millisecond wake-ups."""

from __future__ import annotations

import asyncio
import time

from appliance.scheduling.precise_timer import TIMERS


async def test_timers_fire_on_the_loop_in_deadline_order_and_cancel() -> None:
    loop = asyncio.get_running_loop()
    # The timer thread runs before the deadlines below are set: its start (and the GIL's
    # hand-over) once delayed setting "early" past the deadline of "late" in CI.
    started = asyncio.Event()
    TIMERS.call_at(loop, time.monotonic_ns(), started.set)
    await asyncio.wait_for(started.wait(), 5)
    fired: list[str] = []
    done = asyncio.Event()
    now = time.monotonic_ns()
    # 20 ms apart: far more than setting them takes, even on a busy 2-core machine.
    TIMERS.call_at(loop, now + 60_000_000, lambda: fired.append("late"))
    TIMERS.call_at(loop, now + 20_000_000, lambda: fired.append("early"))
    cancelled = TIMERS.call_at(loop, now + 40_000_000, lambda: fired.append("cancelled"))
    cancelled.cancel()
    TIMERS.call_at(loop, now + 80_000_000, done.set)
    await asyncio.wait_for(done.wait(), 5)
    assert fired == ["early", "late"]
    assert time.monotonic_ns() >= now + 80_000_000  # never early


async def test_a_deadline_in_the_past_fires_at_once() -> None:
    loop = asyncio.get_running_loop()
    done = asyncio.Event()
    TIMERS.call_at(loop, time.monotonic_ns() - 1, done.set)
    await asyncio.wait_for(done.wait(), 5)
