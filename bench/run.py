"""Benchmark the server against raw ONNX Runtime on the same core.

    python -m bench.run [--models simple,squeezenet_onnx,densenet_onnx]
                        [--protocols http-json,http-binary,grpc[,grpc-stream]]
                        [--concurrency 1,8,32] [--ceilings aiohttp,grpc-aio,grpc-sync|none]
                        [--seconds N] [--repeat N] [--quick] [--output FILE.md]

1. Writes the example model repository (configs.generate) into a temporary folder.
2. Starts the server and the ceilings (bench.ceilings: minimal aiohttp, grpc.aio and synchronous
   grpc servers for the same models), all pinned to the server core (taskset), and waits for them.
3. Per model: raw ORT on its model file, batch 1, 1 thread, no spinning, pinned to the server
   core, in a subprocess (bench.raw), while the servers idle; then load from the client core:
   Triton's perf_analyzer for http-binary and grpc, the built-in bench.loadgen for http-json
   (perf_analyzer has no JSON mode), or bench.loadgen for everything when perf_analyzer cannot
   be set up (or with --load-generator builtin). Each point is measured on the server and then,
   right after, on each ceiling that speaks its protocol (interleaved, so the machine's other
   load hits both alike; every other round in the reverse order, the ceilings first, so that
   an order effect cancels out); --repeat N does all of step 3 N times and keeps each point's
   median, and as its ratios the medians of each round's ratios (each against that round's raw
   ORT and ceilings).
4. Prints the table, whose last columns are each point's ratio to raw ORT and to its ceiling
   (HTTP: aiohttp; gRPC: the better of grpc.aio and synchronous grpc), and the goals of issue 20
   (and writes it as Markdown with --output).

`--ceilings` may also name aiohttp-ort, grpc-aio-ort and grpc-sync-ort: the same ceilings
computing `simple` with ONNX Runtime on its model.onnx (as the server does) instead of numpy.
They are references for how much of the server's cost on `simple` is ONNX Runtime's own: measured
for `simple` only, right after the numpy ceilings, and printed as their own table with the
server's ratio to each, but never used for the `x ceiling` column or the targets.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from importlib import metadata
from pathlib import Path

from bench import cpu, perf
from bench.ceilings import (
    CEILINGS,
    KINDS,
    ORT_CEILINGS,
    ORT_MODELS,
    for_protocol,
    inference_count,
    is_ort,
    ort_for_protocol,
    start_ceiling,
    wait_listening,
)
from bench.common import ROOT, Stats, last_json_line
from bench.loadgen import PROTOCOLS
from bench.perf import PerfAnalyzer
from bench.report import (
    RAW,
    RAW_ORT,
    SERVER,
    Row,
    cpu_ratio,
    errors,
    markdown_table,
    paired_ratios,
    target_checks,
    text_table,
)
from bench.server import Server, start_server, stop_server, wait_ready

DEFAULT_MODELS = ("simple", "squeezenet_onnx", "densenet_onnx")
DEFAULT_CONCURRENCY = (1, 8, 32)
DEFAULT_SECONDS = 4.0
QUICK_CONCURRENCY = (8,)
QUICK_SECONDS = 2.0
# --quick measures the synchronous gRPC ceiling only: on one core it is the faster one (see
# docs/benchmarks/history.md, "Ceilings").
QUICK_CEILINGS = ("aiohttp", "grpc-sync")
CHILD_SLACK_S = 120.0
BUILTIN = "bench.loadgen"
OTHER_CPU_NOTE = (
    "other CPU: CPU time other processes on this machine used while the point ran, in % of one "
    "core (machine busy time minus this benchmark's own processes); high values mean the point "
    "was disturbed."
)
ORT_NOTE = (
    "The ceilings computing `simple` with ONNX Runtime (--ceilings *-ort: the same minimal "
    "servers running simple/1/model.onnx through ORT, as the server does, instead of numpy's "
    "add/sub). References for ORT's own share of the server's cost only: the x ceiling column "
    "and the targets use the numpy ceilings above."
)


@dataclass(frozen=True)
class Plan:
    models: tuple[str, ...]
    protocols: tuple[str, ...]
    concurrency: tuple[int, ...]
    seconds: float
    server_core: int
    client_core: int
    ceilings: tuple[str, ...] = ()
    repeat: int = 1


@dataclass(frozen=True)
class Context:
    plan: Plan
    server: Server
    pa: PerfAnalyzer | None
    workdir: Path
    ceilings: dict[str, Server]
    repo: Path

    def targets(self, protocol: str, model: str) -> list[tuple[str, Server]]:
        """The server, then the ceilings that speak the protocol, then the ORT references (for
        the models they compute differently): measured back to back."""
        kinds = for_protocol(protocol, self.plan.ceilings)
        if model in ORT_MODELS:
            kinds += ort_for_protocol(protocol, self.plan.ceilings)
        return [(SERVER, self.server), *((kind, self.ceilings[kind]) for kind in kinds)]

    def pids(self) -> list[int]:
        return [s.proc.pid for s in (self.server, *self.ceilings.values())]


def csv_list(text: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in text.split(",") if item.strip())


def int_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(item) for item in csv_list(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected integers, got '{text}'") from exc


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.run",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--models", type=csv_list, default=DEFAULT_MODELS)
    p.add_argument("--protocols", type=csv_list, default=PROTOCOLS)
    p.add_argument(
        "--concurrency", type=int_list, default=None, help="default 1,8,32 (8 with --quick)"
    )
    p.add_argument(
        "--seconds",
        type=float,
        default=None,
        help=f"measurement per point, default {DEFAULT_SECONDS:g} ({QUICK_SECONDS:g} with --quick)",
    )
    p.add_argument(
        "--ceilings",
        type=csv_list,
        default=None,
        help=f"minimal servers to measure beside it: {','.join(CEILINGS)} or none "
        f"(default all three; {','.join(QUICK_CEILINGS)} with --quick); also "
        f"{','.join(ORT_CEILINGS)}: the same computing `simple` with ONNX Runtime, shown as "
        "references but never used for x ceiling or the targets",
    )
    p.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="measure each point N times, the server first in even rounds and last in odd ones "
        "(so give an even N), and keep the median",
    )
    p.add_argument(
        "--quick", action="store_true", help="concurrency 8 only, short points, two ceilings"
    )
    p.add_argument("--output", type=Path, help="also write the results as Markdown here")
    p.add_argument("--server-core", type=int, default=0)
    p.add_argument("--client-core", type=int, default=1)
    p.add_argument(
        "--load-generator",
        choices=("auto", "builtin"),
        default="auto",
        help="auto: perf_analyzer for http-binary and grpc when it can be set up",
    )
    p.add_argument("--perf-analyzer", type=Path, default=perf.DEFAULT_TOOL)
    p.add_argument("--server-log", type=Path, help="keep the server's log here")
    return p


def make_plan(args: argparse.Namespace, parser: argparse.ArgumentParser) -> Plan:
    unknown = [p for p in args.protocols if p not in (*PROTOCOLS, *perf.PERF_ONLY)]
    if unknown:
        known = ", ".join((*PROTOCOLS, *perf.PERF_ONLY))
        parser.error(f"unknown protocol(s) {unknown}; choose from {known}")
    quick_c = QUICK_CONCURRENCY if args.quick else DEFAULT_CONCURRENCY
    quick_s = QUICK_SECONDS if args.quick else DEFAULT_SECONDS
    ceilings = args.ceilings
    if ceilings is None:
        ceilings = QUICK_CEILINGS if args.quick else CEILINGS
    elif ceilings == ("none",):
        ceilings = ()
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    unknown = [c for c in ceilings if c not in KINDS]
    if unknown:
        parser.error(f"unknown ceiling(s) {unknown}; choose from {', '.join(KINDS)} or none")
    if any(is_ort(c) for c in ceilings) and not set(ORT_MODELS) & set(args.models):
        only = ", ".join(ORT_MODELS)
        parser.error(f"the -ort ceilings differ from the others only on {only}: add it to --models")
    return Plan(
        models=tuple(args.models),
        protocols=tuple(args.protocols),
        concurrency=args.concurrency or quick_c,
        seconds=args.seconds or quick_s,
        server_core=args.server_core,
        client_core=args.client_core,
        ceilings=tuple(ceilings),
        repeat=args.repeat,
    )


def run_child(cmd: list[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    """The child's result; one that hangs is killed and becomes a failed point, not the end of
    the run."""
    try:
        return subprocess.run(
            cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(cmd, -9, "", f"no result within {timeout_s:.0f} s")


def child_error(proc: subprocess.CompletedProcess[str]) -> str:
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
    return f"exit {proc.returncode}: " + " | ".join(tail)


# ---- raw ONNX Runtime ------------------------------------------------------------------------


def with_other_cpu(measure: Callable[[], Row], server_pids: Sequence[int] = ()) -> Row:
    """Run one measurement and record other processes' CPU use meanwhile."""
    before = cpu.snapshot(*server_pids)
    row = measure()
    return replace(row, other_cpu_pct=cpu.other_cpu_pct(before, cpu.snapshot(*server_pids)))


