"""What the status page costs inference: `simple`'s throughput, and the server's CPU time per
inference (robust where the shared machine's load moves the throughput), with the page closed,
with only its polls (no browser), and open in a real headless Chromium (polling /status.json
every 2 s, redrawing its tables and charts), interleaved; the server's CPU use with the page
open and no traffic; the page's transfer size; one poll's time and CPU; the latency ring's
per-request store; the sampler's tick on the loop.

    .venv/bin/python -m bench.status_page [--rounds 6] [--seconds 9] [--concurrency 8] \
        [--protocol http-binary|grpc] [--load-generator builtin|perf_analyzer]

The server runs pinned to core 0; the load generator and the browser to core 1 (on a device the
browser is on the technician's laptop: only the server's side of the page is the device's).
Rounds rotate which state goes first so a drift of the shared machine's load does not favour
one. Prints markdown.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import timeit
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.common import last_json_line, pin_to_core
from bench.perf import DEFAULT_TOOL, command, find_perf_analyzer, parse_result
from bench.server import start_server, stop_server, wait_ready
from configs.generate import SIMPLE_CONFIG, save, simple_model

PAGE_FILES = ("/status", "/status/status.js", "/status/status.css")
SERVER_CORE, CLIENT_CORE = 0, 1


def _get(url: str, encoding: str) -> tuple[int, str, float]:
    """Bytes of the body as sent (not decoded), its Content-Encoding, seconds taken."""
    request = urllib.request.Request(url, headers={"Accept-Encoding": encoding})
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=10) as resp:
        body = resp.read()
        return len(body), resp.headers.get("Content-Encoding", ""), time.perf_counter() - started


def transfer_sizes(http_url: str) -> list[tuple[str, int, str, int]]:
    """Each file the page loads, its first poll and a poll as it polls from then on (the
    points after the last one it has: one): (path, bytes as served to a browser, encoding,
    bytes if gzip -6 compressed)."""
    with urllib.request.urlopen(f"http://{http_url}/status.json", timeout=10) as resp:
        points = json.loads(resp.read())["models"][0]["live"]["points"]
    since = points[-2]["time_s"] if len(points) > 1 else 0
    rows = []
    for path in (*PAGE_FILES, "/status.json", f"/status.json?since={since}"):
        size, encoding, _ = _get(f"http://{http_url}{path}", "gzip, deflate, br")
        with urllib.request.urlopen(f"http://{http_url}{path}", timeout=10) as resp:
            raw = resp.read()
        rows.append((path, size, encoding or "none", len(gzip.compress(raw, 6))))
    return rows


def poll_time_ms(http_url: str, count: int = 200, since: bool = False) -> float:
    """Median time of one /status.json request (`since`: as the page polls, for the points
    after the newest), sequential."""
    query = ""
    if since:
        with urllib.request.urlopen(f"http://{http_url}/status.json", timeout=10) as resp:
            points = json.loads(resp.read())["models"][0]["live"]["points"]
        query = f"?since={points[-1]['time_s'] if points else 0}"
    times = [_get(f"http://{http_url}/status.json{query}", "identity")[2] for _ in range(count)]
    return statistics.median(times) * 1000


@contextmanager
def polled(http_url: str, interval_s: float = 2.0) -> Iterator[None]:
    """What the open page asks the server for, without a browser: /status.json?since= every
    `interval_s`, from a thread of this process (the client core)."""
    stop = threading.Event()

    def poll() -> None:
        since = 0.0
        while not stop.wait(interval_s):
            url = f"http://{http_url}/status.json?since={since}"
            with urllib.request.urlopen(url, timeout=10) as resp:
                doc = json.loads(resp.read())
            for model in doc["models"]:
                if model["live"]["points"]:
                    since = max(since, model["live"]["points"][-1]["time_s"])

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(15)


@contextmanager
def viewer(state: str, http_url: str) -> Iterator[None]:
    """closed: nothing; polled: the page's requests alone; open: the page in Chromium."""
    if state == "open":
        with page_open(http_url):
            yield
    elif state == "polled":
        with polled(http_url):
            yield
    else:
        yield


def ring_store_ns() -> tuple[float, float]:
    """record_success's time as shipped (with the latency ring's store) and with the store
    taken out (a subclass), in ns per call, best of 25 interleaved; both called as bound methods."""
    from appliance.scheduling.stats import ModelStats

    class WithoutRing(ModelStats):
        __slots__ = ()

        def record_success(self, ns: int) -> None:  # as before the ring
            self.success.add(ns)
            if self.latency is not None:
                self.latency.observe(ns)
            if self.watcher is not None:
                self.watcher(False)

    n = 100_000
    timers = [
        timeit.Timer("call(1234567)", globals={"call": stats.record_success})
        for stats in (ModelStats(), WithoutRing())
    ]
    best = [float("inf"), float("inf")]
    for _ in range(25):  # interleaved: the machine's load changes under both alike
        for i, timer in enumerate(timers):
            best[i] = min(best[i], timer.timeit(number=n) / n * 1e9)
    return best[0], best[1]


