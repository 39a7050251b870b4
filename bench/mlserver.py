"""`simple` over HTTP JSON against MLServer 1.7.1 in its fastest setting, driven by wrk (issue 20).

    python -m bench.mlserver [--rounds 4] [--seconds 5] [--settings w0,w1] [--venv DIR]
                             [--connections 8] [--no-ceiling] [--tree DIR] [--output FILE.md]
                             [--quiet 60] [--patience 10]

1. MLServer 1.7.1 goes into its own virtual environment outside the repository (default
   `$XDG_CACHE_HOME/edge-appliance-bench/mlserver-1.7.1`, made once with `python -m venv` and pip;
   see REQUIREMENTS for the pins). Without wrk on PATH, or when MLServer cannot be installed, one
   SKIP line says why and the exit status is 0.
2. The same tiny model three ways, all pinned to core 0: this project's server (`--tree`: which
   checkout) on the example `simple` (configs.generate: INT32 [16] add/sub through ONNX
   Runtime), the aiohttp ceiling (bench.ceiling_http), and MLServer serving MODEL_SOURCE, a numpy
   `MLModel` written into a temporary folder, once per setting (`--settings`, see
   Setting.parse): parallel workers 0 or 1, the HTTP parser, and metrics, gzip and debug off
   unless asked for.
3. One urllib request to each checks a 200 and the right sum and difference before anything is
   measured, and a 3 s wrk run warms each up. Then rounds, alternating the order. Per server:
   wait (at most --patience s) until other processes use less than --quiet % of a core, a 1 s
   warm-up, then `taskset -c 1 wrk -t1 -c<N> -d<seconds>s --latency -s post.lua URL`, the Lua
   script POSTing one KServe v2 JSON body to /v2/models/simple/infer and printing wrk's own
   summary as JSON. A point with any non-2xx answer or socket error does not count.
   CPU per request: the server's CPU time (utime + stime of every thread of every process in
   its tree, from /proc) over the measured run, divided by the requests wrk completed; server
   CPU: the same time over the run's wall time (100% = the server kept its core busy). Other
   CPU: the machine's busy time minus the measured server's and this benchmark's own processes
   (bench.cpu), in % of one core; idle servers count as other.
4. Prints a Markdown table of medians over rounds and the ratios edge-appliance / MLServer: by
   throughput against the setting with the highest median infer/s, and by CPU per request
   (MLServer's us over ours) against the setting with the lowest median; each is the median of
   the per-round ratios. Exit status 1 when no MLServer setting could be measured.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import cpu
from bench.ceilings import start_ceiling, wait_listening
from bench.common import ROOT, free_port, process_tree
from bench.server import READY_TIMEOUT_S, Server, server_command, stop_server, wait_ready

MLSERVER_VERSION = "1.7.1"
# uvloop 0.22 broke MLServer's parallel workers (each dies in `asyncio.get_event_loop()`, so
# with the default parallel_workers 1 no model loads: SeldonIO/MLServer#2286; its fix, #2285,
# was still open in March 2026); MLServer itself asks for any uvloop.
# httptools is uvicorn's fast HTTP parser (its `[standard]` extra), which uvicorn takes when
# installed: part of MLServer's fastest setting. Setting "+h11" hides it to compare.
REQUIREMENTS = (f"mlserver=={MLSERVER_VERSION}", "uvloop<0.22", "httptools")
MARKER = "edge-bench-requirements.txt"
MODEL = "simple"
INFER_PATH = f"/v2/models/{MODEL}/infer"
INPUT0 = list(range(16))
INPUT1 = [1] * 16
INSTALL_TIMEOUT_S = 900.0
WARMUP_S = 1  # before each point: wrk opens its connections
FIRST_WARMUP_S = 3  # once per server, before the first round
QUIET_SAMPLE_S = 0.5
STARVED_PCT = 50.0  # a point whose server had less of its core was disturbed
SERVER_CORE, CLIENT_CORE = 0, 1

MODEL_SOURCE = '''\
"""`simple` for MLServer: OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1 (INT32)."""

from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse


class AddSub(MLModel):
    async def load(self) -> bool:
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        arrays = {item.name: NumpyCodec.decode_input(item) for item in payload.inputs}
        a, b = arrays["INPUT0"], arrays["INPUT1"]
        return InferenceResponse(
            model_name=self.name,
            id=payload.id,
            outputs=[
                NumpyCodec.encode_output("OUTPUT0", a + b),
                NumpyCodec.encode_output("OUTPUT1", a - b),
            ],
        )
'''

# `python -c` launcher for "+h11": uvicorn picks httptools when it imports, so make it not.
H11_LAUNCHER = (
    "import sys; sys.modules['httptools'] = None; "
    "from mlserver.cli.main import main; sys.exit(main())"
)

# wrk's own summary as one JSON line (latency in microseconds, from its full histogram).
LUA_DONE = r"""
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format('WRK_RESULT {"requests":%d,"duration_us":%d,"status_errors":%d,'
    .. '"connect_errors":%d,"read_errors":%d,"write_errors":%d,"timeout_errors":%d,'
    .. '"p50_us":%d,"p99_us":%d}\n', summary.requests, summary.duration, e.status, e.connect,
    e.read, e.write, e.timeout, latency:percentile(50), latency:percentile(99)))