def measure_raw(repo: Path, model: str, plan: Plan, label: str) -> Row:
    cmd = [
        sys.executable,
        "-m",
        "bench.raw",
        "--model",
        str(repo / model / "1" / "model.onnx"),
        "--seconds",
        str(plan.seconds),
        "--core",
        str(plan.server_core),
    ]
    proc = run_child(cmd, plan.seconds + CHILD_SLACK_S)
    if proc.returncode != 0:
        return Row(model, label, 1, None, RAW, child_error(proc), server=RAW)
    data = json.loads(last_json_line(proc.stdout))
    return Row(model, label, 1, Stats.from_dict(data), RAW, server=RAW, cpu_us=data["cpu_us"])


# ---- load against the server ----------------------------------------------------------------


def builtin_point(ctx: Context, target: Server, model: str, protocol: str, concurrency: int) -> Row:
    cmd = [
        "taskset",
        "-c",
        str(ctx.plan.client_core),
        sys.executable,
        "-m",
        "bench.loadgen",
        "--protocol",
        protocol,
        "--url",
        target.http_url,
        "--grpc-url",
        target.grpc_url,
        "--model",
        model,
        "--concurrency",
        str(concurrency),
        "--seconds",
        str(ctx.plan.seconds),
    ]
    proc = run_child(cmd, ctx.plan.seconds + CHILD_SLACK_S)
    if proc.returncode != 0:
        return Row(model, protocol, concurrency, None, BUILTIN, child_error(proc))
    data = json.loads(last_json_line(proc.stdout))
    client = f"{BUILTIN} (client CPU {data['client_cpu_pct']:.0f}%)"
    if data["errors"]:
        error = f"{data['errors']} failed requests; first: {data['first_error']}"
        return Row(model, protocol, concurrency, None, client, error)
    return Row(model, protocol, concurrency, Stats.from_dict(data), client)


