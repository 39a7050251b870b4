"""Sequence batching: per-sequence order and implicit state, controls, ids, timeouts."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.serverproc import ServerProcess


def _value(module, value: int):  # type: ignore[no-untyped-def]
    inp = module.InferInput("INPUT", [1, 1], "INT32")
    inp.set_data_from_numpy(np.array([[value]], dtype=np.int32))
    return [inp]


@pytest.mark.parametrize("module", [httpclient, grpcclient])
def test_interleaved_sequences_keep_their_own_running_sums(server: ServerProcess, module) -> None:  # type: ignore[no-untyped-def]
    client = module.InferenceServerClient(
        server.http_url if module is httpclient else server.grpc_url
    )
    seqs = {1001: [1, 2, 3, 4], 1002: [10, 20, 30, 40]}
    sums: dict[int, list[int]] = {1001: [], 1002: []}
    for step in range(4):
        for sid, values in seqs.items():
            result = client.infer(
                "running_sum",
                _value(module, values[step]),
                sequence_id=sid,
                sequence_start=step == 0,
                sequence_end=step == 3,
            )
            sums[sid].append(int(result.as_numpy("OUTPUT")[0, 0]))
            assert int(result.as_numpy("CORR")[0, 0]) == sid  # the CORRID control input
    assert sums == {1001: [1, 3, 6, 10], 1002: [10, 30, 60, 100]}


async def test_concurrent_sequences_stay_correct(server: ServerProcess) -> None:
    client = grpcaio.InferenceServerClient(server.grpc_url)
    before = (await client.get_inference_statistics("running_sum", as_json=True))["model_stats"][0]

    async def sequence(sid: int) -> list[int]:
        out = []
        for step in range(5):
            result = await client.infer(
                "running_sum",
                _value(grpcaio, sid % 100 + step),
                sequence_id=sid,
                sequence_start=step == 0,
                sequence_end=step == 4,
            )
            out.append(int(result.as_numpy("OUTPUT")[0, 0]))
        return out

    try:
        results = await asyncio.gather(*(sequence(2000 + i) for i in range(8)))
        after = (await client.get_inference_statistics("running_sum", as_json=True))["model_stats"][
            0
        ]
    finally:
        await client.close()
    for i, sums in enumerate(results):
        values = [i + step for step in range(5)]
        assert sums == list(np.cumsum(values))
    inferences = int(after["inference_count"]) - int(before.get("inference_count", 0))
    assert inferences == 40  # batching across sequences is checked in tests/unit


def test_string_sequence_ids(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    first = client.infer(
        "running_sum_short", _value(httpclient, 5), sequence_id="cam-7", sequence_start=True
    )
    second = client.infer(
        "running_sum_short", _value(httpclient, 6), sequence_id="cam-7", sequence_end=True
    )
    assert int(first.as_numpy("OUTPUT")[0, 0]) == 5
    assert int(second.as_numpy("OUTPUT")[0, 0]) == 11


def test_request_for_an_unknown_sequence_is_refused(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    start = "must specify the START flag"
    with pytest.raises(
        InferenceServerException, match=f"for sequence 777 to model 'running_sum' {start}"
    ) as err:
        client.infer("running_sum", _value(httpclient, 1), sequence_id=777)
    assert err.value.status() == "400"
    with pytest.raises(InferenceServerException, match="non-zero or non-empty correlation ID"):
        client.infer("running_sum", _value(httpclient, 1))


def test_an_idle_sequence_times_out(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.infer("running_sum_short", _value(grpcclient, 1), sequence_id=55, sequence_start=True)
    time.sleep(0.5)  # max_sequence_idle_microseconds is 200 ms
    with pytest.raises(
        InferenceServerException,
        match="for sequence 55 to model 'running_sum_short' must specify the START flag",
    ):
        client.infer("running_sum_short", _value(grpcclient, 1), sequence_id=55)
