"""Where SqueezeNet's per-request CPU goes beyond raw ONNX Runtime's (issue 20): probes.

    python -m bench.squeeze_probe ort [--model FILE] [--rounds 5] [--runs 40] [--core 0]
    python -m bench.squeeze_probe options [--model FILE] [--rounds 6] [--runs 20] [--sets ...]
    python -m bench.squeeze_probe decode [--model FILE] [--rounds 40]
    python -m bench.squeeze_probe execute [--model FILE] [--rounds 100]
    python -m bench.squeeze_probe cold [--model FILE] [--rounds 60]
        [--between ort|copy|spin:MS|sleep:MS]
    python -m bench.squeeze_probe server --target tree:DIR|ceiling:http|ceiling:aio|ceiling:sync
        --protocol http|grpc [--seconds 6] [--model squeezenet_onnx] [--perf OUT.data]
        [--env NAME=VALUE] [--server-arg=--flag=value] [--loop-batch]

`ort`: one SqueezeNet session (bench.raw's options unless --server-options), pinned to one core,
run in blocks of --runs runs per variant, the variants' order rotating each round (the machine is
shared: blocks interleave so that load that comes and goes hits every variant alike). Per run:
the calling thread's CPU time (CLOCK_THREAD_CPUTIME_ID) and its minor page faults
(getrusage(RUSAGE_THREAD)) around `run` alone; the preparation of the input (copy, receive) is
measured apart. Variants:

- cached: the same array every run (bench.raw);
- copy: np.copy of it before each run;
- bytes: a new bytes object each run (tobytes), np.frombuffer over it: as the gRPC front end
  gets raw_input_contents;
- socket: 600 KB sent by a thread on another core through a socketpair and received into a new
  bytearray (recv_into, as the HTTP front end's read_body), np.frombuffer over it;
- odd1 / odd2 / odd4: np.frombuffer at byte offset 1, 2 or 4 of a bytes object (the HTTP binary
  tensor sits after the JSON header, at any offset): does ORT copy or slow down on them?
- thread: the cached array, run on a second thread (the server's instance thread) instead of the
  main one;
- busy: as `thread`, while the main thread on the same core receives a 600 KB message every
  --busy-ms (the event loop taking the next requests in while the model runs).

- socket_chunks: as socket, but read as aiohttp on uvloop hands a body over (256 KB bytes
  objects copied out of the loop's read buffer), then copied into one bytearray.

`options`: one session per set of ORT session options (graph level, arena, memory pattern,
denormals, IO binding, OrtValues), per-run thread CPU, blocks interleaved.

`decode`: a gRPC SqueezeNet request's decode, hot and cold (right after an ORT run, as on the
server's one core): protobuf's parse plus raw_input_contents[0], against split_raw_contents
(views over the received bytes).

`execute`: OrtInstance.execute's own Python (ORT's run replaced by its result), hot and right
after an ORT run, as it is and with the per-array dtype checks string models need.

`cold`: a few lines of per-request Python bookkeeping and a small gRPC request's parse, hot and
right after an ORT run: what the server's per-request Python really costs beside an image model.
`--between` replaces the ORT run: an 8 MB copy (data evicted, little time), a spin or a sleep of
MS milliseconds (time passes, nothing evicted by this process).

`server`: starts the target pinned to core 0, drives it with perf_analyzer at c=8 from core 1,
and prints per inference: process CPU, each thread's CPU (by tid), minor/major page faults and
voluntary/involuntary context switches, from /proc over the measured run. `--perf FILE` also
records it with perf's software clock and prints the us per inference by thread and by what the
samples' leaf frames are (ORT, Python, memmove, grpc, uvloop, kernel network / scheduling, ...).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import ROOT, pin_to_core
from bench.cpu_per_request import start_tree

Variant = Callable[[], tuple[dict[str, np.ndarray], float]]  # feed, preparation CPU (us)


def _thread_cpu_ns() -> int:
    return time.clock_gettime_ns(time.CLOCK_THREAD_CPUTIME_ID)


def _minflt() -> int:
    return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt


class Sender:
    """A thread on another core that sends `payload` through a socketpair on demand."""

    def __init__(self, payload: bytes, core: int) -> None:
        self.payload = payload
        self.near, self.far = socket.socketpair()
        for s in (self.near, self.far):
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
        self._go = threading.Semaphore(0)
        self._read_buffer = bytearray(256 * 1024)
        self._core = core
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(threading.get_native_id(), {self._core})
        while True:
            self._go.acquire()
            self.far.sendall(self.payload)

    def receive_chunks(self, chunk: int = 256 * 1024) -> bytearray:
        """As aiohttp on uvloop, then read_body: the socket read in 256 KB bytes objects (uvloop's
        read buffer copied out to a new bytes each time), then copied into one bytearray."""
        self._go.release()
        size = len(self.payload)
        body = bytearray(size)
        view = memoryview(body)
        filled = 0
        read_buffer = memoryview(self._read_buffer)
        while filled < size:
            n = self.near.recv_into(read_buffer, min(chunk, size - filled))
            part = bytes(read_buffer[:n])  # uvloop: data_received(bytes)
            view[filled : filled + n] = part
            filled += n
        return body

    def receive(self) -> bytearray:
        self._go.release()
        size = len(self.payload)
        body = bytearray(size)
        view = memoryview(body)
        filled = 0
        while filled < size:
            filled += self.near.recv_into(view[filled:], size - filled)
        return body


def ort_probe(args: argparse.Namespace) -> dict[str, Any]:
    pin_to_core(args.core)
    import onnxruntime as ort

    from bench.raw import batch1_feed, open_session

    if args.server_options:
        from edge_backends.api import InstanceSpec
        from edge_backends.ort import session_options

        spec = InstanceSpec(
            model_name="squeezenet_onnx", model_version=1, model_path=Path(args.model),
            instance_name="squeezenet_onnx_0",
        )  # fmt: skip
        session = ort.InferenceSession(
            args.model, sess_options=session_options(spec), providers=["CPUExecutionProvider"]
        )
    else:
        session = open_session(args.model)
    feed = batch1_feed(session)
    ((name, array),) = feed.items()
    payload = array.tobytes()
    shape = array.shape
    sender = Sender(payload, 1 - args.core if args.core in (0, 1) else 0)
    run = session._sess.run if args.binding else session.run
    names = [o.name for o in session.get_outputs()]
    run_options = ort.RunOptions()

    def timed(make: Callable[[], np.ndarray]) -> tuple[dict[str, np.ndarray], float]:
        t0 = _thread_cpu_ns()
        made = make()
        return {name: made}, (_thread_cpu_ns() - t0) / 1e3

    def odd(offset: int) -> Variant:
        def make() -> np.ndarray:
            data = b"\0" * offset + payload  # one new object, the tensor at `offset`
            return np.frombuffer(data, np.float32, array.size, offset).reshape(shape)

        return lambda: timed(make)

    variants: dict[str, Variant] = {
        "cached": lambda: (feed, 0.0),
        "copy": lambda: timed(lambda: np.copy(array)),
        "bytes": lambda: timed(lambda: np.frombuffer(array.tobytes(), np.float32).reshape(shape)),
        "socket": lambda: timed(lambda: np.frombuffer(sender.receive(), np.float32).reshape(shape)),
        "socket_chunks": lambda: timed(
            lambda: np.frombuffer(sender.receive_chunks(), np.float32).reshape(shape)
        ),
        "odd1": odd(1),
        "odd2": odd(2),
        "odd4": odd(4),
    }
    wanted = args.variants.split(",") if args.variants else [*variants, "thread", "busy"]
    results: dict[str, dict[str, list[float]]] = {
        v: {"run_us": [], "prep_us": [], "minflt": []} for v in wanted
    }

    def block(variant: str) -> None:
        if variant in ("thread", "busy"):
            return threaded_block(variant)
        make = variants[variant]
        out = results[variant]
        for _ in range(args.runs):
            inputs, prep = make()
            f0, t0 = _minflt(), _thread_cpu_ns()
            run(names, inputs, run_options)
            t1, f1 = _thread_cpu_ns(), _minflt()
            out["run_us"].append((t1 - t0) / 1e3)
            out["prep_us"].append(prep)
            out["minflt"].append(f1 - f0)

    def threaded_block(variant: str) -> None:
        out = results[variant]
        stop = threading.Event()

        def work() -> None:
            for _ in range(args.runs):
                f0, t0 = _minflt(), _thread_cpu_ns()
                run(names, feed, run_options)
                t1, f1 = _thread_cpu_ns(), _minflt()
                out["run_us"].append((t1 - t0) / 1e3)
                out["prep_us"].append(0.0)
                out["minflt"].append(f1 - f0)
            stop.set()

        worker = threading.Thread(target=work)
        worker.start()
        if variant == "busy":
            while not stop.wait(args.busy_ms / 1e3):
                sender.receive()
        worker.join()

    for _ in range(3 * args.runs // 10 + 3):  # warm-up
        run(names, feed, run_options)
    for round_index in range(args.rounds):
        shift = round_index % len(wanted)
        for variant in wanted[shift:] + wanted[:shift]:
            block(variant)
    summary: dict[str, Any] = {}
    for variant, out in results.items():
        summary[variant] = {
            "run_us_median": round(statistics.median(out["run_us"]), 1),
            "run_us_mean": round(statistics.fmean(out["run_us"]), 1),
            "prep_us_median": round(statistics.median(out["prep_us"]), 1),
            "minflt_per_run": round(statistics.fmean(out["minflt"]), 2),
            "runs": len(out["run_us"]),
        }
    base = summary.get("cached", {}).get("run_us_median")
    if base:
        for variant in summary:
            summary[variant]["x_cached"] = round(summary[variant]["run_us_median"] / base, 4)
    return summary


OPTION_SETS: dict[str, dict[str, Any]] = {
    "raw": {},
    "extended": {"level": "extended"},
    "basic": {"level": "basic"},
    "no_arena": {"arena": False},
    "no_pattern": {"pattern": False},
    "denormal0": {"config": {"session.set_denormal_as_zero": "1"}},
    "iobinding": {"iobinding": True},
    "ortvalue": {"ortvalue": True},
}


def _runner(
    ort: Any, session: Any, options: dict[str, Any], feed: dict[str, np.ndarray], names: list[str]
) -> Callable[[], None]:
    if options.get("iobinding"):
        binding = session.io_binding()
        for key, value in feed.items():
            binding.bind_cpu_input(key, value)
        for out in names:
            binding.bind_output(out, "cpu")
        return lambda: session.run_with_iobinding(binding)
    if options.get("ortvalue"):
        values = {k: ort.OrtValue.ortvalue_from_numpy(v) for k, v in feed.items()}
        return lambda: session.run_with_ort_values(names, values)
    return lambda: session._sess.run(names, feed, None)


def options_probe(args: argparse.Namespace) -> dict[str, Any]:
    """Per-run thread CPU of one session per option set, blocks interleaved (cached input)."""
    pin_to_core(args.core)
    import onnxruntime as ort

    from bench.raw import batch1_feed

    levels = {
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    }
    wanted = args.sets.split(",") if args.sets else list(OPTION_SETS)
    runners: dict[str, Callable[[], None]] = {}
    for name in wanted:
        o = OPTION_SETS[name]
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        opts.inter_op_num_threads = 1
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        opts.add_session_config_entry("session.inter_op.allow_spinning", "0")
        for key, value in o.get("config", {}).items():
            opts.add_session_config_entry(key, value)
        opts.graph_optimization_level = levels[o.get("level", "all")]
        opts.enable_cpu_mem_arena = o.get("arena", True)
        opts.enable_mem_pattern = o.get("pattern", True)
        opts.log_severity_level = 3
        session = ort.InferenceSession(
            args.model, sess_options=opts, providers=["CPUExecutionProvider"]
        )
        feed = batch1_feed(session)
        names = [x.name for x in session.get_outputs()]
        runners[name] = _runner(ort, session, o, feed, names)
    times: dict[str, list[float]] = {name: [] for name in wanted}
    for runner in runners.values():
        for _ in range(5):
            runner()
    for round_index in range(args.rounds):
        shift = round_index % len(wanted)
        for name in wanted[shift:] + wanted[:shift]:
            runner = runners[name]
            for _ in range(args.runs):
                t0 = _thread_cpu_ns()
                runner()
                times[name].append((_thread_cpu_ns() - t0) / 1e3)
    base = statistics.median(times[wanted[0]])
    return {
        name: {
            "run_us_median": round(statistics.median(t), 1),
            "x_first": round(statistics.median(t) / base, 4),
            "runs": len(t),
        }
        for name, t in times.items()
    }


RAW_INPUT_CONTENTS = 7  # ModelInferRequest.raw_input_contents' field number


def _varint(data: memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def split_raw_contents(wire: bytes) -> tuple[bytes, list[tuple[int, int]]]:
    """A serialized ModelInferRequest without its raw_input_contents, and where each of those
    lies in `wire` (offset, length): the message's other fields parse as before and the tensors
    become views over the bytes gRPC handed over, instead of two more copies (protobuf's parse
    into its arena, then a new bytes object on each raw_input_contents[i]). A sketch to measure
    the saving, not a parser for the server: it knows only the wire types that message uses."""
    data = memoryview(wire)
    rest: list[bytes] = []
    spans: list[tuple[int, int]] = []
    pos, end = 0, len(data)
    while pos < end:
        start = pos
        key, pos = _varint(data, pos)
        kind = key & 7
        if kind == 2:
            length, pos = _varint(data, pos)
            if key >> 3 == RAW_INPUT_CONTENTS:
                spans.append((pos, length))
                pos += length
                continue
            pos += length
        elif kind == 0:
            _, pos = _varint(data, pos)
        elif kind == 1:
            pos += 8
        elif kind == 5:
            pos += 4
        else:
            raise ValueError(f"wire type {kind} at {start}")
        rest.append(wire[start:pos])
    return b"".join(rest), spans


def decode_probe(args: argparse.Namespace) -> dict[str, Any]:
    """The gRPC request's decode, hot (back to back) and cold (right after one ORT run, as on
    the server's core): protobuf parse + raw_input_contents[0] vs split_raw_contents."""
    pin_to_core(args.core)
    from tritonclient.grpc import service_pb2

    from bench.raw import batch1_feed, open_session

    session = open_session(args.model)
    feed = batch1_feed(session)
    ((name, array),) = feed.items()
    names = [o.name for o in session.get_outputs()]
    request = service_pb2.ModelInferRequest(model_name="squeezenet_onnx", id="1")
    request.inputs.add(name=name, datatype="FP32", shape=list(array.shape))
    request.outputs.add(name=names[0])
    request.raw_input_contents.append(array.tobytes())
    wire = request.SerializeToString()
    parse = service_pb2.ModelInferRequest.FromString

    def protobuf() -> np.ndarray:
        msg = parse(wire)
        return np.frombuffer(msg.raw_input_contents[0], np.float32)

    def split() -> np.ndarray:
        rest, spans = split_raw_contents(wire)
        msg = parse(rest)
        assert msg.inputs[0].name == name
        offset, length = spans[0]
        return np.frombuffer(wire, np.float32, length // 4, offset)

    assert np.array_equal(protobuf(), split())
    ways = {"protobuf": protobuf, "split": split}
    times: dict[str, list[float]] = {f"{w} {h}": [] for w in ways for h in ("hot", "cold")}
    for round_index in range(args.rounds):
        for way, function in ways.items() if round_index % 2 else reversed(ways.items()):
            for _ in range(3):
                function()
            t0 = _thread_cpu_ns()
            function()
            times[f"{way} hot"].append((_thread_cpu_ns() - t0) / 1e3)
            session._sess.run(names, feed, None)
            t0 = _thread_cpu_ns()
            function()
            times[f"{way} cold"].append((_thread_cpu_ns() - t0) / 1e3)
    return {k: round(statistics.median(v), 1) for k, v in times.items()}


def cold_probe(args: argparse.Namespace) -> dict[str, Any]:
    """Per-request Python, hot (back to back) and cold (right after one ORT run on the same
    core, as the server's loop runs between two SqueezeNet executions): a few lines of request
    bookkeeping (dataclasses, a dict, a future), and parsing a small gRPC request."""
    import asyncio
    from dataclasses import dataclass, field

    from tritonclient.grpc import service_pb2

    from bench.raw import batch1_feed, open_session

    pin_to_core(args.core)
    session = open_session(args.model)
    feed = batch1_feed(session)
    names = [o.name for o in session.get_outputs()]

    @dataclass
    class Job:
        name: str
        inputs: dict[str, int]
        outputs: list[int] = field(default_factory=list)
        ns: int = 0

    loop = asyncio.new_event_loop()

    def bookkeeping() -> list[str]:
        jobs = []
        for i in range(8):
            job = Job(f"m{i}", {"a": i})
            job.ns = time.monotonic_ns()
            job.outputs.append(i)
            jobs.append(job)
        by_name = {job.name: job for job in jobs}
        future = loop.create_future()
        future.set_result(len(by_name))
        future.result()
        return sorted(by_name)

    small = service_pb2.ModelInferRequest(model_name="simple", id="1")
    small.inputs.add(name="INPUT0", datatype="INT32", shape=[1, 16])
    small.raw_input_contents.append(bytes(64))
    wire = small.SerializeToString()

    def parse_small() -> np.ndarray:
        msg = service_pb2.ModelInferRequest.FromString(wire)
        tensor = msg.inputs[0]
        return np.frombuffer(msg.raw_input_contents[0], np.int32).reshape(tuple(tensor.shape))

    big = np.ones(2 << 20, np.float32)
    scratch = np.empty_like(big)

    def spin(seconds: float) -> None:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass

    kind, _, ms = args.between.partition(":")
    between: Callable[[], Any] = {
        "ort": lambda: session._sess.run(names, feed, None),
        "copy": lambda: np.copyto(scratch, big),  # 8 MB through the caches, ~0.3 ms
        "spin": lambda: spin(float(ms or 7) / 1e3),  # time passes, almost no memory touched
        "sleep": lambda: time.sleep(float(ms or 7) / 1e3),
    }[kind]
    ways: dict[str, Callable[[], Any]] = {"bookkeeping": bookkeeping, "parse_small": parse_small}
    times: dict[str, list[float]] = {f"{w} {h}": [] for w in ways for h in ("hot", "cold")}
    for _ in range(args.rounds):
        for way, function in ways.items():
            for _ in range(3):
                function()
            t0 = _thread_cpu_ns()
            function()
            times[f"{way} hot"].append((_thread_cpu_ns() - t0) / 1e3)
            between()
            t0 = _thread_cpu_ns()
            function()
            times[f"{way} cold"].append((_thread_cpu_ns() - t0) / 1e3)
    loop.close()
    return {k: round(statistics.median(v), 1) for k, v in times.items()}


def execute_probe(args: argparse.Namespace) -> dict[str, Any]:
    """edge_backends.ort's OrtInstance.execute, its own Python only (ORT's run replaced by its
    cached result), hot and right after a real ORT run: as it runs now, and with the per-array
    dtype checks a model with string tensors needs (every model before 5a05882)."""
    from bench.raw import batch1_feed
    from edge_backends.api import InstanceSpec
    from edge_backends.ort import OrtBackend

    pin_to_core(args.core)
    spec = InstanceSpec(
        model_name="squeezenet_onnx", model_version=1, model_path=Path(args.model),
        instance_name="squeezenet_onnx_0",
    )  # fmt: skip
    backend = OrtBackend()
    instances = {"now": backend.create_instance(spec), "checks": backend.create_instance(spec)}
    instances["checks"]._has_strings = True
    session = instances["now"]._session
    feed = batch1_feed(session)
    names = [o.name for o in session.get_outputs()]
    real = session._sess.run
    cached = real(names, feed, None)
    for instance in instances.values():
        instance._run = lambda _names, _feed, _options: cached
    times: dict[str, list[float]] = {f"{w} {h}": [] for w in instances for h in ("hot", "cold")}
    for round_index in range(args.rounds):
        order = list(instances.items())
        for way, instance in order if round_index % 2 else order[::-1]:
            for _ in range(3):
                instance.execute(feed, names)
            t0 = _thread_cpu_ns()
            instance.execute(feed, names)
            times[f"{way} hot"].append((_thread_cpu_ns() - t0) / 1e3)
            real(names, feed, None)
            t0 = _thread_cpu_ns()
            instance.execute(feed, names)
            times[f"{way} cold"].append((_thread_cpu_ns() - t0) / 1e3)
    return {k: round(statistics.median(v), 1) for k, v in times.items()}


# --- server probe --------------------------------------------------------------------------

HZ = os.sysconf("SC_CLK_TCK")


def _proc_counters(pid: int) -> dict[str, float]:
    """utime+stime (s), minflt, majflt, ctx switches, per process and per thread (by name)."""
    out: dict[str, float] = {}
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    out["cpu_s"] = (int(fields[11]) + int(fields[12])) / HZ
    out["minflt"] = int(fields[7])
    out["majflt"] = int(fields[9])
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
            status = (task / "status").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        f = stat.rsplit(")", 1)[1].split()
        out[f"thread {task.name} {comm} cpu_s"] = (int(f[11]) + int(f[12])) / HZ
        for line in status.splitlines():
            if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                label, value = line.split(":")
                out[label] = out.get(label, 0) + int(value)
    return out


def _inference_count(url: str, model: str) -> int:
    import urllib.request

    with urllib.request.urlopen(f"http://{url}/v2/models/{model}/stats", timeout=5) as r:
        data = json.loads(r.read())
    return int(data["model_stats"][0]["inference_count"])


def server_probe(args: argparse.Namespace) -> dict[str, Any]:
    from bench.cpu_per_request import Target, start_ceiling
    from bench.perf import DEFAULT_TOOL
    from configs.generate import main as generate

    with tempfile.TemporaryDirectory(prefix="edge-probe-") as work:
        everything = Path(work) / "all"
        generate([str(everything)])
        repository = Path(work) / "models"
        repository.mkdir()
        import shutil

        shutil.copytree(everything / args.model, repository / args.model)
        kind, _, where = args.target.partition(":")
        env_before = dict(os.environ)
        os.environ.update(dict(e.split("=", 1) for e in args.env))
        try:
            target: Target = (
                start_tree(Path(where).resolve(), repository, args.server_arg)
                if kind == "tree"
                else start_ceiling(where, repository, args.model)
            )
        finally:
            os.environ.clear()
            os.environ.update(env_before)
        if args.loop_batch:  # the main thread (the event loop) never preempts on wake-up
            os.sched_setscheduler(target.proc.pid, os.SCHED_BATCH, os.sched_param(0))
        try:
            url = target.grpc if args.protocol == "grpc" else target.http
            stats_url = target.http if kind == "tree" or where == "http" else None
            command = [
                "taskset", "-c", "1", str(DEFAULT_TOOL), "-m", args.model, "-u", url,
                "-i", args.protocol, "--concurrency-range", "8:8",
                "--measurement-interval", str(int(args.seconds * 1000)),
                "--stability-percentage", "1000", "--max-trials", "1",
            ]  # fmt: skip
            warm = [*command[:-6], "--measurement-interval", "1500", "--stability-percentage",
                    "1000", "--max-trials", "1"]  # fmt: skip
            subprocess.run(warm, capture_output=True, check=False)
            count0 = _count(target, args, stats_url)
            before = _proc_counters(target.proc.pid)
            recorder = _start_perf(target.proc.pid, args.perf) if args.perf else None
            done = subprocess.run(command, capture_output=True, text=True, check=False)
            if recorder is not None:
                recorder.send_signal(signal.SIGINT)
                recorder.wait(60)
            after = _proc_counters(target.proc.pid)
            count1 = _count(target, args, stats_url)
        finally:
            target.stop()
    n = count1 - count0
    per = {k: (after.get(k, 0) - before.get(k, 0)) / max(n, 1) for k in after}
    result: dict[str, Any] = {"target": args.target, "protocol": args.protocol, "inferences": n}
    for key, value in sorted(per.items()):
        if key.startswith("thread") and value < 1e-6:
            continue  # idle threads
        result[key.replace("_s", "_us") if key.endswith("cpu_s") else key] = (
            round(value * 1e6, 1) if key.endswith("cpu_s") else round(value, 2)
        )
    if args.perf:
        result["perf us per inference"] = {
            k: round(v / max(n, 1), 1) for k, v in perf_categories(args.perf, PERF_HZ).items()
        }
    if "Request concurrency: 8" not in done.stdout:
        result["perf_analyzer"] = done.stdout[-400:] + done.stderr[-400:]
    return result


PERF_HZ = 1999


def _start_perf(pid: int, output: str) -> subprocess.Popen[bytes]:
    """perf's software CPU clock over every thread of `pid` (no hardware counters needed)."""
    command = ["perf", "record", "-q", "-e", "cpu-clock", "-F", str(PERF_HZ), "-g", "-p", str(pid),
               "-o", output]  # fmt: skip
    recorder = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.5)  # attached
    return recorder