def perf_point(
    ctx: Context,
    pa: PerfAnalyzer,
    target: tuple[str, Server],
    model: str,
    protocol: str,
    concurrency: int,
) -> Row:
    name, server = target
    url = server.grpc_url if protocol.startswith("grpc") else server.http_url
    csv_path = ctx.workdir / f"pa-{model}-{protocol}-{concurrency}-{name}.csv"
    cmd = [
        "taskset",
        "-c",
        str(ctx.plan.client_core),
        *perf.command(pa, model, url, protocol, concurrency, ctx.plan.seconds, csv_path),
    ]
    proc = run_child(cmd, ctx.plan.seconds + CHILD_SLACK_S)
    if proc.returncode != 0 or not csv_path.exists():
        return Row(model, protocol, concurrency, None, "perf_analyzer", child_error(proc))
    stats = perf.parse_result(csv_path.read_text(), proc.stdout)
    return Row(model, protocol, concurrency, stats, "perf_analyzer")


def measure_point(
    ctx: Context, target: tuple[str, Server], model: str, protocol: str, concurrency: int
) -> Row:
    if ctx.pa is not None and protocol in perf.PROTOCOL_FLAGS:
        return perf_point(ctx, ctx.pa, target, model, protocol, concurrency)
    if protocol in perf.PERF_ONLY:
        return Row(model, protocol, concurrency, None, "-", "needs perf_analyzer")
    return builtin_point(ctx, target[1], model, protocol, concurrency)


