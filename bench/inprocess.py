"""What one `simple` request costs the server's own code in-process, without sockets (issue 20).

    python -m bench.inprocess [--trees A,B] [--points http-json,http-binary,grpc]
        [--requests 20000] [--rounds 5] [--runs 3] [--core 0] [--profile FILE]

A run starts the real server (`edge-appliance serve`, in-process) from a source tree on the
example `simple` model, waits until it is ready, then calls its request path directly, as the
transports would, `--requests` times per round:

- `http-json`, `http-binary`: raw HTTP bytes (tritonclient's KServe v2 JSON request, or its
  binary-tensor request) go into an `InferConnection` (frontends/http/fastpath.py) of the
  server's own HTTP listener, whose transport only keeps what is written. Parsing, admission,
  decoding, scheduling, the model, statistics, encoding and the answer's bytes: everything but
  the socket calls.
- `grpc`: a serialized `ModelInferRequest` goes to the ModelInfer handler the server registered
  with grpc, on this thread (a handler thread, as grpc's own), and the response is serialized.

Each run is a fresh process pinned to `--core`; runs alternate the trees' order. A round's figure
is its thread CPU time over its requests. The table gives, per point and tree, the median over
runs of each run's fastest round, and the range of the runs' medians.

`--profile FILE`: one run per point and tree under cProfile (its figures are cProfile's, not
the code's), the stats written to FILE.<tree's name>.<point> and their top functions by own
time printed: where a request's Python goes, function by function.

On a busy or shared machine this is steadier than the servers' CPU under load
(`bench.cpu_per_request`), but it is not the same figure: under load each request also pays the
kernel's socket work and caches the rest of the machine keeps cold, 1.5-3x this.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

POINTS = ("http-json", "http-binary", "grpc")
MODEL = "simple"
INPUT0 = list(range(16))
INPUT1 = [1] * 16


def http_request(binary: bool) -> bytes:
    """The HTTP bytes of one infer request for `simple`, as tritonclient sends it."""
    import numpy as np

    doc: dict[str, Any]
    if not binary:
        doc = {
            "inputs": [
                {"name": n, "shape": [1, 16], "datatype": "INT32", "data": d}
                for n, d in (("INPUT0", INPUT0), ("INPUT1", INPUT1))
            ]
        }
        body = json.dumps(doc, separators=(",", ":")).encode()
        extra = b""
    else:
        doc = {
            "inputs": [
                {"name": n, "shape": [1, 16], "datatype": "INT32",
                 "parameters": {"binary_data_size": 64}}
                for n in ("INPUT0", "INPUT1")
            ],
            "outputs": [{"name": n, "parameters": {"binary_data": True}}
                        for n in ("OUTPUT0", "OUTPUT1")],
        }  # fmt: skip
        header = json.dumps(doc, separators=(",", ":")).encode()
        tensors = np.asarray(INPUT0, np.int32).tobytes() + np.asarray(INPUT1, np.int32).tobytes()
        body = header + tensors
        extra = b"Inference-Header-Content-Length: %d\r\n" % len(header)
    return (
        b"POST /v2/models/%s/infer HTTP/1.1\r\nHost: localhost\r\n"
        b"Content-Type: application/json\r\n%sContent-Length: %d\r\n\r\n%s"
        % (MODEL.encode(), extra, len(body), body)
    )


class _Transport:
    """A transport that keeps the last write: what the socket would have sent."""

    def __init__(self) -> None:
        self.writes = 0
        self.last = b""

    def write(self, data: bytes) -> None:
        self.writes += 1
        self.last = data

    def writelines(self, chunks: Sequence[bytes]) -> None:
        self.write(b"".join(chunks))

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 1) if name == "peername" else default

    def is_closing(self) -> bool:
        return False

    def pause_reading(self) -> None: ...
    def resume_reading(self) -> None: ...
    def close(self) -> None: ...
    def abort(self) -> None: ...


WARM_UP = 2000  # requests before the rounds: the scheduler learns the model's cost


PROFILE_ENV = "EDGE_INPROCESS_PROFILE"  # the child's cProfile output file (--profile)


def _rounds(call: Any, requests: int, rounds: int) -> list[float]:
    import time

    profile_to = os.environ.get(PROFILE_ENV)
    profiler = None
    if profile_to:
        import cProfile

        # CPU time, not wall time: a shared core's other work is not this code's.
        profiler = cProfile.Profile(time.thread_time_ns, 1e-9)
        profiler.enable()
    figures = []
    for _ in range(rounds):
        start = time.thread_time()
        for _ in range(requests):
            call()
        figures.append((time.thread_time() - start) / requests * 1e6)
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(profile_to)
    return figures


def _child(tree: str, repository: str, point: str, requests: int, rounds: int) -> None:
    """In the measuring process: the server from `tree`, then the rounds; prints one JSON line."""
    sys.path[0] = tree  # not this file's folder: the tree's modules, and no bench/ names
    import asyncio
    import socket
    import threading
    import time
    import urllib.request

    import grpc

    handlers: list[tuple[Any, Any]] = []
    register = grpc.unary_unary_rpc_method_handler

    def recording(behavior: Any, request_deserializer: Any = None,
                  response_serializer: Any = None) -> Any:  # fmt: skip
        handlers.append((behavior, response_serializer))
        return register(behavior, request_deserializer, response_serializer)

    grpc.unary_unary_rpc_method_handler = recording

    try:
        from appliance.face import cli
    except ImportError:  # a tree from before issue 32's reshape (appliance/cli.py), for A/B
        from appliance import cli  # type: ignore[no-redef,attr-defined]
    from appliance.frontends.http import connections

    servers: list[Any] = []
    init = connections.GuardedServer.__init__

    def recorded(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        servers.append(self)

    connections.GuardedServer.__init__ = recorded  # type: ignore[method-assign]

    sockets = [socket.socket() for _ in range(3)]
    for sock in sockets:  # three different free ports (all bound at once)
        sock.bind(("127.0.0.1", 0))
    http_port, grpc_port, metrics_port = (sock.getsockname()[1] for sock in sockets)
    for sock in sockets:
        sock.close()

    def report(figures: list[float], check: str) -> None:
        print(json.dumps({"us": figures, "check": check}), flush=True)
        os._exit(0)

    def http(binary: bool) -> None:
        request = http_request(binary)
        connection = servers[0]()
        transport = _Transport()
        connection.connection_made(transport)

        async def measure() -> list[float]:
            # Each warm-up request is answered before the next is sent (at first the route
            # answers from a task, until the scheduler has learned the model runs inline).
            for sent in range(1, WARM_UP + 1):
                connection.data_received(request)
                while transport.writes < sent:  # noqa: ASYNC110  # the loop's tasks answer it
                    await asyncio.sleep(0)
            figures = _rounds(lambda: connection.data_received(request), requests, rounds)
            if transport.writes != WARM_UP + requests * rounds:
                raise RuntimeError("requests were not answered as they came (not inline)")
            return figures

        figures = asyncio.run_coroutine_threadsafe(measure(), servers[0]._guard_loop).result()
        report(figures, transport.last.split(b"\r\n", 1)[0].decode())

    def grpc_point() -> None:
        import numpy as np

        try:
            from appliance.common.protocol import service_pb2 as pb
        except ImportError:  # before the reshape
            from appliance.protocol import service_pb2 as pb  # type: ignore[no-redef]

        message = pb.ModelInferRequest(model_name=MODEL)
        for name, data in (("INPUT0", INPUT0), ("INPUT1", INPUT1)):
            tensor = message.inputs.add(name=name, datatype="INT32")
            tensor.shape.extend([1, 16])
            message.raw_input_contents.append(np.asarray(data, np.int32).tobytes())
        raw = message.SerializeToString()
        found = [
            (behavior, serializer)
            for behavior, serializer in handlers  # the guard's closure names its method
            if "ModelInfer" in [c.cell_contents for c in (behavior.__closure__ or ())]
        ]
        if not found:
            raise RuntimeError("no ModelInfer handler was registered")
        behavior, serializer = found[0]
        context = _Context()
        answer = pb.ModelInferResponse.FromString(serializer(behavior(raw, context)))
        out = np.frombuffer(answer.raw_output_contents[0], np.int32).tolist()

        def call() -> Any:
            return serializer(behavior(raw, context))

        for _ in range(WARM_UP):
            call()
        figures = _rounds(call, requests, rounds)
        right = [a + b for a, b in zip(INPUT0, INPUT1, strict=True)]
        report(figures, "OUTPUT0 right" if out == right else f"OUTPUT0 wrong: {out}")

    def driver() -> None:
        deadline = time.monotonic() + 120
        url = f"http://127.0.0.1:{http_port}/v2/models/{MODEL}/ready"
        while True:
            try:
                urllib.request.urlopen(url, timeout=1)
                break
            except OSError:
                if time.monotonic() > deadline:
                    report([], "the server was not ready in 120 s")
                time.sleep(0.1)
        try:
            if point == "grpc":
                grpc_point()
            else:
                http(point == "http-binary")
        except BaseException as exc:  # the parent shows it
            report([], f"failed: {exc!r}")

    threading.Thread(target=driver, daemon=True).start()
    cli.main([
        "serve", "--model-repository", repository, "--http-port", str(http_port),
        "--grpc-port", str(grpc_port), "--metrics-port", str(metrics_port), "--log-verbose", "0",
    ])  # fmt: skip


class _Context:
    """What the ModelInfer handler asks of grpc's context for a plain request."""

    def is_active(self) -> bool:
        return True

    def add_callback(self, callback: Any) -> bool:
        return True

    def invocation_metadata(self) -> tuple[()]:
        return ()

    def time_remaining(self) -> None:
        return None

    def abort(self, code: Any, details: str) -> None:
        raise RuntimeError(f"aborted: {code} {details}")


