"""What one HTTP request costs the web layer alone: aiohttp against the infer route (issue 20).

    python -m bench.http_route [--rounds 3] [--seconds 4] [--connections 8]

Two servers answer POST /v2/models/simple/infer with the same canned 200 JSON answer, no
decoding and no model: `aiohttp` (a web.Application with that one route, on uvloop, as the
server ran its infer route before) and `route` (appliance/frontends/http/fastpath.py's
InferConnection through GuardedAppRunner, with an InferRoute that answers at once: what the
server's infer route costs before its own work). Each is pinned to core 0 (`taskset`); wrk drives
it from core 1 (bench.mlserver's wrk runner). A point's figure is the server process's CPU time
over the run divided by the requests wrk completed. Rounds alternate the order; the table gives
medians. Without wrk on PATH it prints one SKIP line.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.common import ROOT, free_port
from bench.cpu_per_request import cpu_s
from bench.mlserver import lua_script, request_body, run_wrk

ANSWER = b'{"model_name":"simple","model_version":"1","outputs":[]}'
SERVERS = ("aiohttp", "route")


async def _serve(kind: str, port: int) -> None:
    from aiohttp import web

    if kind == "aiohttp":

        async def infer(request: web.Request) -> web.Response:
            await request.read()
            return web.Response(body=ANSWER, content_type="application/json")

        app = web.Application()
        app.router.add_post("/v2/models/{model}/infer", infer)
        runner = web.AppRunner(app, access_log=None)
    else:
        from appliance.common.settings import HttpConnectionLimits
        from appliance.frontends.http.connections import GuardedAppRunner
        from appliance.frontends.http.fastpath import Body, Reply

        class Canned:
            max_body_bytes = 1 << 20

            def admit(self, model: str, version: str, headers: Mapping[str, str]) -> object:
                return None

            def infer_reply(
                self,
                model: str,
                version: str,
                admission: Any,
                body: Body,
                headers: Any,
                raw_headers: Any,
            ) -> Reply:
                return Reply(200, b"application/json", [ANSWER])

            def error(self, status: int, message: str) -> Reply:
                return Reply(status, b"application/json", [message.encode()])

        runner = GuardedAppRunner(
            web.Application(), HttpConnectionLimits(), shutdown_timeout=5, infer_route=Canned()
        )
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    await asyncio.Event().wait()


def _start(kind: str, port: int) -> subprocess.Popen[bytes]:
    command = ["taskset", "-c", "0", sys.executable, "-m", "bench.http_route", "--serve", kind]
    proc = subprocess.Popen([*command, "--port", str(port)], cwd=ROOT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"{kind} did not listen within 60 s")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.http_route")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=4)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--serve", choices=SERVERS, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        import uvloop

        uvloop.run(_serve(args.serve, args.port))
        return 0
    wrk = shutil.which("wrk")
    if wrk is None:
        print("SKIP: wrk is not on PATH (Debian: apt-get install wrk)")
        return 0
    results: dict[str, list[tuple[float, float]]] = {kind: [] for kind in SERVERS}
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "post.lua"
        script.write_text(lua_script(request_body()))
        for round_ in range(args.rounds):
            for kind in SERVERS if round_ % 2 == 0 else SERVERS[::-1]:
                port = free_port()
                proc = _start(kind, port)
                try:
                    run_wrk(wrk, script, f"127.0.0.1:{port}", 1, args.connections)  # warm-up
                    before = cpu_s(proc.pid)
                    result = run_wrk(
                        wrk, script, f"127.0.0.1:{port}", args.seconds, args.connections
                    )
                    used = cpu_s(proc.pid) - before
                finally:
                    proc.terminate()
                    proc.wait(10)
                problem = result.problem()
                if problem:
                    print(f"round {round_} {kind}: {problem}")
                    continue
                per_request = used / result.requests * 1e6
                results[kind].append((per_request, result.infer_per_s))
                print(f"round {round_} {kind}: {per_request:.1f} us, {result.infer_per_s:,.0f}/s")
    print("\n| server | CPU us per request | requests/s |\n|---|---:|---:|")
    for kind, points in results.items():
        if points:
            cpu = statistics.median(p[0] for p in points)
            rate = statistics.median(p[1] for p in points)
            print(f"| {kind} | {cpu:.1f} | {rate:,.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
