"""Big binary tensors take the one-copy read and the streamed answer; results stay exact."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.serverproc import ServerProcess


@pytest.mark.parametrize("compression", [None, "gzip"])
def test_big_binary_tensor_round_trip(server: ServerProcess, compression: str | None) -> None:
    data = np.random.default_rng(1).random((2, 1 << 19), dtype=np.float32)  # 4 MiB
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=120)
    inp = httpclient.InferInput("INPUT0", list(data.shape), "FP32")
    inp.set_data_from_numpy(data, binary_data=True)
    out = httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)
    result = client.infer(
        "identity_fp32", [inp], outputs=[out], request_compression_algorithm=compression
    )
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)


def test_big_binary_input_with_json_output(server: ServerProcess) -> None:
    data = np.arange(1 << 15, dtype=np.float32).reshape(1, -1)  # 128 KiB in, JSON out
    client = httpclient.InferenceServerClient(server.http_url)
    inp = httpclient.InferInput("INPUT0", list(data.shape), "FP32")
    inp.set_data_from_numpy(data, binary_data=True)
    out = httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)
    result = client.infer("identity_fp32", [inp], outputs=[out])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)
