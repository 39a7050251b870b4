"""Queue limits, queue timeouts and priorities through tritonclient, on a slow model."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
import tritonclient.http.aio as httpaio
from tritonclient.utils import InferenceServerException

from tests.serverproc import ServerProcess


def _input(module):  # type: ignore[no-untyped-def]
    inp = module.InferInput("INPUT0", [1, 1024], "FP32")
    inp.set_data_from_numpy(np.ones((1, 1024), np.float32))
    return inp


async def _burst(module, url: str, model: str, count: int, **kwargs) -> list[object]:  # type: ignore[no-untyped-def]
    client = module.InferenceServerClient(url)
    try:
        return await asyncio.gather(
            *(client.infer(model, [_input(module)], **kwargs) for _ in range(count)),
            return_exceptions=True,
        )
    finally:
        await client.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
async def test_full_queue_answers_unavailable_at_once(server: ServerProcess, protocol: str) -> None:
    module, url = (httpaio, server.http_url) if protocol == "http" else (grpcaio, server.grpc_url)
    # 20 at once: over gRPC each request is admitted on a handler thread of its own, and on a
    # busy 2-core machine the first execution (the thread lane, on its handler thread) can
    # delay the others' threads enough that 10 arrived too spread out to overflow the queue.
    results = await _burst(module, url, "slow_queue", 20)
    errors = [r for r in results if isinstance(r, InferenceServerException)]
    successes = [r for r in results if not isinstance(r, BaseException)]
    assert successes, results
    assert errors, "20 concurrent requests against max_queue_size 2 should overflow"
    for error in errors:
        assert error.status() in ("503", "StatusCode.UNAVAILABLE")
        assert "model 'slow_queue' version 1: queue for priority level 2 is full" in (
            error.message()
        )
        assert "max_queue_size 2" in error.message()
    assert len(successes) + len(errors) == 20


async def test_queue_timeout_rejects_waiting_requests(server: ServerProcess) -> None:
    results = await _burst(httpaio, server.http_url, "slow_timeout", 6)
    errors = [r for r in results if isinstance(r, InferenceServerException)]
    assert any(not isinstance(r, BaseException) for r in results)
    assert errors, "requests queued behind 17 ms executions must hit the 5 ms queue timeout"
    for error in errors:
        assert error.status() == "503"
        assert "Request timeout expired" in error.message()


async def test_request_timeout_parameter_shortens_the_wait(server: ServerProcess) -> None:
    """allow_timeout_override: a per-request timeout below the default applies (gRPC)."""
    results = await _burst(grpcaio, server.grpc_url, "slow_timeout", 4, timeout=1000)
    errors = [r for r in results if isinstance(r, InferenceServerException)]
    assert errors
    assert all("Request timeout expired" in e.message() for e in errors)


def test_priority_parameter_is_validated(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    result = client.infer("slow_queue", [_input(httpclient)], priority=1)
    assert result.as_numpy("OUTPUT0").shape == (1, 1024)
    with pytest.raises(InferenceServerException, match="priority 3 is out of range") as err:
        client.infer("slow_queue", [_input(httpclient)], priority=3)
    assert err.value.status() == "400"


async def test_rejections_show_in_statistics(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    before = client.get_inference_statistics("slow_queue")["model_stats"][0]["inference_stats"]
    results = await _burst(httpaio, server.http_url, "slow_queue", 10)
    rejected = sum(isinstance(r, InferenceServerException) for r in results)
    after = client.get_inference_statistics("slow_queue")["model_stats"][0]["inference_stats"]
    assert after["fail"]["count"] - before["fail"]["count"] == rejected
    assert after["success"]["count"] - before["success"]["count"] == 10 - rejected


async def test_high_priority_request_overtakes_queued_work(server: ServerProcess) -> None:
    """Under load, a priority 1 request finishes before default-level requests sent earlier."""
    client = grpcaio.InferenceServerClient(server.grpc_url)
    finished: list[str] = []

    async def one(tag: str, priority: int) -> None:
        await client.infer("slow", [_input(grpcaio)], priority=priority)
        finished.append(tag)

    try:
        background = [asyncio.ensure_future(one(f"low{i}", 0)) for i in range(20)]
        await asyncio.sleep(0.05)  # the low-priority requests are queued behind the first
        await one("high", 1)
        await asyncio.gather(*background)
    finally:
        await client.close()
    position = finished.index("high")
    assert position < 10, finished  # ahead of the low-priority requests still queued
