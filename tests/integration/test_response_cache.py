"""The response cache through tritonclient: hits skip execution and show in the statistics."""

from __future__ import annotations

import urllib.request

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.serverproc import ServerProcess


def _infer(client, module, value: int, outputs=None):  # type: ignore[no-untyped-def]
    a = np.full((1, 16), value, dtype=np.int32)
    inputs = [module.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(np.ones((1, 16), np.int32))
    return client.infer("cached", inputs, outputs=outputs)


def test_repeated_request_is_served_from_the_cache(server: ServerProcess) -> None:
    http = httpclient.InferenceServerClient(server.http_url)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    before = http.get_inference_statistics("cached")["model_stats"][0]
    first = _infer(http, httpclient, 41)
    np.testing.assert_array_equal(first.as_numpy("OUTPUT0"), np.full((1, 16), 42))
    again = _infer(grpc, grpcclient, 41)  # same inputs, other protocol: a hit
    np.testing.assert_array_equal(again.as_numpy("OUTPUT1"), np.full((1, 16), 40))
    subset = _infer(http, httpclient, 41, [httpclient.InferRequestedOutput("OUTPUT1")])
    np.testing.assert_array_equal(subset.as_numpy("OUTPUT1"), np.full((1, 16), 40))
    assert subset.as_numpy("OUTPUT0") is None
    other = _infer(http, httpclient, 7)  # new inputs: a miss
    np.testing.assert_array_equal(other.as_numpy("OUTPUT0"), np.full((1, 16), 8))

    after = http.get_inference_statistics("cached")["model_stats"][0]
    stats, old = after["inference_stats"], before["inference_stats"]
    assert stats["cache_hit"]["count"] - old["cache_hit"]["count"] == 2
    assert stats["cache_miss"]["count"] - old["cache_miss"]["count"] == 2
    assert stats["success"]["count"] - old["success"]["count"] == 4
    assert after["execution_count"] - before["execution_count"] == 2  # hits did not run

    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics") as resp:
        metrics = resp.read().decode()
    assert 'nv_cache_num_hits_per_model{model="cached",version="1"}' in metrics
    assert "nv_cache_num_entries" in metrics


def test_models_without_response_cache_always_run(server: ServerProcess) -> None:
    http = httpclient.InferenceServerClient(server.http_url)
    before = http.get_inference_statistics("simple")["model_stats"][0]
    inputs = [httpclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    for inp in inputs:
        inp.set_data_from_numpy(np.ones((1, 16), np.int32))
    http.infer("simple", inputs)
    http.infer("simple", inputs)
    after = http.get_inference_statistics("simple")["model_stats"][0]
    assert after["execution_count"] - before["execution_count"] == 2
    assert after["inference_stats"]["cache_hit"]["count"] == 0
