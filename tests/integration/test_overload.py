"""Overload: a burst far past what the model can do is answered at once with 503 for the
excess, admitted requests wait no longer than --max-queue-wait-ms allows, and the server
serves normally right after."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient
import tritonclient.http.aio as httpaio
from tritonclient.utils import InferenceServerException


async def _burst(url: str, count: int) -> list[tuple[float, str]]:
    """(seconds, '' or the error) for `count` requests sent at once."""
    async with httpaio.InferenceServerClient(url, conn_limit=count) as client:

        async def one() -> tuple[float, str]:
            inp = httpaio.InferInput("INPUT0", [1, 1024], "FP32")
            inp.set_data_from_numpy(np.ones((1, 1024), np.float32))
            started = time.monotonic()
            try:
                await client.infer("slow", [inp])
                return time.monotonic() - started, ""
            except InferenceServerException as exc:
                return time.monotonic() - started, f"{exc.status()} {exc.message()}"

        return await asyncio.gather(*(one() for _ in range(count)))


def test_excess_is_refused_at_once_and_admitted_latency_stays_bounded(
    start_server, model_repository: Path
) -> None:
    proc = start_server(model_repository, "--max-queue-wait-ms=300")
    client = httpclient.InferenceServerClient(proc.http_url)
    inp = httpclient.InferInput("INPUT0", [1, 1024], "FP32")
    inp.set_data_from_numpy(np.ones((1, 1024), np.float32))
    started = time.monotonic()
    for _ in range(3):  # the scheduler learns what one request costs
        client.infer("slow", [inp])
    service_s = (time.monotonic() - started) / 3

    results = asyncio.run(_burst(proc.http_url, 48))
    admitted = [t for t, error in results if not error]
    refused = [(t, error) for t, error in results if error]
    assert refused, f"no request was refused (service time {service_s * 1000:.0f} ms)"
    assert admitted
    assert all(error.startswith("503") and "overloaded" in error for _, error in refused)
    # Refusals come back before the work queued ahead of them would have finished.
    assert max(t for t, _ in refused) < max(admitted)
    # Admitted requests waited at most about the limit, plus their own run (and slack for a
    # busy 2-core machine).
    assert max(admitted) < 0.3 + 4 * service_s + 1.0, (max(admitted), service_s)
    # And the server recovers at once.
    assert client.infer("slow", [inp]).as_numpy("OUTPUT0").shape == (1, 1024)


def test_one_request_per_instance_may_always_wait(start_server, model_repository: Path) -> None:
    """However small the limit (and however slow the model), a request arriving while the
    only instance is busy is queued, not refused; the one after it is refused."""
    proc = start_server(model_repository, "--max-queue-wait-ms=1")
    client = httpclient.InferenceServerClient(proc.http_url)
    inp = httpclient.InferInput("INPUT0", [1, 1024], "FP32")
    inp.set_data_from_numpy(np.ones((1, 1024), np.float32))
    for _ in range(3):  # the scheduler learns what one request costs (far more than 1 ms)
        client.infer("slow", [inp])

    results = asyncio.run(_burst(proc.http_url, 2))
    assert [error for _, error in results] == ["", ""]
    results = asyncio.run(_burst(proc.http_url, 6))
    errors = sorted(error[:3] for _, error in results)
    assert errors.count("") >= 2
    assert "503" in errors