def measure_server(ctx: Context) -> list[Row]:
    """Per model and round: raw ORT, then every point on the server and, right after, on its
    ceilings, in the reverse order every other round: with an even --repeat each goes first as
    often as last (bench.cpu_per_request's server-first rounds gave the server 0.76-0.90 of the
    aiohttp ceiling, its server-last ones 0.64-0.66: docs/benchmarks/history.md); with --repeat,
    each point's median over the rounds."""
    rows: list[Row] = []
    for model in ctx.plan.models:
        rounds: list[list[Row]] = []
        for index in range(ctx.plan.repeat):
            one = [raw_row(ctx.repo, model, ctx.plan, ctx.pids())]
            for protocol in ctx.plan.protocols:
                for concurrency in ctx.plan.concurrency:
                    targets = ctx.targets(protocol, model)
                    for target in targets[::-1] if index % 2 else targets:
                        one.append(measure_target(ctx, target, model, protocol, concurrency))
            rounds.append(one)
        rows += medians(rounds) if ctx.plan.repeat > 1 else rounds[0]
    return rows


def medians(rounds: list[list[Row]]) -> list[Row]:
    """Per point and server, the round with the median throughput; failed rounds are named in
    its error. The server's ratios are the medians of each round's own (paired) ratios."""
    flat = [row for one in rounds for row in one]
    chosen = []
    for key in dict.fromkeys((r.protocol, r.concurrency, r.server) for r in flat):
        mine = [r for r in flat if (r.protocol, r.concurrency, r.server) == key]
        ok = sorted(
            (r for r in mine if r.stats), key=lambda r: r.stats.infer_per_s if r.stats else 0
        )
        failed = [r.error for r in mine if r.error]
        if not ok:
            chosen.append(mine[0])
            continue
        median = ok[len(ok) // 2]
        rates = "/".join(f"{r.stats.infer_per_s:,.0f}" for r in ok if r.stats)
        error = (
            f"{len(failed)} of {len(mine)} rounds failed; first: {failed[0]}" if failed else None
        )
        counted = [counted_rows(one) for one in rounds]  # never an ORT reference's ratio
        x_raw, x_ceiling = paired_ratios(counted, key) if median.is_server else (None, None)
        chosen.append(
            replace(
                median,
                client=f"{median.client}, median of {rates}",
                error=error,
                x_raw=x_raw,
                x_ceiling=x_ceiling,
            )
        )
    return chosen


def counted_rows(rows: Sequence[Row]) -> list[Row]:
    """The rows the ratios and targets are taken from: all but the ORT references'."""
    return [row for row in rows if not is_ort(row.server)]


def ort_reference_lines(rows: Sequence[Row]) -> list[str]:
    """The server's throughput (and CPU per inference) as a fraction of each ORT reference's,
    at the same point."""
    lines = []
    for ref in rows:
        if not is_ort(ref.server) or ref.stats is None or not ref.stats.infer_per_s:
            continue
        point = (ref.model, ref.protocol, ref.concurrency)
        server = next(
            (r for r in rows if r.is_server and (r.model, r.protocol, r.concurrency) == point),
            None,
        )
        if server is None or server.stats is None:
            continue
        by_cpu = cpu_ratio(ref, server)
        lines.append(
            f"{ref.model} {ref.protocol} c={ref.concurrency}: {SERVER} "
            f"{server.stats.infer_per_s / ref.stats.infer_per_s:.2f} of the {ref.server} "
            "reference" + ("" if by_cpu is None else f" (by CPU per inference {by_cpu:.2f})")
        )
    return lines


def measure_target(
    ctx: Context, target: tuple[str, Server], model: str, protocol: str, concurrency: int
) -> Row:
    name, server = target
    if not server.alive():
        dead = f"{name} exited with {server.proc.returncode}"
        return Row(model, protocol, concurrency, None, "-", dead, server=name)
    point = partial(measure_point, ctx, target, model, protocol, concurrency)
    count0, cpu0 = inference_count(name, server, model), cpu.process_cpu_s(server.proc.pid)
    row = replace(with_other_cpu(point, ctx.pids()), server=name)
    count1, cpu1 = inference_count(name, server, model), cpu.process_cpu_s(server.proc.pid)
    if count0 is not None and count1 is not None and count1 > count0:
        # All the process's CPU over all the inferences it ran for the point (warm-up too).
        row = replace(row, cpu_us=1e6 * (cpu1 - cpu0) / (count1 - count0))
    print(f"  {model} {protocol} {name} c={concurrency}: " + describe(row), flush=True)
    return row


def describe(row: Row) -> str:
    if row.stats is None:
        return f"ERROR {row.error}"
    s = row.stats
    return (
        f"{s.infer_per_s:,.1f} infer/s, p50 {s.p50_ms:.2f} ms, p99 {s.p99_ms:.2f} ms, "
        f"other processes {row.other_cpu_pct or 0:.0f}% of a core"
    )


# ---- the run --------------------------------------------------------------------------------


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    except OSError:
        return platform.processor() or "unknown"
    for line in out.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def header_lines(
    plan: Plan, pa: PerfAnalyzer | None, pa_why: str, argv: Sequence[str]
) -> list[str]:
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    if pa is None:
        load = f"{BUILTIN} for all protocols (perf_analyzer not used: {pa_why})"
    else:
        load = f"perf_analyzer ({pa.version}) for http-binary and grpc, {BUILTIN} for http-json"
    ceilings = ", ".join(plan.ceilings) or "none"
    repeat = f", {plan.repeat} times alternating (the median kept)" if plan.repeat > 1 else ""
    return [
        f"command: python -m bench.run {shlex.join(argv)}".rstrip(),
        f"date: {now}; machine: {os.cpu_count()} CPUs, {cpu_model()}; "
        f"Python {platform.python_version()}, onnxruntime {metadata.version('onnxruntime')}",
        f"server on core {plan.server_core}, load from core {plan.client_core}; "
        f"{plan.seconds:g} s per point{repeat}; load generator: {load}",
        f"ceilings (bench.ceilings, on the server core, each point right after the server's): "
        f"{ceilings}",
    ]


def server_log_findings(server: Server, name: str = "server") -> list[str]:
    lines = server.log_path.read_text(errors="replace").splitlines()
    bad = [
        line for line in lines if " WARNING " in line or " ERROR " in line or "Traceback" in line
    ]
    if not bad:
        return []
    return [f"{name} log: {len(bad)} warning/error lines, e.g. {bad[0][:300]}"]


def raw_row(repo: Path, model: str, plan: Plan, server_pids: Sequence[int] = ()) -> Row:
    row = with_other_cpu(lambda: measure_raw(repo, model, plan, RAW_ORT), server_pids)
    print(f"  {model} {RAW_ORT}: " + describe(row), flush=True)
    return row


def run_all(plan: Plan, pa: PerfAnalyzer | None, workdir: Path, log_path: Path) -> list[Row]:
    from configs.generate import write_repository

    repo = write_repository(workdir / "models")
    server = start_server(repo, plan.server_core, log_path)
    ceilings: dict[str, Server] = {}
    try:
        for kind in plan.ceilings:
            log = workdir / f"ceiling-{kind}.log"
            models = [m for m in plan.models if m in ORT_MODELS] if is_ort(kind) else plan.models
            ceilings[kind] = start_ceiling(kind, repo, models, plan.server_core, log)
        print(f"server ready in {wait_ready(server):.1f}s", flush=True)
        for kind, ceiling in ceilings.items():
            print(f"ceiling {kind} listening in {wait_listening(ceiling):.1f}s", flush=True)
        print("measuring ...", flush=True)
        rows = measure_server(Context(plan, server, pa, workdir, ceilings, repo))
    finally:
        stopped = {kind: stop_server(ceiling) for kind, ceiling in ceilings.items()}
        code = stop_server(server)
    findings = server_log_findings(server)
    if code not in (0, -15):
        findings.append(f"server exit code {code}; log tail:\n{server.log_tail()}")
    for kind, ceiling in ceilings.items():
        findings += server_log_findings(ceiling, f"ceiling {kind}")
        if stopped[kind] not in (0, -15):
            findings.append(f"ceiling {kind} exit code {stopped[kind]}: {ceiling.log_tail(5)}")
    for line in findings:
        print(line)
    return order(plan, rows)


def order(plan: Plan, rows: list[Row]) -> list[Row]:
    kinds = (RAW_ORT, *plan.protocols)
    servers = (RAW, SERVER, *KINDS)
    return sorted(
        rows,
        key=lambda r: (
            plan.models.index(r.model),
            kinds.index(r.protocol),
            r.concurrency,
            servers.index(r.server) if r.server in servers else len(servers),
        ),
    )


def render(header: list[str], rows: list[Row], markdown: bool) -> str:
    """The table and the targets, from every row but the ORT references'; those follow as a
    table of their own, with the server's ratio to each."""
    counted = counted_rows(rows)
    references = [row for row in rows if is_ort(row.server)]
    table = markdown_table if markdown else text_table
    bullets = "- " if markdown else ""
    parts = [*(bullets + h for h in header), "", table(counted), "", OTHER_CPU_NOTE, ""]
    if references:
        parts += [ORT_NOTE, "", table(references), ""]
        parts += [bullets + line for line in ort_reference_lines(rows)] + [""]
    checks = target_checks(counted)
    if checks:
        parts += ["Targets:" if not markdown else "**Targets**", ""]
        parts += [bullets + c for c in checks] + [""]
    errs = errors(rows)
    if errs:
        parts += ["Errors:" if not markdown else "**Errors**", ""]
        parts += [bullets + e for e in errs] + [""]
    return "\n".join(parts)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    plan = make_plan(args, parser)
    pa, why = (
        (None, "--load-generator builtin")
        if args.load_generator == "builtin"
        else (perf.find_perf_analyzer(args.perf_analyzer))
    )
    header = header_lines(plan, pa, why, argv)
    print("\n".join(header), flush=True)
    start = cpu.snapshot()
    with tempfile.TemporaryDirectory(prefix="edge-bench-") as tmp:
        log_path = args.server_log or Path(tmp) / "server.log"
        try:
            rows = run_all(plan, pa, Path(tmp), log_path)
        except (RuntimeError, TimeoutError) as exc:
            print(f"server failed to start: {exc}", file=sys.stderr)
            return 2
    end = cpu.snapshot()
    header.append(
        f"whole run: {end.wall_s - start.wall_s:.0f} s; other processes used "
        f"{cpu.other_cpu_pct(start, end):.0f}% of one core on average"
    )
    print()
    print(render(header, rows, markdown=False))
    if args.output:
        args.output.write_text(render(header, rows, markdown=True))
        print(f"written to {args.output}")
    return 1 if errors(rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
