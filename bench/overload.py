"""Overload: what the server does at 4x the rate it can sustain, and how it recovers; and
under a flood of clients that retry at once.

    python -m bench.overload [--seconds 15] [--flags="--max-queue-wait-ms=10000" ...]
    python -m bench.overload --clients 256 [--seconds 20] [--flags=...]

For each server configuration (each --flags value; default: the old 10 s queue-wait limit,
then the server's defaults):
1. closed loop (4 clients back to back) finds the sustainable rate R of a model of tens of
   ms (so that the Python load generator, at tens of requests per second, is no bottleneck);
2. open loop at 4 R (requests sent on a fixed schedule, whatever the answers) for --seconds;
3. open loop at 0.5 R for 10 s: recovery.
Each request's status and latency are recorded (a Python open-loop generator: perf_analyzer
reports neither per-request status nor the time a refusal takes). The server's RSS (process
tree) is sampled before, during (peak) and after. One markdown row per configuration.

With --clients N (the flood; default configuration: the server's defaults): DenseNet from the
example repository (configs/generate.py: 600 KB binary requests); first its time alone (the
median of 10 requests), then N clients in a child process send back to back for --seconds,
each sending its next request as soon as it has an answer, 200 or 503. Meanwhile this process
asks /v2/health/ready every 20 ms on a connection of its own (the load generator, busy with N
connections, would delay its own probes). Per-request status and latency of the flood, health
latency, and the server's CPU time (its event-loop thread and the rest) are reported.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import multiprocessing
import os
import shlex
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from bench.common import process_tree, rss_mib
from bench.server import start_server, stop_server, wait_ready
from configs.generate import matmul_chain_model, save, write_repository

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


# ---- the flood: N clients that retry at once -------------------------------------------------

FLOOD_MODEL = "densenet_onnx"
IMAGE_ELEMENTS = 3 * 224 * 224


def _image_request() -> tuple[bytes, dict[str, str]]:
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "data_0",
                    "datatype": "FP32",
                    "shape": [3, 224, 224],  # densenet_onnx: Triton's config, unbatched
                    "parameters": {"binary_data_size": IMAGE_ELEMENTS * 4},
                }
            ],
            "outputs": [{"name": "fc6_1", "parameters": {"binary_data": True}}],
        }
    ).encode()
    body = header + np.ones(IMAGE_ELEMENTS, np.float32).tobytes()
    return body, {
        "Inference-Header-Content-Length": str(len(header)),
        "Content-Type": "application/octet-stream",
    }


def _flood(url: str, clients: int, seconds: float, results: Any) -> None:
    """Child process: `clients` connections sending back to back; (latency s, status) each."""

    async def main() -> list[tuple[float, int]]:
        body, headers = _image_request()
        done: list[tuple[float, int]] = []
        timeout = aiohttp.ClientTimeout(total=120)
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            deadline = time.monotonic() + seconds

            async def client() -> None:
                while time.monotonic() < deadline:
                    sent = time.monotonic()
                    try:
                        async with session.post(url, data=body, headers=headers) as resp:
                            await resp.read()
                            status = resp.status
                    except aiohttp.ClientError:
                        status = 0
                    done.append((time.monotonic() - sent, status))

            await asyncio.gather(*(client() for _ in range(clients)))
        return done

    results.put(asyncio.run(main()))


def _probe_health(host: str, stop: threading.Event, latencies: list[float]) -> None:
    conn = http.client.HTTPConnection(host, timeout=60)
    while not stop.is_set():
        sent = time.monotonic()
        conn.request("GET", "/v2/health/ready")
        conn.getresponse().read()
        latencies.append(time.monotonic() - sent)
        time.sleep(0.02)
    conn.close()


def _alone_ms(host: str, requests: int = 10) -> float:
    body, headers = _image_request()
    conn = http.client.HTTPConnection(host, timeout=60)
    times = []
    for _ in range(requests):
        sent = time.monotonic()
        conn.request("POST", f"/v2/models/{FLOOD_MODEL}/infer", body=body, headers=headers)
        conn.getresponse().read()
        times.append(time.monotonic() - sent)
    conn.close()
    return float(np.median(times[2:]) * 1000)


def _cpu_s(pid: int) -> tuple[float, float]:
    """(event-loop thread, all other threads) CPU seconds of the server process."""
    loop, rest = 0.0, 0.0
    tick = os.sysconf("SC_CLK_TCK")
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        used = (int(fields[11]) + int(fields[12])) / tick
        if task.name == str(pid):
            loop += used
        else:
            rest += used
    return loop, rest


def flood(flags: list[str], clients: int, seconds: float, workdir: Path) -> dict[str, Any]:
    repo = write_repository(workdir / "example")
    server = start_server(repo, None, workdir / "flood.log", flags)
    try:
        wait_ready(server)
        host = server.http_url
        alone = _alone_ms(host)
        ctx = multiprocessing.get_context("spawn")
        results = ctx.Queue()
        url = f"http://{host}/v2/models/{FLOOD_MODEL}/infer"
        child = ctx.Process(target=_flood, args=(url, clients, seconds, results))
        load_before = os.getloadavg()[0]
        cpu_before, started = _cpu_s(server.proc.pid), time.monotonic()
        child.start()
        time.sleep(1.0)  # the clients connect and the queue builds up
        stop, health = threading.Event(), []
        probe = threading.Thread(target=_probe_health, args=(host, stop, health))
        probe.start()
        time.sleep(max(1.0, seconds - 2.0))
        stop.set()
        probe.join()
        outcomes: list[tuple[float, int]] = results.get()
        child.join()
        elapsed = time.monotonic() - started
        cpu_after = _cpu_s(server.proc.pid)
        load_after = os.getloadavg()[0]
    finally:
        stop_server(server)
    admitted = [t for t, status in outcomes if status == 200]
    refused = [t for t, status in outcomes if status == 503]
    return {
        "flags": " ".join(flags) or "(defaults)",
        "clients": clients,
        "alone": alone,
        "admitted_per_s": len(admitted) / seconds,
        "admitted_p50": _pct(admitted, 50),
        "admitted_p99": _pct(admitted, 99),
        "refused_per_s": len(refused) / seconds,
        "refused_p50": _pct(refused, 50),
        "refused_p99": _pct(refused, 99),
        "failed": sum(1 for _, status in outcomes if status not in (200, 503)),
        "health_p50": _pct(health, 50),
        "health_p99": _pct(health, 99),
        "health_max": _pct(health, 100),
        "loop_cpu": 100 * (cpu_after[0] - cpu_before[0]) / elapsed,
        "other_cpu": 100 * (cpu_after[1] - cpu_before[1]) / elapsed,
        "load": f"{load_before:.1f}-{load_after:.1f}",
    }


def print_flood(rows: list[dict[str, Any]]) -> None:
    print(
        "| server flags | clients | alone ms | admitted /s | admitted p50 / p99 ms "
        "| refused /s | refused p50 / p99 ms | other errors | health p50 / p99 / max ms "
        "| server CPU % (loop / other threads) | load avg |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| `{r['flags']}` | {r['clients']} | {r['alone']:.0f} | {r['admitted_per_s']:.1f} "
            f"| {r['admitted_p50']:.0f} / {r['admitted_p99']:.0f} | {r['refused_per_s']:.0f} "
            f"| {r['refused_p50']:.0f} / {r['refused_p99']:.0f} | {r['failed']} "
            f"| {r['health_p50']:.1f} / {r['health_p99']:.1f} / {r['health_max']:.0f} "
            f"| {r['loop_cpu']:.0f} / {r['other_cpu']:.0f} | {r['load']} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--seconds", type=float, default=None, help="length of the 4x phase (15) or flood (20)"
    )
    parser.add_argument(
        "--clients", type=int, default=0, help="the flood: this many clients that retry at once"
    )
    parser.add_argument("--steps", type=int, default=300, help="model cost: MatMul+Tanh steps")
    parser.add_argument(
        "--flags", action="append", default=None, help="server flags of one configuration"
    )
    args = parser.parse_args()
    if args.clients:
        configs = [shlex.split(f) for f in args.flags] if args.flags else [[]]
        with tempfile.TemporaryDirectory() as tmp:
            seconds = args.seconds or 20.0
            print_flood([flood(f, args.clients, seconds, Path(tmp)) for f in configs])
        return
    configs = (
        [shlex.split(f) for f in args.flags] if args.flags else [["--max-queue-wait-ms=10000"], []]
    )
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        save(chain_model(args.steps), workdir / "repo" / MODEL / "1" / "model.onnx")
        (workdir / "repo" / MODEL / "config.pbtxt").write_text(CONFIG)
        rows = [run(flags, args.seconds or 15.0, workdir) for flags in configs]
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
