"""The memory a burst of large gRPC calls takes comes back after it (issue 17, item 4): glibc
keeps what gRPC, protobuf, numpy and ONNX Runtime freed unless it is trimmed
(appliance/ops/memory.py). bench/grpc_memory.py measures the same load with its numbers."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from onnx import TensorProto

from appliance.common.protocol import service_pb2 as pb
from appliance.common.protocol import service_pb2_grpc
from configs.generate import identity_model, save
from tests.serverproc import ServerProcess

IDENTITY_CONFIG = """\
name: "identity_fp32"
backend: "onnxruntime"
max_batch_size: 8
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
"""


def _identity_repository(root: Path) -> Path:
    save(identity_model(TensorProto.FLOAT, ["batch", "n"]), root / "identity_fp32/1/model.onnx")
    (root / "identity_fp32" / "config.pbtxt").write_text(IDENTITY_CONFIG)
    return root


@pytest.fixture(scope="module")
def identity_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = _identity_repository(tmp_path_factory.mktemp("models"))
    proc = ServerProcess(root, log_path=tmp_path_factory.mktemp("logs") / "server.log")
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()


def _request(elements: int, request_id: str = "") -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name="identity_fp32", id=request_id)
    tensor = message.inputs.add(name="INPUT0", datatype="FP32")
    tensor.shape.extend([1, elements])
    message.raw_input_contents.append(np.ones(elements, np.float32).tobytes())
    return message


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


async def _burst(url: str, clients: int, seconds: float, elements: int) -> Counter[str]:
    """`clients` separate connections, each sending large requests back to back."""
    codes: Counter[str] = Counter()
    message = _request(elements)
    end = time.monotonic() + seconds
    options = [
        ("grpc.max_send_message_length", 64 * 2**20),
        ("grpc.max_receive_message_length", 64 * 2**20),
        ("grpc.use_local_subchannel_pool", 1),  # a connection each, as separate devices
    ]

    async def client() -> None:
        async with grpc.aio.insecure_channel(url, options=options) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            while time.monotonic() < end:
                try:
                    await stub.ModelInfer(message, timeout=60)
                    codes["OK"] += 1
                except grpc.aio.AioRpcError as exc:
                    codes[exc.code().name] += 1
                    await asyncio.sleep(0.05)

    await asyncio.gather(*(client() for _ in range(clients)))
    return codes


def test_memory_taken_by_a_burst_of_large_calls_comes_back(
    identity_server: ServerProcess,
) -> None:
    """256 clients sending 588 KiB requests (a DenseNet image) for 5 s. Before: RSS idle 120
    MiB, still 363 MiB 30 s after the load (freed, but kept by glibc's malloc)."""
    pid = identity_server.proc.pid
    asyncio.run(_burst(identity_server.grpc_url, 4, 1.0, 588 * 256))  # warm every code path
    idle = _rss_mib(pid)
    codes = asyncio.run(_burst(identity_server.grpc_url, 256, 5.0, 588 * 256))
    assert set(codes) <= {"OK", "UNAVAILABLE"}, codes
    assert codes["OK"] > 0
    after = _rss_mib(pid)
    deadline = time.monotonic() + 30  # the trimmer runs every 5 s; generous for a busy host
    while after > idle * 1.2 and time.monotonic() < deadline:
        time.sleep(0.5)
        after = _rss_mib(pid)
    assert after <= idle * 1.2, f"RSS idle {idle:.0f} MiB, still {after:.0f} MiB after the load"
