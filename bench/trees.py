"""Tree models (FIL configs): the server against raw ONNX Runtime and XGBoost itself.

    python -m bench.trees [--seconds 4] [--trees 200] [--depth 6] [--features 32]

An XGBoost binary classifier is trained here (fixed seed) and saved in a Triton FIL layout
(`predict_proba`, dynamic batching). Measured, one row per call:
- xgboost's own `inplace_predict`, in process (what the user had before);
- raw ONNX Runtime on the ONNX-ML file the fil backend converted it to, in process, with the
  threads the server gives one instance: the ceiling;
- the server, through bench.loadgen over binary HTTP and gRPC, at concurrency 1 and 8.
Also 64-row calls in process, to show what batching buys. The client shares the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bench import loadgen
from bench.server import start_server, stop_server, wait_ready
from edge_backends.params import usable_cpu_count

CONFIG = """\
backend: "fil"
max_batch_size: 64
input [ {{ name: "input__0", data_type: TYPE_FP32, dims: [ {features} ] }} ]
output [ {{ name: "output__0", data_type: TYPE_FP32, dims: [ 2 ] }} ]
parameters [
  {{ key: "model_type", value: {{ string_value: "xgboost_json" }} }},
  {{ key: "output_class", value: {{ string_value: "true" }} }},
  {{ key: "predict_proba", value: {{ string_value: "true" }} }}
]
dynamic_batching {{ }}
"""


def _train(args: argparse.Namespace, root: Path) -> Any:
    import xgboost

    rng = np.random.default_rng(0)
    x = rng.random((20_000, args.features), dtype=np.float32)
    y = (x[:, 0] + 0.5 * x[:, 1] + rng.normal(0, 0.1, len(x)) > 0.75).astype(np.int32)
    model = xgboost.XGBClassifier(
        n_estimators=args.trees, max_depth=args.depth, random_state=0, n_jobs=1
    )
    model.fit(x, y)
    folder = root / "trees" / "1"
    folder.mkdir(parents=True)
    model.save_model(folder / "xgboost.json")
    (root / "trees" / "config.pbtxt").write_text(CONFIG.format(features=args.features))
    return model


def _rate(call: Callable[[], Any], rows: int, seconds: float) -> tuple[float, float]:
    """(rows per second, ms per call) over about `seconds`."""
    call()
    call()
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        call()
        count += 1
    wall = time.perf_counter() - start
    return count * rows / wall, 1000 * wall / count


def _in_process(args: argparse.Namespace, root: Path, model: Any) -> list[tuple[str, ...]]:
    import onnxruntime as ort

    from edge_backends.fil_convert import load_tree_model

    (root / "cache").mkdir()
    tree = load_tree_model(root / "trees" / "1" / "xgboost.json", "xgboost", root / "cache")
    options = ort.SessionOptions()
    options.intra_op_num_threads = usable_cpu_count()  # the server's default for one instance
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(str(tree.onnx_path), options, providers=["CPUExecutionProvider"])
    booster = model.get_booster()
    rows = []
    rng = np.random.default_rng(1)
    for batch in (1, 64):
        x = rng.random((batch, args.features), dtype=np.float32)
        expected = model.predict_proba(x)
        got = session.run([tree.output_name], {tree.input_name: x})[0]
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)  # the same model
        for name, call in (
            ("xgboost inplace_predict", lambda x=x: booster.inplace_predict(x)),
            ("onnxruntime (converted model)", lambda x=x: session.run(None, {tree.input_name: x})),
        ):
            rate, ms = _rate(call, batch, args.seconds)
            rows.append((name, str(batch), "1", f"{rate:,.0f}", f"{ms:.3f}"))
    return rows


async def _load(server: Any, protocol: str, rows: int, features: int, concurrency: int,
                seconds: float) -> dict[str, Any]:
    import aiohttp
    import grpc

    data = np.random.default_rng(2).random((rows, features), dtype=np.float32)
    request = loadgen.Request(
        model="trees", inputs=[loadgen.Tensor("input__0", "FP32", data)], outputs=["output__0"]
    )
    if protocol == "grpc":
        async with grpc.aio.insecure_channel(server.grpc_url) as channel:
            return await loadgen.drive(loadgen.grpc_sender(channel, request), concurrency, seconds)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        send = loadgen.http_sender(session, server.http_url, request, binary=True)
        return await loadgen.drive(send, concurrency, seconds)


def _served(args: argparse.Namespace, root: Path) -> list[tuple[str, ...]]:
    server = start_server(root, None, root / "server.log")
    table = []
    try:
        wait_ready(server)
        for protocol in ("http-binary", "grpc"):
            for rows, concurrency in ((1, 1), (1, 8), (64, 8)):
                result = asyncio.run(
                    _load(server, protocol, rows, args.features, concurrency, args.seconds)
                )
                if result["errors"]:
                    raise RuntimeError(f"{protocol}: {result['first_error']}")
                table.append((
                    f"server, {protocol}", str(rows), str(concurrency),
                    f"{result['infer_per_s'] * rows:,.0f}", f"{result['p50_ms']:.3f} (p50)",
                ))
    finally:
        stop_server(server)
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--trees", type=int, default=200)
    parser.add_argument("--depth", type=int, default=6)
    parser.add_argument("--features", type=int, default=32)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model = _train(args, root)
        rows = _in_process(args, root, model) + _served(args, root)
    print(f"XGBoost, {args.trees} trees of depth {args.depth}, {args.features} features; "
          f"{usable_cpu_count()} CPUs, {args.seconds:g} s per point")
    print("| path | rows per call | concurrency | rows/s | ms per call |")
    print("|---|---:|---:|---:|---:|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
