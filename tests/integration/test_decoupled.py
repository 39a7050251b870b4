"""Decoupled Python models: zero to many responses per request over ModelStreamInfer."""

from __future__ import annotations

import queue

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.serverproc import ServerProcess


def _stream(server: ServerProcess, counts: dict[str, int]) -> dict[str, list[int]]:
    """Send one request per id; collect each id's values until its final (empty) response."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    results: queue.Queue = queue.Queue()  # type: ignore[type-arg]
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    got: dict[str, list[int]] = {rid: [] for rid in counts}
    try:
        for rid, count in counts.items():
            inp = grpcclient.InferInput("IN", [1], "INT32")
            inp.set_data_from_numpy(np.array([count], dtype=np.int32))
            client.async_stream_infer(
                "py_repeat", [inp], request_id=rid, enable_empty_final_response=True
            )
        open_ids = set(counts)
        while open_ids:
            result, error = results.get(timeout=30)
            assert error is None, error
            response = result.get_response()
            if response.parameters["triton_final_response"].bool_param:
                open_ids.discard(response.id)
                assert result.as_numpy("OUT") is None  # the final one carries no outputs
                continue
            got[response.id].append(int(result.as_numpy("OUT")[0]))
    finally:
        client.stop_stream()
    return got


def test_decoupled_model_streams_n_responses_and_none(server: ServerProcess) -> None:
    got = _stream(server, {"five": 5, "none": 0, "two": 2})
    assert got == {"five": [0, 1, 2, 3, 4], "none": [], "two": [0, 1]}


def test_non_decoupled_model_on_the_stream_gets_one_final_response(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    results: queue.Queue = queue.Queue()  # type: ignore[type-arg]
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        inp = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
        inp.set_data_from_numpy(np.ones((1, 4), np.float32))
        client.async_stream_infer("identity_fp32", [inp], enable_empty_final_response=True)
        result, error = results.get(timeout=30)
    finally:
        client.stop_stream()
    assert error is None
    assert result.get_response().parameters["triton_final_response"].bool_param
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.ones((1, 4), np.float32))


def test_decoupled_model_refuses_plain_infer(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    inp = httpclient.InferInput("IN", [1], "INT32")
    inp.set_data_from_numpy(np.array([1], dtype=np.int32))
    with pytest.raises(InferenceServerException, match="is decoupled") as err:
        client.infer("py_repeat", [inp])
    assert err.value.status() == "501"
