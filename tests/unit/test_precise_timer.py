"""The shared thread that gives event loops sub-millisecond wake-ups."""

from __future__ import annotations

import asyncio
import time

from appliance.scheduling.precise_timer import TIMERS


async def test_timers_fire_on_the_loop_in_deadline_order_and_cancel() -> None:
    loop = asyncio.get_running_loop()
    fired: list[str] = []
    done = asyncio.Event()
    now = time.monotonic_ns()
    TIMERS.call_at(loop, now + 600_000, lambda: fired.append("late"))
    TIMERS.call_at(loop, now + 200_000, lambda: fired.append("early"))
    cancelled = TIMERS.call_at(loop, now + 400_000, lambda: fired.append("cancelled"))
    cancelled.cancel()
    TIMERS.call_at(loop, now + 800_000, done.set)
    await asyncio.wait_for(done.wait(), 5)
    assert fired == ["early", "late"]
    assert time.monotonic_ns() >= now + 800_000  # never early


async def test_a_deadline_in_the_past_fires_at_once() -> None:
    loop = asyncio.get_running_loop()
    done = asyncio.Event()
    TIMERS.call_at(loop, time.monotonic_ns() - 1, done.set)
    await asyncio.wait_for(done.wait(), 5)
