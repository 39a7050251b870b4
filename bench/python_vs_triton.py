"""Python models: edge-appliance against tritonserver's own Python backend, same model.py files.

    python -m bench.python_vs_triton [--trees .[,/tmp/old]] [--no-triton] [--floors] [--rounds 2]
        [--seconds 5] [--points add_sub:http:1,add_sub:grpc:1,...] [--output FILE.md]

The repository (written here, our own model.py files): `add_sub` (INPUT0 + INPUT1 and
INPUT0 - INPUT1, FP32 [4], as python_backend's example does); `bls`, which computes the same by
calling add_sub through `pb_utils.InferenceRequest(...).exec()`; `repeat`, decoupled, answering
each request with 100 responses (gRPC streaming). A point is MODEL:PROTOCOL:CONCURRENCY, the
protocol http, grpc or grpc-stream (perf_analyzer --streaming).

Opt-in (`--points squeeze:grpc:2,squeeze:http:2`, about a minute more): `squeeze`, a model.py
running SqueezeNet (the onnx wheel's light_squeezenet, written by configs.generate: FP32
data_0 [1,3,224,224] in, softmaxout_1 [1,1000,1,1] out) in its own ONNX Runtime session, one
intra-op and one inter-op thread, sequential, no spinning, all graph optimizations: the same
options under both servers. Triton's Python backend runs model.py under its venv's Python
($TT_VENV; by default scripts/tritonserver-reference's, ~/.cache/edge-appliance/
tritonserver-venv), which has no ONNX Runtime: when a squeeze point is asked for, the bench pip
installs this venv's onnxruntime version into it (from the package registry, once; numpy
stays the venv's own), or skips Triton's squeeze points with the reason.

Each server (every tree's `appliance serve`, and tritonserver 2.51 through
../shared/tools/tritonserver.sh, skipped with the reason where it cannot run) is started pinned
to core 0, its model processes inheriting the pin; perf_analyzer drives it from core 1. A
point's CPU is the utime + stime of the server's whole process tree (the server and its model
processes, from /proc) over the run, divided by the inferences the server itself counted
(the model's statistics, success count); its throughput is perf_analyzer's. Rounds alternate
which server goes first; the table gives medians over rounds and the ratio of Triton's CPU to
each tree's (above 1: cheaper than Triton). A second table gives the model's process alone
(the busiest process running a model.py: our `multiprocessing.spawn` children, Triton's
`triton_python_backend_stub`), per inference the same way. Where perf_analyzer gives no
throughput (it fails when a window's measurement is unstable), the point's throughput is the
server's count over the run's wall time instead (a little lower: perf_analyzer's start is in
it), and says so. The machine may be shared: read the ratios of one run, not the absolutes.

With 588 KiB inputs over HTTP (squeeze:http) both servers' throughput suffers stalls of 0.2-1 s
on a loaded core: the request fills the socket's receive buffer while the core runs the model
(TCP zero-window probes, in `nstat`); the CPU per inference is unaffected.

`--floors` adds the floor of the gRPC points: grpcio's synchronous server doing nothing but
the protocol for add_sub (bench.ceiling_grpc --mode sync, numpy's add and subtract, counted by
its own statistics), once with gRPC core's defaults and once with its EventEngine listener off
(GRPC_EXPERIMENTS, as the command sets it: appliance/face/__init__.py); measured on the
add_sub gRPC points only.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Collection, Sequence
from pathlib import Path

from bench.common import free_port, process_tree
from bench.cpu import process_cpu_s
from bench.cpu_per_request import Target, start_tree
from bench.perf import DEFAULT_TOOL

TRITON = "tritonserver"
RESPONSES = 100
DEFAULT_POINTS = (
    "add_sub:http:1,add_sub:grpc:1,add_sub:http:8,add_sub:grpc:8,"
    "bls:grpc:1,bls:grpc:8,repeat:grpc-stream:1"
)
READY_S = 180.0
# The floors (`--floors`): name -> the GRPC_EXPERIMENTS they run with (None: core's defaults).
FLOORS = {"grpcio-sync": None, "grpcio-sync-listener-off": "-event_engine_listener"}
SQUEEZE = "squeeze"
PIP_S = 600

ADD_SUB_PY = """\
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT0", (a + b).astype(np.float32)),
                pb_utils.Tensor("OUTPUT1", (a - b).astype(np.float32)),
            ]))
        return responses