end
"""


class Skip(Exception):
    """The comparison cannot run here (no wrk, no MLServer); the message says why."""


def request_body() -> bytes:
    """The KServe v2 JSON request every server gets: INPUT0 0..15, INPUT1 all ones."""
    inputs = [
        {"name": name, "shape": [1, 16], "datatype": "INT32", "data": data}
        for name, data in (("INPUT0", INPUT0), ("INPUT1", INPUT1))
    ]
    return json.dumps({"inputs": inputs}, separators=(",", ":")).encode()


def reply_problem(status: int, body: bytes) -> str | None:
    """None when an infer reply is a 200 with the right sum and difference, else what is wrong."""
    if status != 200:
        return f"HTTP {status}: {body[:300]!r}"
    try:
        outputs = {o["name"]: o for o in json.loads(body)["outputs"]}
        expected = {
            "OUTPUT0": [a + b for a, b in zip(INPUT0, INPUT1, strict=True)],
            "OUTPUT1": [a - b for a, b in zip(INPUT0, INPUT1, strict=True)],
        }
        for name, data in expected.items():
            got = outputs[name]
            if got["datatype"] != "INT32" or got["shape"] != [1, 16] or got["data"] != data:
                return f"wrong {name}: {json.dumps(got)[:300]}"
    except (ValueError, KeyError, TypeError) as exc:
        return f"unreadable reply ({exc!r}): {body[:300]!r}"
    return None


def check_answer(url: str) -> str | None:
    """One real request to http://url; None when the answer is right."""
    request = urllib.request.Request(
        f"http://{url}{INFER_PATH}",
        data=request_body(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return reply_problem(response.status, response.read())
    except urllib.error.HTTPError as exc:
        return reply_problem(exc.code, exc.read())
    except OSError as exc:
        return f"no answer: {exc!r}"


def lua_script(body: bytes) -> str:
    text = body.decode()
    if "]==]" in text:
        raise ValueError("the body cannot go into a Lua long string")
    return (
        'wrk.method = "POST"\n'
        'wrk.headers["Content-Type"] = "application/json"\n'
        f"wrk.body = [==[{text}]==]\n{LUA_DONE}"
    )


@dataclass(frozen=True)
class WrkResult:
    requests: int
    duration_s: float
    p50_ms: float
    p99_ms: float
    errors: dict[str, int]

    @property
    def infer_per_s(self) -> float:
        return self.requests / self.duration_s if self.duration_s > 0 else 0.0

    def problem(self, *, warm_up: bool = False) -> str | None:
        """Why the run cannot count (non-2xx answers, socket errors, nothing done), or None. A
        warm-up may complete nothing: on a busy shared core one second can pass unanswered."""
        bad = [f"{count} {kind}" for kind, count in self.errors.items() if count]
        if bad:
            return "wrk saw " + ", ".join(bad)
        return None if self.requests or warm_up else "wrk completed no request"


def parse_wrk(stdout: str) -> WrkResult:
    """The WRK_RESULT line that LUA_DONE prints at the end of a wrk run."""
    match = re.search(r"^WRK_RESULT (\{.*\})$", stdout, re.MULTILINE)
    if match is None:
        raise ValueError(f"no WRK_RESULT line in wrk's output:\n{stdout[-1500:]}")
    data = json.loads(match.group(1))
    errors = {
        "non-2xx": data["status_errors"],
        **{kind: data[f"{kind}_errors"] for kind in ("connect", "read", "write", "timeout")},
    }
    return WrkResult(
        requests=data["requests"],
        duration_s=data["duration_us"] / 1e6,
        p50_ms=data["p50_us"] / 1000,
        p99_ms=data["p99_us"] / 1000,
        errors=errors,
    )


def run_wrk(wrk: str, script: Path, url: str, seconds: int, connections: int) -> WrkResult:
    command = [
        "taskset", "-c", str(CLIENT_CORE), wrk, "-t1", f"-c{connections}", f"-d{seconds}s",
        "--timeout", "10s", "--latency", "-s", str(script), f"http://{url}{INFER_PATH}",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=seconds + 60)
    return parse_wrk(done.stdout + done.stderr)


@dataclass(frozen=True)
class Setting:
    """One MLServer configuration: `w<N>` (parallel workers) and modifiers that turn the
    slower defaults back on: `+h11` (no httptools), `+gzip`, `+metrics`, `+debug`."""

    workers: int
    httptools: bool = True
    gzip: bool = False
    metrics: bool = False
    debug: bool = False

    @staticmethod
    def parse(spec: str) -> Setting:
        head, *mods = spec.strip().split("+")
        unknown = set(mods) - {"h11", "gzip", "metrics", "debug"}
        if not re.fullmatch(r"w\d+", head) or unknown:
            raise ValueError(f"bad MLServer setting {spec!r}: w<workers>[+h11][+gzip]...")
        return Setting(
            int(head[1:]), "h11" not in mods, "gzip" in mods, "metrics" in mods, "debug" in mods
        )

    @property
    def name(self) -> str:
        flags = {"h11": not self.httptools, "gzip": self.gzip, "metrics": self.metrics}
        mods = [mod for mod, on in {**flags, "debug": self.debug}.items() if on]
        return "+".join([f"w{self.workers}", *mods])

    def describe(self) -> str:
        on_off = {True: "on", False: "off"}
        return (
            f"parallel_workers {self.workers}, {'httptools' if self.httptools else 'h11'}, "
            f"uvloop, metrics {on_off[self.metrics]}, gzip {on_off[self.gzip]}, "
            f"debug {on_off[self.debug]}"
        )

    def settings_json(self, http_port: int) -> dict[str, Any]:
        return {
            "debug": self.debug,
            "parallel_workers": self.workers,
            "metrics_endpoint": "/metrics" if self.metrics else None,
            "metrics_port": free_port(),
            "gzip_enabled": self.gzip,
            "host": "127.0.0.1",
            "http_port": http_port,
            "grpc_port": free_port(),
        }


def default_venv() -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "edge-appliance-bench" / f"mlserver-{MLSERVER_VERSION}"


def ensure_mlserver(venv: Path) -> Path:
    """The venv's python with REQUIREMENTS installed (installing them once); Skip when it cannot."""
    python = venv / "bin" / "python"
    marker = venv / MARKER
    wanted = "\n".join(REQUIREMENTS)
    if python.exists() and marker.exists() and marker.read_text() == wanted:
        return python
    if sys.version_info >= (3, 13):
        raise Skip(f"MLServer {MLSERVER_VERSION} needs Python < 3.13, this is {sys.version}")
    print(f"installing {' '.join(REQUIREMENTS)} into {venv} ...", flush=True)
    steps = [
        [sys.executable, "-m", "venv", str(venv)],
        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *REQUIREMENTS],
    ]
    for step in steps:
        try:
            done = subprocess.run(step, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise Skip(f"cannot install MLServer {MLSERVER_VERSION}: {exc}") from exc
        if done.returncode != 0:
            lines = [ln for ln in (done.stderr + done.stdout).splitlines() if ln.strip()]
            errors = [ln for ln in lines if "ERROR" in ln] or lines[-1:]
            raise Skip(f"cannot install MLServer {MLSERVER_VERSION}: {' | '.join(errors[-2:])}")
    marker.write_text(wanted)
    return python


def versions(python: Path) -> str:
    names = ("mlserver", "uvicorn", "uvloop", "httptools", "fastapi", "starlette", "pydantic")
    code = (
        "import importlib.metadata as m\n"
        f"print(', '.join(n + ' ' + m.version(n) for n in {names!r}))"
    )
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=60)
    return done.stdout.strip() or done.stderr.strip()[-300:]


def start_edge(tree: Path, repository: Path, log_path: Path) -> Server:
    """`python -m appliance serve` from a checkout (this one by default), defaults otherwise."""
    http_port, grpc_port = free_port(), free_port()
    log_file = log_path.open("wb")
    proc = subprocess.Popen(
        server_command(repository, SERVER_CORE, http_port, grpc_port),
        cwd=tree,
        stdout=log_file,
        stderr=subprocess.STDOUT,
    )
    return Server(proc, f"127.0.0.1:{http_port}", f"127.0.0.1:{grpc_port}", log_path, log_file)


def start_mlserver(python: Path, setting: Setting, work: Path) -> Server:
    folder = work / f"mlserver-{setting.name}"
    (folder / MODEL).mkdir(parents=True)
    (folder / MODEL / "model.py").write_text(MODEL_SOURCE)
    model_settings = {"name": MODEL, "implementation": "model.AddSub"}
    (folder / MODEL / "model-settings.json").write_text(json.dumps(model_settings))
    port = free_port()
    (folder / "settings.json").write_text(json.dumps(setting.settings_json(port)))
    if setting.httptools:
        program = [str(python.parent / "mlserver")]
    else:
        program = [str(python), "-c", H11_LAUNCHER]
    log_path = work / f"mlserver-{setting.name}.log"
    log_file = log_path.open("wb")
    proc = subprocess.Popen(
        ["taskset", "-c", str(SERVER_CORE), *program, "start", str(folder)],
        cwd=folder,
        stdout=log_file,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own group: workers left behind can be ended with it
    )
    url = f"127.0.0.1:{port}"
    return Server(proc, url, url, log_path, log_file)


def wait_model_ready(server: Server, timeout_s: float = READY_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not server.alive():
            raise RuntimeError(f"exited with {server.proc.returncode}:\n{server.log_tail()}")
        try:
            url = f"http://{server.http_url}/v2/models/{MODEL}/ready"
            with urllib.request.urlopen(url, timeout=1) as response:
                if response.status == 200:
                    return
        except (OSError, ValueError):
            pass
        time.sleep(0.2)
    raise TimeoutError(f"model not ready within {timeout_s:.0f} s:\n{server.log_tail()}")


def loaded_libraries(pid: int) -> set[str]:
    """Which of the fast paths a live process has mapped (uvloop, httptools)."""
    try:
        maps = Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return set()
    return {name for name in ("uvloop", "httptools") if f"/{name}/" in maps}


def tree_cpu_s(pid: int) -> float:
    return sum(cpu.process_cpu_s(p) for p in process_tree(pid))


@dataclass
class Target:
    name: str
    setting: str
    server: Server
    problem: str | None = None
    points: list[Point] = field(default_factory=list)


@dataclass(frozen=True)
class Point:
    infer_per_s: float
    p50_ms: float
    p99_ms: float
    cpu_us: float
    other_pct: float
    server_pct: float = math.nan  # the measured server's CPU in % of one core: 100 = CPU-bound
    problem: str | None = None
    waited_s: float = 0.0  # for other processes to quiet down before the point


def failed(problem: str) -> Point:
    return Point(math.nan, math.nan, math.nan, math.nan, math.nan, problem=problem)


def complaints(server: Server, lines: int = 2) -> str:
    """The server log's last warnings or errors, to say what a non-2xx answer was."""
    found = [
        line.strip()[:200]
        for line in server.log_tail(400).splitlines()
        if re.search(r"WARNING|ERROR|Traceback|overload", line)
    ]
    return f" (its log: {' | '.join(found[-lines:])})" if found else ""


def wait_for_quiet(limit_pct: float, patience_s: float) -> float:
    """Seconds spent (at most about patience_s) waiting until other processes use less than
    limit_pct of one core over half a second: other sessions' benchmarks come and go."""
    began = time.monotonic()
    while True:
        before = cpu.snapshot()
        time.sleep(QUIET_SAMPLE_S)
        waited = time.monotonic() - began
        if cpu.other_cpu_pct(before, cpu.snapshot()) < limit_pct or waited >= patience_s:
            return waited - QUIET_SAMPLE_S


def measure(wrk: str, script: Path, target: Target, args: argparse.Namespace) -> Point:
    seconds, connections = args.seconds, args.connections
    waited_s = wait_for_quiet(args.quiet, args.patience)
    url = target.server.http_url
    warm = run_wrk(wrk, script, url, WARMUP_S, connections)
    if warm.problem(warm_up=True):
        return failed(f"warm-up: {warm.problem(warm_up=True)}")
    pid = target.server.proc.pid
    pids = tuple(process_tree(pid))
    before_cpu, before = tree_cpu_s(pid), cpu.snapshot(*pids)
    result = run_wrk(wrk, script, url, seconds, connections)
    after_cpu, after = tree_cpu_s(pid), cpu.snapshot(*pids)
    used_s = after_cpu - before_cpu
    problem = result.problem()
    return Point(
        result.infer_per_s,
        result.p50_ms,
        result.p99_ms,
        used_s / result.requests * 1e6 if result.requests else math.nan,
        cpu.other_cpu_pct(before, after),
        100 * used_s / max(1e-9, after.wall_s - before.wall_s),
        problem and problem + complaints(target.server),
        waited_s,
    )


def median(values: Sequence[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return statistics.median(finite) if finite else math.nan


def round_ratio(ours: Sequence[float], theirs: Sequence[float], *, cost: bool) -> float:
    """Median over rounds of how many times better ours is than theirs in the same round:
    ours/theirs for a throughput, theirs/ours for a cost (CPU per request). Rounds where
    either value is missing are left out."""
    pairs = [
        (o, t) for o, t in zip(ours, theirs, strict=True) if o > 0 and t > 0
    ]  # NaN > 0 is False
    return median([t / o if cost else o / t for o, t in pairs])


def column(target: Target, name: str) -> list[float]:
    return [float(getattr(point, name)) for point in target.points]


def best(candidates: Sequence[Target], name: str, *, highest: bool) -> Target | None:
    """The candidate with the best median `name` (None when none has a value)."""
    scored = [(median(column(t, name)), t) for t in candidates]
    scored = [(value, t) for value, t in scored if math.isfinite(value)]
    if not scored:
        return None
    return (max if highest else min)(scored, key=lambda pair: pair[0])[1]


def _fmt(value: float, spec: str, suffix: str = "") -> str:
    return f"{value:{spec}}{suffix}" if math.isfinite(value) else "-"


def starved_mark(point: Point) -> str:
    return "*" if point.server_pct < STARVED_PCT else ""


def table(targets: Sequence[Target]) -> list[str]:
    lines = [
        "| server | setting | infer/s | p50 ms | p99 ms | CPU us/req | server CPU | other CPU "
        "| infer/s by round | CPU us by round |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |",
    ]
    for t in targets:
        if not t.points:
            lines.append(f"| {t.name} | {t.setting} | - | - | - | - | - | - | {t.problem} | |")
            continue
        rates = " / ".join(_fmt(p.infer_per_s, ",.0f") + starved_mark(p) for p in t.points)
        costs = " / ".join(_fmt(p.cpu_us, ",.0f") + starved_mark(p) for p in t.points)
        lines.append(
            f"| {t.name} | {t.setting} | {_fmt(median(column(t, 'infer_per_s')), ',.0f')} "
            f"| {_fmt(median(column(t, 'p50_ms')), '.2f')} "
            f"| {_fmt(median(column(t, 'p99_ms')), '.2f')} "
            f"| {_fmt(median(column(t, 'cpu_us')), ',.0f')} "
            f"| {_fmt(median(column(t, 'server_pct')), '.0f', '%')} "
            f"| {_fmt(median(column(t, 'other_pct')), '.0f', '%')} | {rates} | {costs} |"
        )
    return lines


def ratio_lines(ours: Target, mlservers: Sequence[Target], ceiling: Target | None) -> list[str]:
    lines = []
    fastest = best(mlservers, "infer_per_s", highest=True)
    cheapest = best(mlservers, "cpu_us", highest=False)
    if fastest is not None and cheapest is not None:
        by_rate = round_ratio(
            column(ours, "infer_per_s"), column(fastest, "infer_per_s"), cost=False
        )
        by_cpu = round_ratio(column(ours, "cpu_us"), column(cheapest, "cpu_us"), cost=True)
        lines.append(
            f"- **edge-appliance / MLServer: {_fmt(by_rate, '.2f', 'x')} by throughput** (against "
            f"{fastest.name} {fastest.setting}, the fastest), **{_fmt(by_cpu, '.2f', 'x')} by CPU "
            f"per request** (against {cheapest.name} {cheapest.setting}, the cheapest); "
            "medians of the per-round ratios; issue 20's goal: >= 3.5x."
        )
    for t in mlservers:
        rate = round_ratio(column(ours, "infer_per_s"), column(t, "infer_per_s"), cost=False)
        cost = round_ratio(column(ours, "cpu_us"), column(t, "cpu_us"), cost=True)
        lines.append(
            f"- against {t.name} {t.setting}: {_fmt(rate, '.2f', 'x')} by throughput, "
            f"{_fmt(cost, '.2f', 'x')} by CPU per request"
        )
    if ceiling is not None and ceiling.points:
        rate = round_ratio(column(ours, "infer_per_s"), column(ceiling, "infer_per_s"), cost=False)
        cost = round_ratio(column(ours, "cpu_us"), column(ceiling, "cpu_us"), cost=True)
        lines.append(
            f"- edge-appliance / aiohttp ceiling: {_fmt(rate, '.2f')} by throughput, "
            f"{_fmt(cost, '.2f')} by CPU per request"
        )
    return lines


def write_simple(root: Path) -> Path:
    """The example repository's `simple`, alone (configs.generate's model and config)."""
    from configs.generate import SIMPLE_CONFIG, save, simple_model

    save(simple_model(), root / MODEL / "1" / "model.onnx")
    (root / MODEL / "config.pbtxt").write_text(SIMPLE_CONFIG)
    return root


def stop(target: Target) -> None:
    """Stop a server; an MLServer's leftover workers (its own process group) are ended too."""
    server = target.server
    group = server.proc.pid
    members = process_tree(group) if server.alive() else []
    stop_server(server)
    if target.name.startswith("MLServer"):
        for pid in members:
            try:
                if os.getpgid(pid) == group:
                    os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def machine() -> str:
    model = "?"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    return f'`nproc` {os.cpu_count()}, CPU "{model}"'


def commit(tree: Path) -> str:
    """The checkout's commit, with "+changes" when its tracked files differ from it."""
    git = ["git", "-C", str(tree)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run([*git, "diff", "--quiet", "HEAD"], capture_output=True).returncode
    return (head.stdout.strip() or "?") + (" +changes" if dirty else "")


def wrk_version(wrk: str) -> str:
    done = subprocess.run([wrk, "-v"], capture_output=True, text=True, check=False)
    return (done.stdout + done.stderr).split(" [", 1)[0].strip()


def start_all(
    python: Path, settings: Sequence[Setting], ceiling: bool, tree: Path, work: Path
) -> list[Target]:
    """Every server, started at once, then waited for and checked with one real request."""
    repository = write_simple(work / "models")
    targets = [
        Target(
            "edge-appliance",
            "serve defaults",
            start_edge(tree, repository, work / "edge.log"),
        )
    ]
    if ceiling:
        server = start_ceiling("aiohttp", repository, [MODEL], SERVER_CORE, work / "aiohttp.log")
        targets.append(Target("aiohttp ceiling", "bench.ceiling_http", server))
    for setting in settings:
        targets.append(Target("MLServer", setting.name, start_mlserver(python, setting, work)))
    for target in targets:
        try:
            if target.name == "edge-appliance":
                wait_ready(target.server)
            elif target.name == "aiohttp ceiling":
                wait_listening(target.server)
            else:
                wait_model_ready(target.server)
        except (RuntimeError, TimeoutError) as exc:
            target.problem = f"did not start: {exc}"
            continue
        target.problem = check_answer(target.server.http_url)
    return targets


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.mlserver",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--rounds", type=int, default=4, help="even: each server first as often as last"
    )
    parser.add_argument("--seconds", type=int, default=5, help="per measured point")
    parser.add_argument("--connections", type=int, default=8, help="wrk -c (concurrency)")
    parser.add_argument("--settings", default="w0,w1", help="MLServer settings (Setting.parse)")
    parser.add_argument("--venv", type=Path, default=default_venv())
    parser.add_argument("--no-ceiling", dest="ceiling", action="store_false")
    parser.add_argument("--tree", type=Path, default=ROOT, help="checkout whose server runs")
    parser.add_argument("--output", type=Path, help="also write the report here (Markdown)")
    parser.add_argument(
        "--quiet",
        type=float,
        default=60.0,
        help="before a point, wait until other processes "
        "use less than this %% of one core (a shared machine)",
    )
    parser.add_argument("--patience", type=float, default=10.0, help="wait at most this (s)")
    args = parser.parse_args(argv)
    settings = [Setting.parse(spec) for spec in args.settings.split(",") if spec.strip()]
    try:
        wrk = shutil.which("wrk")
        if wrk is None:
            raise Skip("wrk is not on PATH (Debian/Ubuntu: apt-get install -y wrk)")
        python = ensure_mlserver(args.venv)
    except Skip as exc:
        print(f"SKIP: {exc}")
        return 0
    began = datetime.datetime.now(datetime.timezone.utc)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="edge-mlserver-") as tmp:
        work = Path(tmp)
        script = work / "post.lua"
        script.write_text(lua_script(request_body()))
        targets: list[Target] = []
        try:
            targets = start_all(python, settings, args.ceiling, args.tree.resolve(), work)
            libraries = {
                t.setting: ", ".join(sorted(loaded_libraries(t.server.proc.pid))) or "neither"
                for t in targets
                if t.name == "MLServer" and t.problem is None
            }
            if targets[0].problem:
                print(f"edge-appliance: {targets[0].problem}\n{targets[0].server.log_tail()}")
                return 1
            for target in targets:  # first requests (imports, caches) and busy start-ups
                if target.problem is None:
                    warm = run_wrk(
                        wrk, script, target.server.http_url, FIRST_WARMUP_S, args.connections
                    )
                    problem = warm.problem(warm_up=True)
                    target.problem = problem and f"first warm-up: {problem}"
            live = [t for t in targets if t.problem is None]
            for index in range(args.rounds):
                for target in live if index % 2 == 0 else live[::-1]:
                    point = measure(wrk, script, target, args)
                    target.points.append(point)
                    print(
                        f"round {index} {target.name} {target.setting}: "
                        f"{point.infer_per_s:,.0f} infer/s, {point.cpu_us:,.0f} us/req, "
                        f"server {point.server_pct:.0f}%, other {point.other_pct:.0f}% "
                        f"{point.problem or ''}",
                        flush=True,
                    )
        finally:
            for target in targets:
                stop(target)
    for target in targets:  # a point with a problem counts as missing
        target.points = [p if p.problem is None else failed(p.problem) for p in target.points]
    mlservers = [t for t in targets if t.name == "MLServer"]
    ceiling = next((t for t in targets if t.name == "aiohttp ceiling"), None)
    others = [p.other_pct for t in targets for p in t.points if math.isfinite(p.other_pct)]
    points = [p for t in targets for p in t.points if math.isfinite(p.server_pct)]
    starved = sum(p.server_pct < STARVED_PCT for p in points)
    waits = [p.waited_s for t in targets for p in t.points if p.waited_s > 0.1]
    report = [
        f"MLServer comparison, {began:%Y-%m-%d %H:%M} UTC, server at {commit(args.tree)}, "
        f"{time.monotonic() - started:.0f} s",
        f"- machine: {machine()}; servers on core {SERVER_CORE}, `taskset -c {CLIENT_CORE} wrk "
        f"-t1 -c{args.connections} -d{args.seconds}s` ({wrk_version(wrk)}), "
        f"{args.rounds} rounds, medians",
        f"- MLServer venv {args.venv}: {versions(python)}",
        *(
            f"- MLServer {s.name}: {s.describe()}; mapped: {libraries.get(s.name, '-')}"
            for s in settings
        ),
        "",
        *table(targets),
        "",
        *ratio_lines(targets[0], mlservers, ceiling),
        f"- other CPU (not the measured server, wrk or this script): median "
        f"{_fmt(median(others), '.0f', '%')}, "
        f"max {_fmt(max(others, default=math.nan), '.0f', '%')} of one core over the points",
        f"- `*`: the server used less than {STARVED_PCT:.0f}% of its core ({starved} of "
        f"{len(points)} points): starved by other processes, or waiting on its own threads",
        f"- waited for other processes to drop below {args.quiet:.0f}% of a core before "
        f"{len(waits)} points ({sum(waits):.0f} s in all, at most {args.patience:.0f} s each)",
        *(
            f"- {t.name} {t.setting} round {i}: {p.problem}"
            for t in targets
            for i, p in enumerate(t.points)
            if p.problem
        ),
        *(f"- {t.name} {t.setting}: {t.problem}" for t in targets if t.problem),
    ]
    text = "\n".join(report)
    print("\n" + text)
    if args.output:
        args.output.write_text(text + "\n")
    if not any(median(column(t, "infer_per_s")) > 0 for t in mlservers):
        print("no MLServer setting was measured: see the reasons above")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
