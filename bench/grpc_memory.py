"""Server memory under many concurrent large gRPC requests, and after them (issue 17, item 4).

    python -m bench.grpc_memory [--concurrency 256] [--seconds 20] [--kib 588] [-- FLAGS...]

The server serves one slow model whose input is as large as a DenseNet image (3x224x224 FP32,
588 KiB); `--concurrency` clients (one grpc.aio channel each, like separate devices) send
requests back to back for `--seconds`. The server's RSS (VmRSS of the main process) is
sampled before the load, every 0.5 s during it and for 10 s after it; the table shows idle,
peak, and 1, 5 and 10 s after the load, and the answers by status code. FLAGS after `--` go to
`serve` (e.g. `--grpc-max-concurrent-rpcs 0` to measure without the bound).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import tempfile
import threading
import time
from pathlib import Path

import grpc
import numpy as np
import onnx
from onnx import TensorProto, helper

from appliance.common.protocol import service_pb2 as pb
from appliance.common.protocol import service_pb2_grpc
from bench.common import rss_mib
from bench.server import start_server, stop_server, wait_ready
from configs.generate import IR_VERSION, OPSET

MODEL = "big_input_slow"


def big_input_slow_model(elements: int, width: int = 1024, steps: int = 12) -> onnx.ModelProto:
    """OUTPUT0 = a chain of [width, width] MatMuls over the first `width` input elements: a
    large input, a small output and a few milliseconds of work per request."""
    nodes = [
        helper.make_node("Slice", ["INPUT0", "starts", "ends", "axes"], ["t"]),
    ]
    current = "t"
    for i in range(steps):
        nodes.append(helper.make_node("MatMul", [current, "W"], [f"m{i}"]))
        current = "OUTPUT0" if i == steps - 1 else f"t{i}"
        nodes.append(helper.make_node("Tanh", [f"m{i}"], [current]))
    graph = helper.make_graph(
        nodes,
        MODEL,
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", elements])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", width])],
        initializer=[
            helper.make_tensor("W", TensorProto.FLOAT, [width, width], [0.001] * width * width),
            helper.make_tensor("starts", TensorProto.INT64, [1], [0]),
            helper.make_tensor("ends", TensorProto.INT64, [1], [width]),
            helper.make_tensor("axes", TensorProto.INT64, [1], [1]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    return model


def write_repository(root: Path, elements: int) -> Path:
    folder = root / MODEL
    (folder / "1").mkdir(parents=True)
    onnx.save(big_input_slow_model(elements), str(folder / "1" / "model.onnx"))
    (folder / "config.pbtxt").write_text(
        f'name: "{MODEL}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
        f'input [ {{ name: "INPUT0", data_type: TYPE_FP32, dims: [ {elements} ] }} ]\n'
        'output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 1024 ] } ]\n'
        "dynamic_batching { }\n"
    )
    return root


def request(elements: int) -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name=MODEL)
    tensor = message.inputs.add(name="INPUT0", datatype="FP32")
    tensor.shape.extend([1, elements])
    message.raw_input_contents.append(np.ones(elements, np.float32).tobytes())
    return message


async def load(url: str, concurrency: int, seconds: float, elements: int) -> dict[str, int]:
    """`concurrency` clients, each on its own channel, requests back to back until the end."""
    codes: collections.Counter[str] = collections.Counter()
    message = request(elements)
    end = time.monotonic() + seconds
    size = 64 * 1024 * 1024
    options = [
        ("grpc.max_send_message_length", size),
        ("grpc.max_receive_message_length", size),
        # A connection per client, as separate devices have (channels share one by default).
        ("grpc.use_local_subchannel_pool", 1),
    ]

    async def client() -> None:
        async with grpc.aio.insecure_channel(url, options=options) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            while time.monotonic() < end:
                try:
                    await stub.ModelInfer(message, timeout=60)
                    codes["OK"] += 1
                except grpc.aio.AioRpcError as exc:
                    codes[f"{exc.code().name}: {(exc.details() or '')[:60]}"] += 1
                    await asyncio.sleep(0.05)  # a refused client retries, a little later

    await asyncio.gather(*(client() for _ in range(concurrency)))
    return dict(codes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--kib", type=int, default=588, help="input size in KiB")
    parser.add_argument("serve_flags", nargs="*")
    args = parser.parse_args()
    elements = args.kib * 1024 // 4
    with tempfile.TemporaryDirectory() as tmp:
        repository = write_repository(Path(tmp) / "models", elements)
        server = start_server(
            repository,
            None,
            Path(tmp) / "server.log",
            ["--max-queue-wait-ms", "0", *args.serve_flags],
        )
        try:
            wait_ready(server)
            pid = server.proc.pid
            time.sleep(2.0)
            idle = rss_mib(pid)
            samples: list[tuple[float, float]] = []
            stop = threading.Event()

            def sample() -> None:
                start = time.monotonic()
                while not stop.is_set():
                    samples.append((time.monotonic() - start, rss_mib(pid)))
                    stop.wait(0.5)

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            codes = asyncio.run(load(server.grpc_url, args.concurrency, args.seconds, elements))
            after = {}
            end = time.monotonic()
            for mark in (1.0, 5.0, 10.0):
                time.sleep(max(0.0, end + mark - time.monotonic()))
                after[mark] = rss_mib(pid)
            stop.set()
            sampler.join()
            peak = max(rss for _, rss in samples)
            print(
                f"{args.concurrency} clients x {args.kib} KiB for {args.seconds:g} s, "
                f"flags {' '.join(args.serve_flags) or '(defaults)'}"
            )
            print(f"answers: {codes}")
            print(
                f"RSS MiB: idle {idle:.0f}, peak {peak:.0f}, after 1 s {after[1.0]:.0f}, "
                f"5 s {after[5.0]:.0f}, 10 s {after[10.0]:.0f}"
            )
            assert server.alive(), server.log_tail()
        finally:
            stop_server(server)


if __name__ == "__main__":
    main()