"""

BLS_PY = """\
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            call = pb_utils.InferenceRequest(
                model_name="add_sub",
                requested_output_names=["OUTPUT0", "OUTPUT1"],
                inputs=[pb_utils.get_input_tensor_by_name(request, "INPUT0"),
                        pb_utils.get_input_tensor_by_name(request, "INPUT1")],
            )
            answer = call.exec()
            if answer.has_error():
                raise pb_utils.TritonModelException(answer.error().message())
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.get_output_tensor_by_name(answer, "OUTPUT0"),
                pb_utils.get_output_tensor_by_name(answer, "OUTPUT1"),
            ]))
        return responses
"""

REPEAT_PY = f"""\
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            for _ in range({RESPONSES}):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", data)]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

TWO_IN = """\
input [
  {{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 4 ] }},
  {{ name: "INPUT1", data_type: TYPE_FP32, dims: [ 4 ] }}
]
output [
  {{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 4 ] }},
  {{ name: "OUTPUT1", data_type: TYPE_FP32, dims: [ 4 ] }}
]
"""
CONFIG = """\
name: "{name}"
backend: "python"
max_batch_size: 0
{tensors}
instance_group [ {{ count: 1, kind: KIND_CPU }} ]
{extra}"""
REPEAT_TENSORS = """\
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ 4 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 4 ] } ]
"""
SQUEEZE_PY = """\
import os

import onnxruntime as ort
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        opts.add_session_config_entry("session.inter_op.allow_spinning", "0")
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.log_severity_level = 3
        path = os.path.join(args["model_repository"], args["model_version"], "model.onnx")
        self.session = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])

    def execute(self, requests):
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "data_0").as_numpy()
            (out,) = self.session.run(["softmaxout_1"], {"data_0": data})
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("softmaxout_1", out)]))
        return responses
"""
SQUEEZE_TENSORS = """\
input [ { name: "data_0", data_type: TYPE_FP32, dims: [ 1, 3, 224, 224 ] } ]
output [ { name: "softmaxout_1", data_type: TYPE_FP32, dims: [ 1, 1000, 1, 1 ] } ]
"""
MODELS = {
    "add_sub": (ADD_SUB_PY, TWO_IN.format(), ""),
    "bls": (BLS_PY, TWO_IN.format(), ""),
    "repeat": (REPEAT_PY, REPEAT_TENSORS, "model_transaction_policy { decoupled: true }\n"),
    SQUEEZE: (SQUEEZE_PY, SQUEEZE_TENSORS, ""),
}
OPT_IN = {SQUEEZE}  # in the repository only when a point asks for it


def build(root: Path, wanted: Collection[str] = ()) -> Path:
    """The models (those of OPT_IN only if `wanted` names them) under `root`."""
    for name, (code, tensors, extra) in MODELS.items():
        if name in OPT_IN and name not in wanted:
            continue
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.py").write_text(code)
        (root / name / "config.pbtxt").write_text(
            CONFIG.format(name=name, tensors=tensors, extra=extra)
        )
        if name == SQUEEZE:
            from configs.generate import light_model, save  # imports onnx: only when asked

            save(light_model("light_squeezenet"), root / name / "1" / "model.onnx")
    return root


def triton_venv() -> Path:
    """The venv tritonserver.sh runs (TT_VENV), by default scripts/tritonserver-reference's."""
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / (
        "edge-appliance/tritonserver-venv"
    )
    return Path(os.environ.get("TT_VENV") or os.environ.get("TRITONSERVER_VENV") or default)


