"""The default queue-wait bound serves what tritonserver serves and still refuses an overload.

With the defaults, admission refuses a request only when the work ahead of it would take
longer than 1 s or 16 of the model's measured executions, whichever is longer
(policy.queue_wait_bound_ns). So a finite burst of concurrent slow requests, several times the
service time deep, is queued and served, as tritonserver serves it (over HTTP, gRPC, and a
gRPC stream to a decoupled model); a burst far past 16 executions deep is still refused at once.
"""

from __future__ import annotations

import asyncio
import queue
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http.aio as httpaio
from tritonclient.utils import InferenceServerException

from configs.generate import REPEAT_CONFIG, REPEAT_MODEL
from tests.serverproc import ServerProcess

SERVICE_S = 0.25

SLEEPER = f"""
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        time.sleep({SERVICE_S})
        inputs = [pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() for r in requests]
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]) for x in inputs]
"""

SLEEPER_CONFIG = """
name: "{name}" backend: "python" max_batch_size: 1
input [ {{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 4 ] }} ]
dynamic_batching {{ }}
"""

MODELS = ("slow_http", "slow_grpc", "slow_flood")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("queue_wait")
    for name in MODELS:
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(SLEEPER_CONFIG.format(name=name))
        (root / name / "1" / "model.py").write_text(SLEEPER)
    (root / "repeat_int32" / "1").mkdir(parents=True)
    (root / "repeat_int32" / "config.pbtxt").write_text(REPEAT_CONFIG)
    (root / "repeat_int32" / "1" / "model.py").write_text(REPEAT_MODEL)
    proc = ServerProcess(root, log_path=root / "server.log")  # the default flags
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()


async def _burst(module: Any, url: str, model: str, count: int) -> list[tuple[float, str]]:
    """(seconds, '' or the error) for each of `count` requests sent at once."""
    client = module.InferenceServerClient(url)
    try:

        async def one() -> tuple[float, str]:
            inp = module.InferInput("INPUT0", [1, 4], "FP32")
            inp.set_data_from_numpy(np.ones((1, 4), np.float32))
            started = time.monotonic()
            try:
                await client.infer(model, [inp])
                return time.monotonic() - started, ""
            except InferenceServerException as exc:
                return time.monotonic() - started, f"{exc.status()} {exc.message()}"

        return list(await asyncio.gather(*(one() for _ in range(count))))
    finally:
        await client.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
async def test_a_finite_burst_of_slow_requests_is_served(
    server: ServerProcess, protocol: str
) -> None:
    """14 concurrent requests to one instance of a 250 ms model: the last waits about 3.3 s,
    over the 1 s of --max-queue-wait-ms's default, but within 16 executions: all served."""
    module, url = (httpaio, server.http_url) if protocol == "http" else (grpcaio, server.grpc_url)
    model = f"slow_{protocol}"
    await _burst(module, url, model, 3)  # the scheduler learns the service time
    results = await _burst(module, url, model, 14)
    assert [error for _, error in results] == [""] * 14, results
    assert max(t for t, _ in results) > 14 * SERVICE_S * 0.9  # they did queue


def test_a_burst_of_slow_decoupled_requests_is_served(server: ServerProcess) -> None:
    """10 requests on one gRPC stream to a decoupled model whose every request streams 4
    responses over 400 ms: all 40 responses arrive, none refused."""
    responses: queue.Queue[Any] = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: responses.put(error or result))

    def send(request_id: str) -> None:
        inputs = [
            grpcclient.InferInput("IN", [4], "INT32"),
            grpcclient.InferInput("DELAY", [4], "UINT32"),
            grpcclient.InferInput("WAIT", [1], "UINT32"),
        ]
        inputs[0].set_data_from_numpy(np.arange(4, dtype=np.int32))
        inputs[1].set_data_from_numpy(np.full(4, 100, dtype=np.uint32))
        inputs[2].set_data_from_numpy(np.zeros(1, dtype=np.uint32))
        client.async_stream_infer("repeat_int32", inputs, request_id=request_id)

    try:
        for i in range(2):  # the scheduler learns the service time
            send(f"warm{i}")
        warm = [responses.get(timeout=30) for _ in range(8)]
        assert not [r for r in warm if isinstance(r, InferenceServerException)], warm
        for i in range(10):
            send(str(i))
        got = [responses.get(timeout=30) for _ in range(40)]
    finally:
        client.stop_stream()
    errors = [r for r in got if isinstance(r, InferenceServerException)]
    assert not errors, errors[0]
    ids = sorted(r.get_response().id for r in got)
    assert ids == sorted(str(i) for i in range(10) for _ in range(4))


async def test_an_overload_is_still_refused_at_once(server: ServerProcess) -> None:
    """60 concurrent requests would keep the last waiting 15 s, past 16 executions (4 s):
    the excess is refused with 503 at once, and the admitted wait stays near the bound."""
    await _burst(httpaio, server.http_url, "slow_flood", 3)
    results = await _burst(httpaio, server.http_url, "slow_flood", 60)
    admitted = [t for t, error in results if not error]
    refused = [(t, error) for t, error in results if error]
    assert len(admitted) >= 16, results
    assert len(refused) >= 20, results
    assert all(error.startswith("503") and "overloaded" in error for _, error in refused)
    assert "16 executions" in refused[0][1], refused[0][1]
    # Refused before the work ahead of them would have finished (the bound is ~4 s).
    assert sorted(t for t, _ in refused)[len(refused) // 2] < 2.0, refused
    # Admitted requests waited about the bound plus their own execution, with slack for a
    # busy 2-core machine.
    assert max(admitted) < 16 * SERVICE_S * 1.25 + 2 * SERVICE_S + 2.0, max(admitted)