def sampler_tick_ms(models: int = 10, per_interval: int = 600, ticks: int = 300) -> float:
    """Median time of one sampler tick on the loop (LiveStats.sample) for `models` busy
    models, each with `per_interval` new successes (log-normal latencies around 0.7 ms) a
    tick, over `ticks` ticks (the 150-point window full for the second half)."""
    import random
    from dataclasses import dataclass, field

    from appliance.scheduling.stats import ModelStats
    from appliance.services.status_samples import LiveStats

    @dataclass
    class Version:
        name: str
        version: int = 1
        stats: ModelStats = field(default_factory=ModelStats)

    versions = [Version(f"m{i}") for i in range(models)]
    live, times = LiveStats(), []
    for tick in range(ticks):
        for served in versions:
            for _ in range(per_interval):
                served.stats.record_success(int(random.lognormvariate(13.5, 0.6)))
        started = time.perf_counter()
        live.sample(versions, 2.0 * tick)
        times.append(time.perf_counter() - started)
    return statistics.median(times[ticks // 2 :]) * 1000


@contextmanager
def page_open(http_url: str) -> Iterator[Any]:
    """The status page in headless Chromium (Debian's chromium and chromium-driver), loaded
    and polling, on the client core."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    browser, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    if browser is None or driver_path is None:
        raise SystemExit("needs chromium and chromedriver (apt-get install chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(flag)
    with tempfile.TemporaryDirectory() as profile:
        options.add_argument(f"--user-data-dir={profile}")
        driver = webdriver.Chrome(service=Service(driver_path), options=options)
        try:
            driver.get(f"http://{http_url}/status")
            deadline = time.monotonic() + 30
            while not driver.execute_script(
                "return document.querySelector('#models tbody tr[data-model]') !== null;"
            ):
                if time.monotonic() > deadline:
                    raise TimeoutError("the status page did not draw its table")
                time.sleep(0.1)
            yield driver
        finally:
            driver.quit()


def measure(pa: Any, http_url: str, grpc_url: str, args: argparse.Namespace) -> float:
    """simple's inferences / s over one window, from core 1."""
    with tempfile.TemporaryDirectory() as folder:
        if pa is None:  # bench/loadgen.py
            cmd = [
                sys.executable, "-m", "bench.loadgen", "--protocol", args.protocol,
                "--url", http_url, "--grpc-url", grpc_url, "--model", "simple",
                "--concurrency", str(args.concurrency), "--seconds", str(args.seconds),
                "--core", str(CLIENT_CORE),
            ]  # fmt: skip
        else:
            csv_path = Path(folder) / "result.csv"
            url = http_url if args.protocol == "http-binary" else grpc_url
            cmd = [
                "taskset", "-c", str(CLIENT_CORE),
                *command(
                    pa, "simple", url, args.protocol, args.concurrency, args.seconds, csv_path
                ),
            ]  # fmt: skip
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=args.seconds * 10 + 120, check=False
        )
        if proc.returncode != 0:
            raise RuntimeError(f"{cmd[:4]} exited {proc.returncode}: {proc.stderr[-2000:]}")
        if pa is None:
            return float(json.loads(last_json_line(proc.stdout))["infer_per_s"])
        return parse_result(csv_path.read_text(), proc.stdout).infer_per_s


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a process has used, all its threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def served(http_url: str) -> int:
    """simple's successful inferences so far, by the server's own count."""
    with urllib.request.urlopen(f"http://{http_url}/v2/models/simple/stats", timeout=10) as resp:
        stats = json.loads(resp.read())["model_stats"]
    return sum(int(s["inference_stats"]["success"]["count"]) for s in stats)


def machine_busy() -> tuple[int, int]:
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    values = [int(v) for v in fields]
    return sum(values) - values[3] - values[4], sum(values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=9.0)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--idle-seconds", type=float, default=20.0)
    parser.add_argument("--protocol", choices=("http-binary", "grpc"), default="http-binary")
    parser.add_argument(
        "--load-generator",
        choices=("builtin", "perf_analyzer"),
        default="builtin",
        help="bench/loadgen.py (default: it never gives up on a noisy machine) or perf_analyzer",
    )
    parser.add_argument("--perf-analyzer", type=Path, default=DEFAULT_TOOL)
    args = parser.parse_args()
    pa = None
    if args.load_generator == "perf_analyzer":
        pa, why = find_perf_analyzer(args.perf_analyzer)
        if pa is None:
            raise SystemExit(f"perf_analyzer: {why}")
    pin_to_core(CLIENT_CORE)  # this process, and the browser it starts
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder) / "models"
        save(simple_model(), root / "simple" / "1" / "model.onnx")
        (root / "simple" / "config.pbtxt").write_text(SIMPLE_CONFIG)
        server = start_server(root, SERVER_CORE, Path(folder) / "server.log")
        try:
            wait_ready(server)
            print(f"# status page benchmark, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
            tool = pa.version if pa is not None else "bench/loadgen.py"
            print(f"{tool}; {args.protocol}, concurrency {args.concurrency},")
            print(f"{args.seconds:g} s per point, {args.rounds} rounds; load {os.getloadavg()}")
            print(
                "\n| round | state | infer/s | server CPU µs / inference | machine busy "
                "(% of 2 cores) |\n|---|---|---|---|---|"
            )
            pid = server.proc.pid
            states = ("closed", "polled", "open")
            results: dict[str, list[tuple[float, float]]] = {state: [] for state in states}
            for round_ in range(args.rounds):
                for state in states[round_ % 3 :] + states[: round_ % 3]:  # each goes first
                    with contextlib.ExitStack() as stack:
                        stack.enter_context(viewer(state, server.http_url))
                        busy0, cpu0, count0 = machine_busy(), cpu_s(pid), served(server.http_url)
                        rate = measure(pa, server.http_url, server.grpc_url, args)
                        busy1, cpu1, count1 = machine_busy(), cpu_s(pid), served(server.http_url)
                    busy = 100 * (busy1[0] - busy0[0]) / max(1, busy1[1] - busy0[1])
                    per_us = (cpu1 - cpu0) * 1e6 / max(1, count1 - count0)
                    results[state].append((rate, per_us))
                    print(
                        f"| {round_ + 1} | {state} | {rate:.0f} | {per_us:.0f} | {busy:.0f} |",
                        flush=True,
                    )
            for i, what in ((0, "infer/s"), (1, "server CPU µs / inference")):
                closed = [r[i] for r in results["closed"]]
                for state in ("polled", "open"):
                    other = [r[i] for r in results[state]]
                    ratios = [o / c for o, c in zip(other, closed, strict=True)]
                    print(
                        f"\n{what}, median: closed {statistics.median(closed):.0f}, {state} "
                        f"{statistics.median(other):.0f}; {state} / closed per round: "
                        + ", ".join(f"{r:.3f}" for r in ratios)
                        + f" (median {statistics.median(ratios):.3f})"
                    )
            print(f"\n| idle {args.idle_seconds:g} s | server CPU ms / s |\n|---|---|")
            for round_ in range(args.rounds // 2):
                for state in ("closed", "open") if round_ % 2 == 0 else ("open", "closed"):
                    with viewer(state, server.http_url):
                        cpu0 = cpu_s(pid)
                        time.sleep(args.idle_seconds)
                        cpu1 = cpu_s(pid)
                    print(f"| {state} | {(cpu1 - cpu0) * 1000 / args.idle_seconds:.2f} |")
            cpu0 = cpu_s(pid)
            poll_ms = poll_time_ms(server.http_url, 500, since=True)
            poll_cpu_ms = (cpu_s(pid) - cpu0) * 1000 / 500
            print(
                f"\none /status.json?since= (the page's poll), 500 sequential, server otherwise "
                f"idle: {poll_ms:.2f} ms median, {poll_cpu_ms:.2f} ms of server CPU each"
            )
            print("\n| file | bytes as served | Content-Encoding | bytes gzip -6 |")
            print("|---|---|---|---|")
            for path, size, encoding, zipped in transfer_sizes(server.http_url):
                print(f"| {path} | {size} | {encoding} | {zipped} |")
            with urllib.request.urlopen(f"http://{server.http_url}/status.json") as resp:
                points = [len(m["live"]["points"]) for m in json.loads(resp.read())["models"]]
            print(f"\n(status.json with {len(points)} model(s), {points} chart points)")
        finally:
            stop_server(server)
    with_ring, plain = ring_store_ns()
    print(f"record_success: {with_ring:.1f} ns with the latency ring, {plain:.1f} ns without")
    tick_ms = sampler_tick_ms()
    print(f"sampler tick, 10 busy models (600 requests each an interval): {tick_ms:.2f} ms")


if __name__ == "__main__":
    main()
