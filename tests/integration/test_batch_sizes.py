"""Dynamic batching past the preferred sizes, as Triton does it: a queue that built up behind a
busy instance runs as one batch up to max_batch_size once its oldest request has waited
max_queue_delay_microseconds; the preferred sizes are preferences, not caps.

The model is a Python model that takes a fixed time per execution and answers each request
with the batch size it ran in (the rows of all the requests execute() got at once).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
import tritonclient.http.aio as httpaio

from tests.serverproc import ServerProcess

REPORTER = """
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        time.sleep(0.4)
        rows = [
            pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy().shape[0] for r in requests
        ]
        batch = sum(rows)  # the dynamic batcher's batch: these requests together
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("BATCH", np.full((n, 1), batch, np.int32))])
            for n in rows
        ]
"""

CONFIG = """
name: "{name}" backend: "python" max_batch_size: 8
input [ {{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 4 ] }} ]
output [ {{ name: "BATCH", data_type: TYPE_INT32, dims: [ 1 ] }} ]
dynamic_batching {{ preferred_batch_size: [ 2 ], max_queue_delay_microseconds: 100000 }}
"""

MODELS = ("batch_http", "batch_grpc")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("batch_sizes")
    for name in MODELS:
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(CONFIG.format(name=name))
        (root / name / "1" / "model.py").write_text(REPORTER)
    proc = ServerProcess(root, log_path=root / "server.log")  # the default flags
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()


async def _burst(module, url: str, model: str, count: int) -> list[int]:  # type: ignore[no-untyped-def]
    """The batch size each of `count` concurrent requests ran in."""
    client = module.InferenceServerClient(url)
    try:

        async def one() -> int:
            inp = module.InferInput("INPUT0", [1, 4], "FP32")
            inp.set_data_from_numpy(np.zeros((1, 4), np.float32))
            result = await client.infer(model, [inp])
            return int(result.as_numpy("BATCH")[0, 0])

        return list(await asyncio.gather(*(one() for _ in range(count))))
    finally:
        await client.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
async def test_a_queue_behind_a_busy_instance_runs_past_the_preferred_size(
    server: ServerProcess, protocol: str
) -> None:
    module, url = (httpaio, server.http_url) if protocol == "http" else (grpcaio, server.grpc_url)
    model = f"batch_{protocol}"
    # Twice: the second round runs with what the first taught the scheduler (its admission
    # estimate among it), and every request of both rounds must succeed with the defaults.
    for _ in range(2):
        sizes = await _burst(module, url, model, 10)
        # The first request waits 100 ms for company and runs with the second (the preferred
        # size, 2); the other 8 queue behind that 400 ms execution, so their oldest has waited
        # past the 100 ms delay when the instance frees: one batch of 8 (max_batch_size), not
        # four of 2.
        assert max(sizes) > 2, sizes
        assert all(size <= 8 for size in sizes), sizes
        assert sorted(sizes).count(max(sizes)) == max(sizes), sizes  # whole batches
    stats = httpclient.InferenceServerClient(server.http_url).get_inference_statistics(model)
    batch_stats = stats["model_stats"][0]["batch_stats"]
    assert max(int(b["batch_size"]) for b in batch_stats) > 2, batch_stats