def ensure_onnxruntime(venv: Path) -> str | None:
    """This venv's onnxruntime version in `venv` (pip, from the registry); or why not."""
    import onnxruntime

    version = onnxruntime.__version__
    python = venv / "bin" / "python"
    probe = [str(python), "-c", "import onnxruntime; print(onnxruntime.__version__)"]
    found = subprocess.run(probe, capture_output=True, text=True, check=False)
    if found.returncode == 0 and found.stdout.strip() == version:
        return None
    print(f"installing onnxruntime=={version} into {venv} (pip)", flush=True)
    command = [str(python), "-m", "pip", "install", "-q", f"onnxruntime=={version}"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=PIP_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"pip install onnxruntime=={version} into {venv} failed: {exc}"
    if done.returncode != 0:
        return f"pip install onnxruntime=={version} into {venv} failed: {done.stderr[-300:]}"
    return None


def tree_cpu_s(pid: int) -> float:
    """utime + stime of pid and every live descendant."""
    return sum(process_cpu_s(p) for p in process_tree(pid))


MODEL_PROCESSES = ("multiprocessing.spawn", "triton_python_backend_stub")


def model_processes_cpu_s(pid: int) -> dict[int, float]:
    """utime + stime of each live descendant of pid that runs a model.py."""
    found = {}
    for child in process_tree(pid):
        try:
            command = Path(f"/proc/{child}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if any(mark in command for mark in MODEL_PROCESSES):
            found[child] = process_cpu_s(child)
    return found


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as response:
        return bytes(response.read())


def served(http: str, model: str) -> int:
    """The inferences the server counted for `model` (its statistics, success count)."""
    stats = json.loads(_get(f"http://{http}/v2/models/{model}/stats"))
    return int(stats["model_stats"][0]["inference_stats"]["success"]["count"])


def counted(target: Target, model: str) -> int:
    """`served`, or for a floor (no HTTP) its statistics' inference_count over gRPC."""
    if target.http:
        return served(target.http, model)
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(target.grpc)
    try:
        stats = client.get_inference_statistics(model, as_json=True)
    finally:
        client.close()
    return int(stats["model_stats"][0].get("inference_count", 0))


def start_floor(name: str, repository: Path, log: Path) -> Target:
    """A floor (FLOORS) on core 0, accepting connections."""
    port = free_port()
    env = dict(os.environ)
    env.pop("GRPC_EXPERIMENTS", None)
    if FLOORS[name] is not None:
        env["GRPC_EXPERIMENTS"] = str(FLOORS[name])
    command = [
        "taskset", "-c", "0", sys.executable, "-m", "bench.ceiling_grpc", "--mode", "sync",
        "--model-repository", str(repository), "--models", "add_sub", "--port", str(port),
    ]  # fmt: skip
    with log.open("ab") as out:
        proc = subprocess.Popen(
            command, cwd=Path(__file__).parent.parent, env=env, stdout=out, stderr=subprocess.STDOUT
        )
    target = Target.__new__(Target)
    target.name, target.http, target.grpc, target.proc = name, "", f"127.0.0.1:{port}", proc
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return target
        except OSError:
            time.sleep(0.2)
    target.stop()
    raise SystemExit(f"floor {name} did not start (log: {log})")


def start_triton(tool: Path, repository: Path, log: Path) -> Target | str:
    """tritonserver (`tool`: the shared tritonserver.sh) on core 0, ready; or why it cannot run.
    Tried twice: on a loaded core its Python backend sometimes aborts while its stubs start
    (boost::interprocess::lock_exception, in its log)."""
    started = _start_triton(tool, repository, log)
    if isinstance(started, str) and started.startswith(f"{TRITON} exited"):
        print(f"{started}; starting it again", flush=True)
        started = _start_triton(tool, repository, log)
    return started


def _start_triton(tool: Path, repository: Path, log: Path) -> Target | str:
    if not tool.exists():
        return f"{tool} does not exist"
    env = {**os.environ, "TT_VENV": str(triton_venv())}
    setup = subprocess.run(
        [str(tool), "setup"], capture_output=True, text=True, check=False, env=env
    )
    if setup.returncode != 0:
        return f"tritonserver.sh setup failed: {setup.stderr.strip()[-300:]}"
    http, grpc, metrics = free_port(), free_port(), free_port()
    command = [
        "taskset", "-c", "0", str(tool), "run", str(repository),
        str(http), str(grpc), str(metrics), "--log-verbose", "0",
    ]  # fmt: skip
    with log.open("ab") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    target = Target.__new__(Target)
    target.name, target.http, target.grpc, target.proc = (
        TRITON,
        f"127.0.0.1:{http}",
        f"127.0.0.1:{grpc}",
        proc,
    )
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return f"tritonserver exited {proc.returncode} (log: {log})"
        try:
            _get(f"http://{target.http}/v2/health/ready")
            return target
        except OSError:
            time.sleep(0.3)
    target.stop()
    return f"tritonserver not ready within {READY_S:.0f} s"


def perf_run(
    tool: Path, model: str, url: str, protocol: str, concurrency: int, seconds: float
) -> float:
    """perf_analyzer from core 1; its throughput (0 if it failed)."""
    command = [
        "taskset", "-c", "1", str(tool), "-m", model, "-u", url,
        "-i", protocol.removesuffix("-stream"),
        *(["--streaming"] if protocol == "grpc-stream" else []),
        "--concurrency-range", f"{concurrency}:{concurrency}",
        "--measurement-interval", str(round(seconds * 1000 / 3)),
        "--stability-percentage", "1000", "--max-trials", "3",
        "--warmup-request-count", str(2 * concurrency),
    ]  # fmt: skip
    out = subprocess.run(command, capture_output=True, text=True, check=False)
    found = re.search(r"Throughput: ([\d.]+) infer/sec", out.stdout)
    if not found:
        print(f"perf_analyzer failed on {model} {protocol}: {out.stdout[-400:]}{out.stderr[-400:]}")
        return 0.0
    return float(found.group(1))


Point = tuple[str, str, int]
# -> (us per inference, infer/s, the busiest model process's us per inference)
Results = dict[tuple[str, Point], list[tuple[float, float, float]]]


def measure(
    tool: Path, target: Target, point: Point, seconds: float
) -> tuple[float, float, float]:
    model, protocol, concurrency = point
    url = target.http if protocol == "http" else target.grpc
    perf_run(tool, model, url, protocol, concurrency, 1.0)  # warm-up
    pid = target.proc.pid
    count0, cpu0, each0 = counted(target, model), tree_cpu_s(pid), model_processes_cpu_s(pid)
    started = time.monotonic()
    rate = perf_run(tool, model, url, protocol, concurrency, seconds)
    elapsed = time.monotonic() - started
    each1, cpu1, count1 = model_processes_cpu_s(pid), tree_cpu_s(pid), counted(target, model)
    done = count1 - count0
    if not done:
        return float("nan"), rate, float("nan")
    if not rate:
        # perf_analyzer gave no figure (e.g. "failed to obtain stable measurement" after a
        # window with a stall): the server's count over the run, perf_analyzer's start included
        rate = done / elapsed
        print(f"{model} {protocol}: throughput from the server's count instead, {rate:.0f}/s")
    busiest = max((used - each0.get(p, 0.0) for p, used in each1.items()), default=0.0)
    return (cpu1 - cpu0) / done * 1e6, rate, busiest / done * 1e6


def table(
    names: Sequence[str], points: Sequence[Point], results: Results, model_process: bool = False
) -> list[str]:
    """The tree's CPU (or with `model_process` the busiest model process's) and throughput."""
    trees = [n for n in names if n != TRITON and n not in FLOORS]
    column = 2 if model_process else 0
    what = "model process CPU us/inference" if model_process else "CPU us/inference, infer/s"
    head = "| point | " + " | ".join(f"{n}: {what}" for n in names)
    ratios = [f"Triton's CPU / {n}'s" for n in trees] if TRITON in names else []
    lines = [
        head + "".join(f" | {r}" for r in ratios) + " |",
        "|---|" + "--:|" * (len(names) + len(ratios)),
    ]
    for point in points:
        cells, us = [], {}
        for name in names:
            values = results.get((name, point), [])
            if not values:
                cells.append("")
                continue
            us[name] = statistics.median(v[column] for v in values)
            rate = statistics.median(v[1] for v in values)
            each = "/".join(f"{v[column]:.0f}" for v in values)
            rate_cell = "" if model_process else f", {rate:,.0f}/s"
            cells.append(f"{us[name]:,.0f} ({each}){rate_cell}")
        for tree in trees if ratios else ():
            both = TRITON in us and tree in us
            cells.append(f"{us[TRITON] / us[tree]:.2f}" if both else "")
        model, protocol, concurrency = point
        lines.append(f"| {model} {protocol} c={concurrency} | " + " | ".join(cells) + " |")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.python_vs_triton",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--trees", default=".", help="comma-separated checkouts to serve")
    parser.add_argument("--no-triton", action="store_true")
    parser.add_argument(
        "--floors", action="store_true", help="grpcio's sync server for add_sub, as peers"
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--points", default=DEFAULT_POINTS)
    parser.add_argument("--perf-analyzer", type=Path, default=DEFAULT_TOOL)
    parser.add_argument(
        "--tritonserver", type=Path, help="tritonserver.sh (default: beside perf_analyzer's)"
    )
    parser.add_argument("--output", type=Path)
    args = parser.parse_args(argv)
    points: list[Point] = []
    for text in args.points.split(","):
        model, protocol, concurrency = text.split(":")
        points.append((model, protocol, int(concurrency)))
    trees = [str(Path(t).resolve()) for t in args.trees.split(",") if t]
    names = trees + ([] if args.no_triton else [TRITON]) + (list(FLOORS) if args.floors else [])
    triton_tool = args.tritonserver or args.perf_analyzer.parent / "tritonserver.sh"
    notes: list[str] = []
    results: Results = {}
    started_at = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    wanted = {point[0] for point in points}
    triton_skips: set[str] = set()
    if TRITON in names and SQUEEZE in wanted:
        why = ensure_onnxruntime(triton_venv())
        if why:
            triton_skips.add(SQUEEZE)
            notes.append(f"tritonserver's {SQUEEZE} points skipped: {why}")
            print(notes[-1], flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-pyvt-") as work:
        repository = build(Path(work) / "models", wanted)
        triton_repository = (
            build(Path(work) / "triton-models", wanted - triton_skips)
            if triton_skips
            else repository
        )
        for round_index in range(args.rounds):
            for name in names if round_index % 2 == 0 else names[::-1]:
                if name == TRITON:
                    log = Path(work) / "triton.log"
                    started = start_triton(triton_tool, triton_repository, log)
                    if isinstance(started, str):
                        if not any(n.startswith("tritonserver skipped") for n in notes):
                            notes.append(f"tritonserver skipped: {started}")
                            print(notes[-1], flush=True)
                        continue
                    target = started
                elif name in FLOORS:
                    target = start_floor(name, repository, Path(work) / f"{name}.log")
                else:
                    target = start_tree(Path(name), repository)
                try:
                    for point in points:
                        if name == TRITON and point[0] in triton_skips:
                            continue
                        if name in FLOORS and point[:2] != ("add_sub", "grpc"):
                            continue
                        us, rate, alone = measure(args.perf_analyzer, target, point, args.seconds)
                        results.setdefault((name, point), []).append((us, rate, alone))
                        print(
                            f"round {round_index} {name} {':'.join(map(str, point))}: "
                            f"{us:.0f} us/inference (model process {alone:.0f}), {rate:.0f}/s",
                            flush=True,
                        )
                finally:
                    target.stop()
    lines = [
        f"python_vs_triton, from {started_at}, {args.rounds} rounds of {args.seconds:g} s "
        f"points, {os.cpu_count()} CPUs; medians (each round's figure in brackets)",
        "",
        *table(names, points, results),
        "",
        *table(names, points, results, model_process=True),
        *(["", *notes] if notes else []),
    ]
    text = "\n".join(lines) + "\n"
    print("\n" + text)
    if args.output:
        args.output.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
