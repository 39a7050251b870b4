"""Instance groups: several groups, GPU kinds falling back to CPU visibly, the rate limiter."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient
import tritonclient.http.aio as httpaio

from tests.serverproc import ServerProcess


def test_gpu_group_without_a_gpu_runs_on_cpu_and_says_so(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    assert client.is_model_ready("multi_group")
    index = {e["name"]: e for e in client.get_model_repository_index()}
    reason = index["multi_group"]["reason"]
    assert index["multi_group"]["state"] == "READY"
    assert "1 KIND_GPU instance(s) of group 'gpus' run on CPU" in reason
    assert "no usable GPU" in reason
    assert "run on CPU" in server.log()
    config = client.get_model_config("multi_group")
    assert [(g["name"], g["count"]) for g in config["instance_group"]] == [("cpus", 2), ("gpus", 1)]
    # The served config says where the instances really run.
    assert [g["kind"] for g in config["instance_group"]] == ["KIND_CPU", "KIND_CPU"]


async def _burst(url: str, count: int) -> list[np.ndarray]:
    client = httpaio.InferenceServerClient(url)
    try:

        async def one(i: int) -> np.ndarray:
            inputs = [httpaio.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
            inputs[0].set_data_from_numpy(np.full((1, 16), i, np.int32))
            inputs[1].set_data_from_numpy(np.ones((1, 16), np.int32))
            return (await client.infer("multi_group", inputs)).as_numpy("OUTPUT0")

        return await asyncio.gather(*(one(i) for i in range(count)))
    finally:
        await client.close()


def test_three_instances_serve_concurrent_requests(server: ServerProcess) -> None:
    outputs = asyncio.run(_burst(server.http_url, 12))
    for i, out in enumerate(outputs):
        np.testing.assert_array_equal(out, np.full((1, 16), i + 1))


def test_rate_limited_server_still_serves(
    start_server, model_repository: Path, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    repo = tmp_path / "repo"
    # A copy: symlinks out of a repository are not followed (tests/integration/test_path_safety).
    shutil.copytree(model_repository / "multi_group", repo / "multi_group")
    proc = start_server(repo, "--rate-limit=execution_count", "--rate-limit-resource=R:1")
    outputs = asyncio.run(_burst(proc.http_url, 12))
    for i, out in enumerate(outputs):
        np.testing.assert_array_equal(out, np.full((1, 16), i + 1))
