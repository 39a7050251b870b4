"""CUDA shared memory through the real server: the client's device memory, shared by IPC
handle, carries the inputs and receives the outputs of Triton's `simple` model."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from edge_backends.cuda_device import CudaDevice
from tests.gpu.conftest import device_or_skip
from tests.serverproc import ServerProcess

pytestmark = pytest.mark.gpu


@pytest.fixture
def dev() -> CudaDevice:
    return device_or_skip()  # before the server starts: no GPU, no server


def test_simple_model_reads_and_writes_cuda_regions(dev: CudaDevice, server: ServerProcess) -> None:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 3, dtype=np.int32)
    with dev.activate():
        inputs = dev.alloc(128)
        outputs = dev.alloc(128)
        dev.copy_to_device(inputs, np.concatenate([a, b]).reshape(-1), None)
        dev.synchronize(None)
        in_handle, out_handle = dev.ipc_handle(inputs), dev.ipc_handle(outputs)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    http = httpclient.InferenceServerClient(server.http_url)
    try:
        grpc.register_cuda_shared_memory("in", in_handle, 0, 128)
        grpc.register_cuda_shared_memory("out", out_handle, 0, 128)
        assert {r["name"] for r in http.get_cuda_shared_memory_status()} == {"in", "out"}
        tensors = [grpcclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
        tensors[0].set_shared_memory("in", 64, offset=0)
        tensors[1].set_shared_memory("in", 64, offset=64)
        wanted = [grpcclient.InferRequestedOutput(n) for n in ("OUTPUT0", "OUTPUT1")]
        wanted[0].set_shared_memory("out", 64, offset=0)
        wanted[1].set_shared_memory("out", 64, offset=64)
        grpc.infer("simple", tensors, outputs=wanted)
        host = np.empty(32, dtype=np.int32)
        with dev.activate():
            dev.copy_to_host(host, outputs, None)
            dev.synchronize(None)
        np.testing.assert_array_equal(host[:16], (a + b).reshape(-1))
        np.testing.assert_array_equal(host[16:], (a - b).reshape(-1))
    finally:
        grpc.unregister_cuda_shared_memory()
        with dev.activate():
            dev.free(inputs)
            dev.free(outputs)
    assert http.get_cuda_shared_memory_status() == []