def measure(tree: Path, repository: str, point: str, requests: int, rounds: int, core: int,
            profile_to: str = "") -> tuple[list[float], str]:  # fmt: skip
    """One run in a fresh process: each round's us per request, and the answer's check line
    (`profile_to`: under cProfile, its stats written there)."""
    command = ["taskset", "-c", str(core), sys.executable, __file__, "--child", str(tree),
               str(repository), point, str(requests), str(rounds)]  # fmt: skip
    from bench.common import last_json_line  # the parent's: the child imports no bench module

    env = {**os.environ, PROFILE_ENV: profile_to} if profile_to else None
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=600, check=False, env=env
    )
    try:
        result = json.loads(last_json_line(done.stdout))
    except ValueError:
        return [], f"no result (exit {done.returncode}): {done.stderr[-400:]}"
    return [float(v) for v in result["us"]], str(result["check"])


def main(argv: Sequence[str] | None = None) -> int:
    args_in = list(sys.argv[1:] if argv is None else argv)
    if args_in[:1] == ["--child"]:
        tree, repository, point, requests, rounds = args_in[1:6]
        _child(tree, repository, point, int(requests), int(rounds))
        return 0
    parser = argparse.ArgumentParser(prog="python -m bench.inprocess")
    parser.add_argument("--trees", default=".", help="comma-separated checkouts (default: .)")
    parser.add_argument("--points", default=",".join(POINTS))
    parser.add_argument("--requests", type=int, default=20000, help="per round")
    parser.add_argument("--rounds", type=int, default=5, help="per run")
    parser.add_argument("--runs", type=int, default=3, help="fresh processes per point and tree")
    parser.add_argument("--core", type=int, default=0)
    parser.add_argument("--profile", metavar="FILE", help="one run under cProfile, stats to FILE.*")
    args = parser.parse_args(args_in)
    trees = [str(Path(t).resolve()) for t in args.trees.split(",") if t]
    points = [p for p in args.points.split(",") if p]
    unknown = set(points) - set(POINTS)
    if unknown:
        parser.error(f"unknown points {sorted(unknown)}; known: {', '.join(POINTS)}")
    if args.profile:
        return _profile(args, trees, points)
    best: dict[tuple[str, str], list[float]] = {}
    medians: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="edge-inprocess-") as work:
        from bench.mlserver import write_simple

        repository = str(write_simple(Path(work)))
        for run in range(args.runs):
            for tree in trees if run % 2 == 0 else trees[::-1]:
                for point in points:
                    figures, check = measure(
                        Path(tree), repository, point, args.requests, args.rounds, args.core
                    )
                    if not figures:
                        print(f"run {run} {tree} {point}: {check}", file=sys.stderr)
                        return 1
                    best.setdefault((tree, point), []).append(min(figures))
                    medians.setdefault((tree, point), []).append(statistics.median(figures))
                    rounds = " ".join(f"{v:.1f}" for v in figures)
                    print(f"run {run} {tree} {point}: {rounds} us ({check})", flush=True)
    print("\n| point | " + " | ".join(trees) + " |")
    print("|---|" + "---:|" * len(trees))
    for point in points:
        cells = []
        for tree in trees:
            fastest = statistics.median(best[(tree, point)])
            spread = medians[(tree, point)]
            cells.append(f"{fastest:.1f} ({min(spread):.0f}-{max(spread):.0f})")
        print(f"| {point} | " + " | ".join(cells) + " |")
    return 0


def _profile(args: argparse.Namespace, trees: list[str], points: list[str]) -> int:
    import pstats

    with tempfile.TemporaryDirectory(prefix="edge-inprocess-") as work:
        from bench.mlserver import write_simple

        repository = str(write_simple(Path(work)))
        for tree in trees:
            for point in points:
                out = f"{args.profile}.{Path(tree).name}.{point}"
                figures, check = measure(
                    Path(tree), repository, point, args.requests, args.rounds, args.core, out
                )
                if not figures:
                    print(f"{tree} {point}: {check}", file=sys.stderr)
                    return 1
                stats = pstats.Stats(out)
                calls = stats.total_calls / (args.requests * args.rounds)  # type: ignore[attr-defined]
                print(f"\n{tree} {point}: {calls:.0f} calls a request ({check}); {out}")
                stats.sort_stats("tottime").print_stats(30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