def _category(frames: list[tuple[str, str]]) -> str:
    """What a sample's leaf frame (symbol, library) is spent on."""
    sym, dso = frames[0]
    chain = " ".join(f for f, _ in frames)
    kinds = [
        ("onnxruntime" in dso, "ort"),
        ("memmove" in sym or "memcpy" in sym, "memmove"),
        (dso.startswith("libpython"), "python"),
        ("kernel" in dso and any(k in chain for k in ("softirq", "tcp", "skb", "_copy_to_iter")),
         "kernel network"),
        ("kernel" in dso and any(k in chain for k in ("schedule", "finish_task_switch", "futex")),
         "kernel scheduling"),
        ("kernel" in dso, "kernel other"),
        ("cygrpc" in dso, "grpc"),
        ("_message" in dso, "protobuf"),
        ("loop.cpython" in dso, "uvloop"),
        (any(k in dso for k in ("aiohttp", "_http_", "yarl", "multidict", "propcache")),
         "aiohttp C"),
        ("multiarray" in dso, "numpy"),
    ]  # fmt: skip
    return next((kind for hit, kind in kinds if hit), "other")


def perf_categories(data: str, hz: int) -> dict[str, float]:
    """us of CPU by category (and by thread: 'tid N') in a `perf record` file."""
    import collections
    import re

    out = subprocess.run(["perf", "script", "-i", data, "-F", "tid,ip,sym,dso"],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    counts: collections.Counter[str] = collections.Counter()
    tid, frames = "", list[tuple[str, str]]()
    for line in [*out.splitlines(), ""]:
        if line.strip().isdigit():  # a sample's header: its tid (right-aligned)
            tid, frames = line.strip(), []
        elif line.strip():
            parts = line.split(None, 1)
            m = re.match(r"(.*) \((.*)\)$", parts[1] if len(parts) > 1 else "")
            frames.append((m.group(1), m.group(2).rsplit("/", 1)[-1]) if m else ("?", "?"))
        elif frames:
            counts[_category(frames)] += 1
            counts[f"tid {tid}"] += 1
            frames = []
    us = 1e6 / hz
    return {k: v * us for k, v in sorted(counts.items(), key=lambda kv: -kv[1])}


def _count(target: Any, args: argparse.Namespace, stats_url: str | None) -> int:
    """The model's inference_count (over HTTP; a gRPC-only ceiling over gRPC)."""
    if stats_url is not None:
        return _inference_count(stats_url, args.model)
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(target.grpc)
    stats = client.get_inference_statistics(args.model, as_json=True)
    return int(stats["model_stats"][0]["inference_count"])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.squeeze_probe")
    sub = parser.add_subparsers(dest="what", required=True)
    o = sub.add_parser("ort")
    o.add_argument("--model", default=None, help="model.onnx (default: the example's)")
    o.add_argument("--rounds", type=int, default=5)
    o.add_argument("--runs", type=int, default=40)
    o.add_argument("--core", type=int, default=0)
    o.add_argument("--variants", default="")
    o.add_argument("--busy-ms", type=float, default=2.0)
    o.add_argument("--binding", action="store_true", help="run through _sess.run as the server")
    o.add_argument("--server-options", action="store_true", help="edge_backends.ort's options")
    p = sub.add_parser("options")
    p.add_argument("--model", default=None)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--core", type=int, default=0)
    p.add_argument("--sets", default="", help="of " + ",".join(OPTION_SETS))
    d = sub.add_parser("decode")
    d.add_argument("--model", default=None)
    d.add_argument("--rounds", type=int, default=40)
    d.add_argument("--core", type=int, default=0)
    e = sub.add_parser("execute")
    e.add_argument("--model", default=None)
    e.add_argument("--rounds", type=int, default=100)
    e.add_argument("--core", type=int, default=0)
    c = sub.add_parser("cold")
    c.add_argument("--model", default=None)
    c.add_argument("--rounds", type=int, default=60)
    c.add_argument("--between", default="ort", help="ort | copy | spin[:MS] | sleep[:MS]")
    c.add_argument("--core", type=int, default=0)
    s = sub.add_parser("server")
    s.add_argument("--target", required=True)
    s.add_argument("--protocol", choices=("http", "grpc"), required=True)
    s.add_argument("--seconds", type=float, default=6.0)
    s.add_argument("--model", default="squeezenet_onnx")
    s.add_argument("--server-arg", action="append", default=[], help="for appliance serve")
    s.add_argument("--perf", default="", help="perf record into this file; us by category")
    s.add_argument("--loop-batch", action="store_true", help="SCHED_BATCH for the main thread")
    s.add_argument("--env", action="append", default=[], help="NAME=VALUE for the server")
    args = parser.parse_args(argv)
    if args.what in ("ort", "options", "decode", "cold", "execute"):
        if args.model is None:
            args.model = _example_model()
        probes = {
            "ort": ort_probe,
            "options": options_probe,
            "decode": decode_probe,
            "cold": cold_probe,
            "execute": execute_probe,
        }
        probe = probes[args.what]
        print(json.dumps(probe(args), indent=1))
    else:
        print(json.dumps(server_probe(args), indent=1))
    return 0


def _example_model() -> str:
    from configs.generate import main as generate

    folder = Path(tempfile.mkdtemp(prefix="edge-probe-model-"))
    generate([str(folder)])
    return str(folder / "squeezenet_onnx" / "1" / "model.onnx")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main())
