"""Built-in closed-loop load generator: N concurrent workers in one asyncio process.

    python -m bench.loadgen --protocol http-json --url 127.0.0.1:8000 --model simple \
        [--concurrency 8] [--seconds 4] [--core 1]
    python -m bench.loadgen --protocol grpc --grpc-url 127.0.0.1:8001 --model simple ...

Protocols: http-json (KServe v2 JSON tensors, no binary extension), http-binary (Triton's binary
tensor extension, inputs and outputs) and grpc (raw_input_contents). The request is built once from
the model's metadata (read over HTTP, or over gRPC for grpc; batch 1, random data) and re-sent, so
the client spends its time on the wire and on reading responses, not on encoding. Warm-up lasts
until every worker has a reply and at least WARMUP_S has passed; then the requests that complete
inside the window are counted.
Prints one JSON line: bench.common.Stats plus errors, first_error and client_cpu_pct.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import urllib.request
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import numpy as np
import orjson

from bench.common import pin_to_core, summarize
from edge_backends.datatypes import BY_TRITON

PROTOCOLS = ("http-json", "http-binary", "grpc")
WARMUP_S = 1.0
WARMUP_LIMIT_S = 60.0
DRAIN_LIMIT_S = 30.0
MAX_MESSAGE_BYTES = 256 * 1024 * 1024

Send = Callable[[], Awaitable[None]]


@dataclass(frozen=True)
class Tensor:
    name: str
    datatype: str
    data: np.ndarray


@dataclass(frozen=True)
class Request:
    model: str
    inputs: list[Tensor]
    outputs: list[str]


def fetch_metadata(http_url: str, model: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://{http_url}/v2/models/{model}", timeout=10) as resp:
        meta: dict[str, Any] = json.loads(resp.read())
    return meta


def fetch_grpc_metadata(grpc_url: str, model: str) -> dict[str, Any]:
    """The model's metadata over gRPC, shaped like the HTTP answer (a gRPC-only ceiling has no
    HTTP port)."""
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    with grpc.insecure_channel(grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        meta = stub.ModelMetadata(service_pb2.ModelMetadataRequest(name=model), timeout=10)

    def tensors(specs: Any) -> list[dict[str, Any]]:
        return [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in specs]

    return {"name": meta.name, "inputs": tensors(meta.inputs), "outputs": tensors(meta.outputs)}


def random_tensor(spec: dict[str, Any], rng: np.random.Generator) -> Tensor:
    known = BY_TRITON.get(spec["datatype"])
    dtype = known.numpy if known is not None and known.itemsize else None
    if dtype is None:
        raise ValueError(f"input '{spec['name']}': datatype {spec['datatype']} is not supported")
    shape = [1 if d < 0 else int(d) for d in spec["shape"]]
    if np.issubdtype(dtype, np.floating):
        data = rng.random(shape).astype(dtype)
    else:
        data = rng.integers(0, 100, size=shape).astype(dtype)
    return Tensor(spec["name"], spec["datatype"], data)


def build_request(meta: dict[str, Any], seed: int = 0) -> Request:
    rng = np.random.default_rng(seed)
    return Request(
        model=meta["name"],
        inputs=[random_tensor(spec, rng) for spec in meta["inputs"]],
        outputs=[spec["name"] for spec in meta["outputs"]],
    )


def json_body(req: Request) -> bytes:
    return orjson.dumps(
        {
            "inputs": [
                {
                    "name": t.name,
                    "shape": list(t.data.shape),
                    "datatype": t.datatype,
                    "data": t.data.ravel().tolist(),
                }
                for t in req.inputs
            ],
            "outputs": [{"name": name} for name in req.outputs],
        }
    )


def binary_body(req: Request) -> tuple[bytes, int]:
    """The binary-extension body and its JSON header's length."""
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": t.name,
                    "shape": list(t.data.shape),
                    "datatype": t.datatype,
                    "parameters": {"binary_data_size": t.data.nbytes},
                }
                for t in req.inputs
            ],
            "outputs": [
                {"name": name, "parameters": {"binary_data": True}} for name in req.outputs
            ],
        }
    )
    return header + b"".join(t.data.tobytes() for t in req.inputs), len(header)


