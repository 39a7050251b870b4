"""Ensembles: steps wired by tensor names, parallel branches, clear load errors."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.serverproc import ServerProcess


@pytest.mark.parametrize("module", [httpclient, grpcclient])
def test_ensemble_of_parallel_steps(server: ServerProcess, module) -> None:  # type: ignore[no-untyped-def]
    url = server.http_url if module is httpclient else server.grpc_url
    client = module.InferenceServerClient(url)
    before = {
        v: client.get_inference_statistics("versioned_all", v, as_json=True)
        if module is grpcclient
        else client.get_inference_statistics("versioned_all", v)
        for v in ("1", "2")
    }
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    inp = module.InferInput("IN", [2, 4], "FP32")
    inp.set_data_from_numpy(x)
    result = client.infer("ensemble_parallel", [inp])
    np.testing.assert_array_equal(result.as_numpy("SUM"), (x + 1) + (x + 2))
    np.testing.assert_array_equal(result.as_numpy("DIFF"), np.full((2, 4), -1, np.float32))
    # each step ran on its own model, which counted it
    for version in ("1", "2"):
        after = (
            client.get_inference_statistics("versioned_all", version, as_json=True)
            if module is grpcclient
            else client.get_inference_statistics("versioned_all", version)
        )
        # gRPC's JSON leaves a zero count out (proto3), as for a model nothing ran on yet.
        count = int(after["model_stats"][0].get("inference_count", 0))
        assert count - int(before[version]["model_stats"][0].get("inference_count", 0)) == 2
    meta = httpclient.InferenceServerClient(server.http_url).get_model_metadata("ensemble_parallel")
    assert meta["platform"] == "ensemble"


def test_ensemble_input_is_validated_like_any_model(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    inp = httpclient.InferInput("IN", [1, 3], "FP32")
    inp.set_data_from_numpy(np.zeros((1, 3), np.float32))
    with pytest.raises(InferenceServerException, match="unexpected shape for input 'IN'"):
        client.infer("ensemble_parallel", [inp])


@pytest.mark.parametrize(
    ("model", "reason"),
    [
        ("ensemble_missing_model", "calls model 'no_such_model', which is not in the model"),
        (
            "ensemble_bad_wiring",
            "step 2 ('add_sub_fp32') input 'INPUT1' reads tensor 'B', which no",
        ),
    ],
)
def test_broken_ensembles_fail_to_load_with_the_reason(
    server: ServerProcess, model: str, reason: str
) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    index = {e["name"]: e for e in client.get_model_repository_index()}
    assert index[model]["state"] == "UNAVAILABLE"
    assert reason in index[model]["reason"]
    assert not client.is_model_ready(model)
