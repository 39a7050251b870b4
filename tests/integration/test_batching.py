"""Dynamic batching, observed through the statistics API with concurrent clients."""

from __future__ import annotations

import asyncio

import numpy as np
import tritonclient.grpc.aio as grpcaio
import tritonclient.http.aio as httpaio

from tests.serverproc import ServerProcess


def _stats(entry: dict) -> tuple[int, int]:  # type: ignore[type-arg]
    return int(entry["inference_count"]), int(entry["execution_count"])


async def _concurrent(module, url: str, model: str, count: int) -> list[np.ndarray]:  # type: ignore[no-untyped-def]
    client = module.InferenceServerClient(url)
    try:

        async def one(i: int) -> np.ndarray:
            a = np.full((1, 16), i, dtype=np.int32)
            b = np.arange(16, dtype=np.int32).reshape(1, 16)
            inputs = [
                module.InferInput("INPUT0", [1, 16], "INT32"),
                module.InferInput("INPUT1", [1, 16], "INT32"),
            ]
            inputs[0].set_data_from_numpy(a)
            inputs[1].set_data_from_numpy(b)
            result = await client.infer(model, inputs)
            return result.as_numpy("OUTPUT0")

        return await asyncio.gather(*(one(i) for i in range(count)))
    finally:
        await client.close()


async def test_concurrent_requests_share_executions(server: ServerProcess) -> None:
    stats_client = httpaio.InferenceServerClient(server.http_url)
    try:
        before = _stats(
            (await stats_client.get_inference_statistics("simple_batching"))["model_stats"][0]
        )
        outputs = await _concurrent(httpaio, server.http_url, "simple_batching", 16)
        after_entry = (await stats_client.get_inference_statistics("simple_batching"))[
            "model_stats"
        ][0]
    finally:
        await stats_client.close()
    # Each request got its own rows back, not a neighbour's.
    for i, out in enumerate(outputs):
        np.testing.assert_array_equal(out, np.arange(16, dtype=np.int32).reshape(1, 16) + i)
    inferences = after_entry["inference_count"] - before[0]
    executions = after_entry["execution_count"] - before[1]
    assert inferences == 16
    assert executions < 16, f"16 concurrent requests ran in {executions} executions"
    assert max(b["batch_size"] for b in after_entry["batch_stats"]) > 1
    assert all(b["batch_size"] <= 8 for b in after_entry["batch_stats"])  # max_batch_size


async def test_grpc_concurrent_requests_batch_too(server: ServerProcess) -> None:
    outputs = await _concurrent(grpcaio, server.grpc_url, "simple_batching", 8)
    for i, out in enumerate(outputs):
        np.testing.assert_array_equal(out, np.arange(16, dtype=np.int32).reshape(1, 16) + i)


async def test_without_dynamic_batching_each_request_executes_alone(server: ServerProcess) -> None:
    client = httpaio.InferenceServerClient(server.http_url)
    try:
        before = _stats((await client.get_inference_statistics("simple"))["model_stats"][0])
        await _concurrent(httpaio, server.http_url, "simple", 8)
        after = _stats((await client.get_inference_statistics("simple"))["model_stats"][0])
    finally:
        await client.close()
    assert after[0] - before[0] == 8
    assert after[1] - before[1] == 8
