"""Overload: what the server does at 4x the rate it can sustain, and how it recovers.

    python -m bench.overload [--seconds 15] [--flags="--max-queue-wait-ms=10000" ...]

For each server configuration (each --flags value; default: the old 10 s queue-wait limit,
then the server's defaults):
1. closed loop (4 clients back to back) finds the sustainable rate R of a model of tens of
   ms (so that the Python load generator, at tens of requests per second, is no bottleneck);
2. open loop at 4 R (requests sent on a fixed schedule, whatever the answers) for --seconds;
3. open loop at 0.5 R for 10 s: recovery.
Each request's status and latency are recorded (a Python open-loop generator: perf_analyzer
reports neither per-request status nor the time a refusal takes). The server's RSS (process
tree) is sampled before, during (peak) and after. One markdown row per configuration.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import numpy as np

from bench.common import process_tree, rss_mib
from bench.server import start_server, stop_server, wait_ready
from configs.generate import matmul_chain_model, save

MODEL = "chain"
CONFIG = (
    f'name: "{MODEL}"\nbackend: "onnxruntime"\nmax_batch_size: 0\n'
    'input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ 1, 512 ] } ]\n'
    'output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 1, 512 ] } ]\n'
    "instance_group [ { count: 1, kind: KIND_CPU } ]\n"
)


def chain_model(steps: int) -> object:
    """tanh(... tanh(x @ W) ... @ W) with a 512x512 W: a CPU-bound model of tunable cost."""
    return matmul_chain_model(512, steps, 1)


def _body() -> tuple[bytes, dict[str, str]]:
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "datatype": "FP32",
                    "shape": [1, 512],
                    "parameters": {"binary_data_size": 2048},
                }
            ]
        }
    ).encode()
    body = header + np.ones(512, np.float32).tobytes()
    return body, {"Inference-Header-Content-Length": str(len(header))}


@dataclass
class Outcome:
    sent: float  # seconds since the phase began
    latency: float
    status: int  # 0: the connection failed


async def _one(session: aiohttp.ClientSession, url: str, start: float) -> Outcome:
    body, headers = _body()
    sent = time.monotonic()
    try:
        async with session.post(url, data=body, headers=headers) as resp:
            await resp.read()
            status = resp.status
    except aiohttp.ClientError:
        status = 0
    return Outcome(sent - start, time.monotonic() - sent, status)


async def closed_loop(url: str, seconds: float, clients: int = 4) -> float:
    """Requests per second with `clients` sending back to back."""
    done = 0
    deadline = time.monotonic() + seconds
    async with aiohttp.ClientSession() as session:

        async def client() -> None:
            nonlocal done
            while time.monotonic() < deadline:
                if (await _one(session, url, 0.0)).status == 200:
                    done += 1

        await asyncio.gather(*(client() for _ in range(clients)))
    return done / seconds


async def open_loop(url: str, rate: float, seconds: float, pid: int) -> tuple[list[Outcome], float]:
    """Requests sent every 1/rate s whatever happens to earlier ones; (outcomes, peak RSS)."""
    connector = aiohttp.TCPConnector(limit=0)
    peak = 0.0
    async with aiohttp.ClientSession(connector=connector) as session:
        start = time.monotonic()
        tasks = []
        n = 0
        next_sample = start
        while (now := time.monotonic()) < start + seconds:
            due = start + n / rate
            if now < due:
                await asyncio.sleep(due - now)
                continue
            tasks.append(asyncio.ensure_future(_one(session, url, start)))
            n += 1
            if now >= next_sample:
                peak = max(peak, tree_rss(pid))
                next_sample = now + 0.5
        outcomes = await asyncio.gather(*tasks)
    return list(outcomes), peak


def tree_rss(pid: int) -> float:
    return sum(rss_mib(p) for p in process_tree(pid))


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values) * 1000, q)) if values else float("nan")


def run(flags: list[str], seconds: float, workdir: Path) -> dict[str, float | str]:
    server = start_server(workdir / "repo", None, workdir / "server.log", flags)
    try:
        wait_ready(server)
        url = f"http://{server.http_url}/v2/models/{MODEL}/infer"
        pid = server.proc.pid
        asyncio.run(closed_loop(url, 2.0))  # warm up
        rate = asyncio.run(closed_loop(url, 8.0))
        rss_before = tree_rss(pid)
        over, peak = asyncio.run(open_loop(url, 4 * rate, seconds, pid))
        calm, peak_calm = asyncio.run(open_loop(url, 0.5 * rate, 10.0, pid))
        time.sleep(2.0)
        rss_after = tree_rss(pid)
    finally:
        stop_server(server)
    admitted = [o.latency for o in over if o.status == 200]
    refused = [o.latency for o in over if o.status == 503]
    return {
        "flags": " ".join(flags) or "(defaults)",
        "rate": rate,
        "sent": len(over),
        "refused": len(refused) / len(over),
        "failed": sum(1 for o in over if o.status not in (200, 503)),
        "reject_p50": _pct(refused, 50),
        "reject_p99": _pct(refused, 99),
        "admitted_p50": _pct(admitted, 50),
        "admitted_p99": _pct(admitted, 99),
        "rss_before": rss_before,
        "rss_peak": max(peak, peak_calm),
        "rss_after": rss_after,
        "recovery_p99": _pct([o.latency for o in calm if o.status == 200], 99),
        "recovery_errors": sum(1 for o in calm if o.status != 200),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=15.0, help="length of the 4x phase")
    parser.add_argument("--steps", type=int, default=300, help="model cost: MatMul+Tanh steps")
    parser.add_argument(
        "--flags", action="append", default=None, help="server flags of one configuration"
    )
    args = parser.parse_args()
    configs = (
        [shlex.split(f) for f in args.flags] if args.flags else [["--max-queue-wait-ms=10000"], []]
    )
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        save(chain_model(args.steps), workdir / "repo" / MODEL / "1" / "model.onnx")
        (workdir / "repo" / MODEL / "config.pbtxt").write_text(CONFIG)
        rows = [run(flags, args.seconds, workdir) for flags in configs]
    print(
        "| server flags | R (req/s) | sent at 4R | refused 503 | other errors "
        "| refusal p50 / p99 ms | admitted p50 / p99 ms | RSS MiB before / peak / after "
        "| recovery p99 ms (0.5R, errors) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| `{r['flags']}` | {r['rate']:.0f} | {r['sent']} | {r['refused']:.0%} "
            f"| {r['failed']} | {r['reject_p50']:.1f} / {r['reject_p99']:.1f} "
            f"| {r['admitted_p50']:.0f} / {r['admitted_p99']:.0f} "
            f"| {r['rss_before']:.0f} / {r['rss_peak']:.0f} / {r['rss_after']:.0f} "
            f"| {r['recovery_p99']:.0f} ({r['recovery_errors']}) |"
        )


if __name__ == "__main__":
    main()