def http_sender(session: aiohttp.ClientSession, url: str, req: Request, binary: bool) -> Send:
    target = f"http://{url}/v2/models/{req.model}/infer"
    # No compressed responses, like perf_analyzer and tritonclient (aiohttp asks for gzip).
    headers = {"Accept-Encoding": "identity"}
    if binary:
        body, header_len = binary_body(req)
        headers |= {
            "Content-Type": "application/octet-stream",
            "Inference-Header-Content-Length": str(header_len),
        }
    else:
        body = json_body(req)
        headers["Content-Type"] = "application/json"

    async def send() -> None:
        async with session.post(target, data=body, headers=headers) as resp:
            payload = await resp.read()
            if resp.status != 200:
                raise RuntimeError(f"HTTP {resp.status}: {payload[:300]!r}")
            split = int(resp.headers.get("Inference-Header-Content-Length", len(payload)))
            orjson.loads(payload[:split])

    return send


def grpc_sender(channel: Any, req: Request) -> Send:
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    message = service_pb2.ModelInferRequest(model_name=req.model)
    for t in req.inputs:
        message.inputs.add(name=t.name, datatype=t.datatype, shape=list(t.data.shape))
        message.raw_input_contents.append(t.data.tobytes())
    for name in req.outputs:
        message.outputs.add(name=name)

    async def send() -> None:
        await stub.ModelInfer(message)

    return send


@dataclass
class Recorder:
    """Completion times and latencies of every request, and the warm-up signal."""

    concurrency: int
    warmed: asyncio.Event
    done: list[tuple[float, float]] = field(default_factory=list)
    replied: set[int] = field(default_factory=set)
    errors: int = 0
    first_error: str | None = None

    def reply(self, worker: int) -> None:
        self.replied.add(worker)
        if len(self.replied) == self.concurrency:
            self.warmed.set()

    def fail(self, worker: int, exc: BaseException) -> None:
        self.errors += 1
        if self.first_error is None:
            self.first_error = f"{type(exc).__name__}: {exc}"[:500]
        self.reply(worker)


async def worker(index: int, send: Send, stop: asyncio.Event, rec: Recorder) -> None:
    while not stop.is_set():
        t0 = time.perf_counter()
        try:
            await send()
        except Exception as exc:
            rec.fail(index, exc)
            await asyncio.sleep(0.01)
            continue
        t1 = time.perf_counter()
        rec.done.append((t1, t1 - t0))
        rec.reply(index)


async def drive(send: Send, concurrency: int, seconds: float) -> dict[str, Any]:
    stop = asyncio.Event()
    rec = Recorder(concurrency, asyncio.Event())
    tasks = [asyncio.ensure_future(worker(i, send, stop, rec)) for i in range(concurrency)]
    started = time.perf_counter()
    try:
        await asyncio.wait_for(rec.warmed.wait(), WARMUP_LIMIT_S)
        await asyncio.sleep(max(0.0, WARMUP_S - (time.perf_counter() - started)))
        cpu0, w0 = time.process_time(), time.perf_counter()
        await asyncio.sleep(seconds)
        cpu1, w1 = time.process_time(), time.perf_counter()
    finally:
        stop.set()
        _, pending = await asyncio.wait(tasks, timeout=DRAIN_LIMIT_S)
        for task in pending:
            task.cancel()
    latencies = [lat for end, lat in rec.done if w0 <= end <= w1]
    stats = summarize(latencies, w1 - w0)
    return {
        **stats.as_dict(),
        "errors": rec.errors,
        "first_error": rec.first_error,
        "client_cpu_pct": 100.0 * (cpu1 - cpu0) / (w1 - w0),
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.protocol == "grpc":
        import grpc

        req = build_request(fetch_grpc_metadata(args.grpc_url, args.model))
        options = [
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ]
        async with grpc.aio.insecure_channel(args.grpc_url, options=options) as channel:
            return await drive(grpc_sender(channel, req), args.concurrency, args.seconds)
    req = build_request(fetch_metadata(args.url, args.model))
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        send = http_sender(session, args.url, req, binary=args.protocol == "http-binary")
        return await drive(send, args.concurrency, args.seconds)


def install_uvloop() -> None:
    try:
        import uvloop
    except ImportError:
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.loadgen")
    parser.add_argument("--protocol", choices=PROTOCOLS, required=True)
    parser.add_argument("--url", help="HTTP host:port (for the HTTP protocols)")
    parser.add_argument("--grpc-url", help="gRPC host:port (for --protocol grpc)")
    parser.add_argument("--model", required=True)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--core", type=int, default=None, help="pin the client to this core")
    args = parser.parse_args(argv)
    if args.protocol == "grpc" and not args.grpc_url:
        parser.error("--protocol grpc needs --grpc-url")
    if args.protocol != "grpc" and not args.url:
        parser.error(f"--protocol {args.protocol} needs --url")
    if args.core is not None:
        pin_to_core(args.core)
    install_uvloop()
    print(json.dumps(asyncio.run(run(args))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
