"""`edge-appliance tune`: find a model's best configuration on the device that will serve it.

Each candidate configuration is loaded through the server's own code path (repository
loader, scheduler, instances, backend) in this process, and driven by closed-loop clients at
each requested concurrency. There is no network between them, so only the serving path is
measured, and that is what the configurations change.

The search is Model Analyzer's quick search, greedy and one dimension at a time, in this
order:
1. instance count;
2. the preferred batch size, with dynamic batching (batching models only);
3. max_queue_delay_microseconds;
4. ONNX Runtime intra-op threads.

`max_batch_size` is never changed: it is what clients may send, so a lower one would have an
applied config refuse their larger batches (Triton's Model Analyzer sweeps it; here the
dynamic batcher's preferred size says which batches to form instead).

Each dimension grows from the best configuration so far and stops when throughput stops
improving by at least 5 %. A configuration's score is its best throughput at any concurrency
whose p99 meets the latency budget. The run stops taking new configurations when the time
budget runs out, and always reports the best one found.

The served repository is never touched unless `--apply` is given. The command also refuses
to tune a model a local server is serving traffic on, unless `--force` is given.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import html
import json
import logging
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from google.protobuf import text_format

from appliance.common.errors import ApplianceError
from appliance.common.model_config import ModelConfig, datatype_of
from appliance.common.settings import ServerSettings
from appliance.common.types import InferRequest, Tensor
from appliance.flags.parsing import Parser
from appliance.repository.local import list_models
from appliance.runtime.models import ModelRuntime
from appliance.runtime.settings import RuntimeSettings
from appliance.services.inference import InferenceService
from edge_backends.datatypes import BY_TRITON

log = logging.getLogger(__name__)

GAIN = 1.05  # a step must add 5 % throughput to count as an improvement
# Requests behind a point's p99 below which the table warns: with fewer than 100 the p99 is
# one of the slowest few requests, not a percentile (at 1 s a point, a slow model gave 9).
MIN_P99_REQUESTS = 100


class TuneError(Exception):
    """A bad argument or a model that cannot be tuned; the message says which."""


@dataclass(frozen=True)
class Candidate:
    instances: int
    max_batch: int  # the config's max_batch_size, never changed; 0: the model does not batch
    queue_delay_us: int
    threads: int  # ORT intra-op threads per instance; 0: the server's default
    preferred_batch: int = -1  # -1: the config's preferred sizes; 0: none; N: [N]

    def label(self) -> str:
        parts = [f"instances={self.instances}"]
        if self.max_batch:
            preferred = {-1: "config", 0: "none"}.get(self.preferred_batch)
            parts += [
                f"max_batch={self.max_batch}",
                f"preferred={preferred or self.preferred_batch}",
                f"delay_us={self.queue_delay_us}",
            ]
        parts.append(f"threads={self.threads or 'auto'}")
        return " ".join(parts)


@dataclass
class Point:
    concurrency: int
    throughput: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    requests: int = 0  # measured requests behind the percentiles


@dataclass
class Result:
    candidate: Candidate
    points: list[Point] = field(default_factory=list)
    rss_mib: float = 0.0
    error: str = ""

    def best(self, budget_ms: float | None) -> Point | None:
        fits = [p for p in self.points if budget_ms is None or p.p99_ms <= budget_ms]
        return max(fits, key=lambda p: p.throughput, default=None)

    def score(self, budget_ms: float | None) -> float:
        point = self.best(budget_ms)
        return point.throughput if point else 0.0


def apply_candidate(base: ModelConfig, c: Candidate) -> ModelConfig:
    config = ModelConfig()
    config.CopyFrom(base)
    del config.instance_group[:]
    group = config.instance_group.add()
    group.count = c.instances
    group.kind = group.KIND_CPU
    if c.max_batch:
        config.max_batch_size = c.max_batch
        config.dynamic_batching.max_queue_delay_microseconds = c.queue_delay_us
        if c.preferred_batch >= 0:
            del config.dynamic_batching.preferred_batch_size[:]
        if c.preferred_batch > 0:
            config.dynamic_batching.preferred_batch_size.append(c.preferred_batch)
    if c.threads:
        config.parameters["intra_op_thread_count"].string_value = str(c.threads)
    elif "intra_op_thread_count" in config.parameters:
        del config.parameters["intra_op_thread_count"]
    return config


def make_request(config: ModelConfig, shapes: dict[str, list[int]]) -> InferRequest:
    """One request of batch 1 with random data, from the model's inputs."""
    rng = np.random.default_rng(0)
    inputs = []
    for tensor in config.input:
        dims = shapes.get(tensor.name) or [1 if d < 0 else int(d) for d in tensor.dims]
        shape = tuple(([1] if config.max_batch_size > 0 else []) + list(dims))
        triton = datatype_of(tensor.data_type)
        dtype = BY_TRITON[triton]
        if triton == "BYTES":
            data = np.full(shape, b"tune", dtype=np.object_)
        elif np.issubdtype(dtype.numpy, np.floating):
            data = rng.random(shape).astype(dtype.numpy)
        elif triton == "BOOL":
            data = rng.integers(0, 2, shape).astype(bool)
        else:
            data = rng.integers(0, 8, shape).astype(dtype.numpy)
        inputs.append(Tensor(tensor.name, triton, shape, data))
    return InferRequest(model_name=config.name, inputs=inputs)


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def drive(
    inference: InferenceService, request: InferRequest, concurrency: int, seconds: float
) -> Point:
    """Closed-loop clients for `seconds` after a short warm-up; throughput and percentiles."""
    latencies: list[float] = []
    warmup_end = time.monotonic() + min(0.3, seconds / 3)
    end = warmup_end + seconds

    async def client() -> None:
        while True:
            started = time.monotonic()
            if started >= end:
                return
            await inference.infer(request)
            if started >= warmup_end:
                latencies.append(time.monotonic() - started)

    await asyncio.gather(*(client() for _ in range(concurrency)))
    if not latencies:
        raise TuneError("no request completed in the measurement window")
    latencies.sort()

    def pct(q: float) -> float:
        return latencies[min(len(latencies) - 1, math.ceil(q * len(latencies)) - 1)] * 1e3

    return Point(
        concurrency,
        len(latencies) / seconds,
        statistics.median(latencies) * 1e3,
        pct(0.95),
        pct(0.99),
        len(latencies),
    )


def runtime_settings(repository: Path) -> RuntimeSettings:
    """The runtime `serve` runs with its default flags, so a point measures what serving
    would give."""
    return RuntimeSettings.from_server(ServerSettings(model_repositories=(repository,)))


class Tuner:
    def __init__(
        self,
        repository: Path,
        model: str,
        concurrency: Sequence[int],
        budget_ms: float | None,
        time_budget_s: float,
        seconds_per_point: float,
        shapes: dict[str, list[int]],
        progress: Callable[[str], None],
    ) -> None:
        self.repository = repository
        self.model = model
        self.concurrency = list(concurrency)
        self.budget_ms = budget_ms
        self.deadline = time.monotonic() + time_budget_s
        self.seconds = seconds_per_point
        self.shapes = shapes
        self.progress = progress
        self.results: dict[Candidate, Result] = {}

    async def run(self) -> tuple[ModelConfig, list[Result]]:
        settings = runtime_settings(self.repository)
        runtime = ModelRuntime(settings)
        inference = InferenceService(runtime)
        try:
            try:
                await runtime.load(self.model)
            except ApplianceError as exc:
                raise TuneError(f"model '{self.model}' does not load: {exc.message}") from None
            record = runtime.record(self.model)
            if record.config is None or not record.versions:
                raise TuneError(f"model '{self.model}' does not load: {record.reason}")
            base = ModelConfig()
            base.CopyFrom(record.config)
            await self._search(runtime, inference, base)
            return base, list(self.results.values())
        finally:
            await runtime.stop(settings.drain_timeout_s)

    def _left(self) -> float:
        return self.deadline - time.monotonic()

    async def _measure(
        self, runtime: ModelRuntime, inference: InferenceService, base: ModelConfig, c: Candidate
    ) -> Result:
        if c in self.results:
            return self.results[c]
        result = Result(c)
        self.results[c] = result
        config = apply_candidate(base, c)
        request = make_request(config, self.shapes)
        before = _rss_mib()
        try:
            await runtime.load(self.model, override=config)
            result.rss_mib = max(0.0, _rss_mib() - before)
            for n in self.concurrency:
                self.progress(f"{c.label()} at concurrency {n} ({self._left():.0f} s left)")
                result.points.append(await drive(inference, request, n, self.seconds))
        except (ApplianceError, TuneError) as exc:
            result.error = getattr(exc, "message", str(exc))
        return result

    async def _search(
        self, runtime: ModelRuntime, inference: InferenceService, base: ModelConfig
    ) -> None:
        batching = base.max_batch_size > 0
        start = Candidate(
            instances=1,
            max_batch=int(base.max_batch_size) if batching else 0,
            queue_delay_us=int(base.dynamic_batching.max_queue_delay_microseconds),
            threads=0,
        )
        best = await self._measure(runtime, inference, base, start)
        ncpu = len(os.sched_getaffinity(0))
        steps: list[tuple[str, list[Any]]] = [("instances", [1, 2, 3, 4, 6, 8][: max(2, ncpu + 1)])]
        if batching:
            # Never max_batch_size itself (the module's docstring says why).
            sizes = [n for n in (1, 2, 4, 8, 16, 32) if n <= base.max_batch_size]
            steps.append(("preferred_batch", sizes))
            steps.append(("queue_delay_us", [0, 100, 500, 1000, 2000, 5000]))
        steps.append(("threads", [t for t in (1, 2, 4, 8) if t <= ncpu]))
        for dimension, values in steps:
            for value in values:
                if self._left() <= 0:
                    return
                trial = Candidate(**{**best.candidate.__dict__, dimension: value})
                if trial == best.candidate:
                    continue
                result = await self._measure(runtime, inference, base, trial)
                if result.score(self.budget_ms) >= best.score(self.budget_ms) * GAIN:
                    best = result
                elif dimension != "preferred_batch" and value > getattr(best.candidate, dimension):
                    break  # growing this dimension stopped paying: on to the next


def best_result(results: Sequence[Result], budget_ms: float | None) -> Result | None:
    scored = [r for r in results if not r.error and r.best(budget_ms) is not None]
    return max(scored, key=lambda r: r.score(budget_ms), default=None)


def table(results: Sequence[Result], best: Result | None, budget_ms: float | None) -> str:
    rows = [
        [
            "",
            "configuration",
            "concurrency",
            "infer/s",
            "p50 ms",
            "p95 ms",
            "p99 ms",
            "requests",
            "RSS +MiB",
        ]
    ]
    for r in results:
        mark = "*" if r is best else ""
        if r.error:
            rows.append([mark, r.candidate.label(), "-", "failed", "", "", "", "", r.error[:60]])
            continue
        chosen = r.best(budget_ms)
        for p in r.points:
            over = budget_ms is not None and p.p99_ms > budget_ms
            rows.append(
                [
                    mark if p is chosen else "",
                    r.candidate.label(),
                    str(p.concurrency),
                    f"{p.throughput:,.1f}",
                    f"{p.p50_ms:.2f}",
                    f"{p.p95_ms:.2f}",
                    f"{p.p99_ms:.2f}" + (" (over)" if over else ""),
                    str(p.requests) + (" (few)" if p.requests < MIN_P99_REQUESTS else ""),
                    f"{r.rss_mib:.0f}",
                ]
            )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows
    )


def write_csv(path: Path, results: Sequence[Result]) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(
            [
                "instances",
                "max_batch",
                "queue_delay_us",
                "threads",
                "preferred_batch",
                "concurrency",
                "throughput",
                "p50_ms",
                "p95_ms",
                "p99_ms",
                "requests",
                "rss_mib",
                "error",
            ]
        )
        for r in results:
            c = r.candidate
            for p in r.points or [None]:  # type: ignore[list-item]
                writer.writerow(
                    [
                        c.instances,
                        c.max_batch,
                        c.queue_delay_us,
                        c.threads,
                        c.preferred_batch,
                        p.concurrency if p else "",
                        f"{p.throughput:.2f}" if p else "",
                        f"{p.p50_ms:.3f}" if p else "",
                        f"{p.p95_ms:.3f}" if p else "",
                        f"{p.p99_ms:.3f}" if p else "",
                        p.requests if p else "",
                        f"{r.rss_mib:.1f}",
                        r.error,
                    ]
                )


def write_chart(
    path: Path, results: Sequence[Result], best: Result | None, budget_ms: float | None, model: str
) -> None:
    """A small self-contained HTML page: throughput vs p99, one dot per measured point."""
    points = [(r, p) for r in results for p in r.points]
    if not points:
        path.write_text("<p>no measurements</p>")
        return
    max_x = max(p.p99_ms for _, p in points) * 1.1 or 1.0
    max_y = max(p.throughput for _, p in points) * 1.1 or 1.0
    w, h, m = 640, 400, 50
    dots = []
    for r, p in points:
        x = m + p.p99_ms / max_x * (w - 2 * m)
        y = h - m - p.throughput / max_y * (h - 2 * m)
        color = "#d62728" if r is best else "#1f77b4"
        title = html.escape(
            f"{r.candidate.label()} c={p.concurrency}: {p.throughput:.1f}/s, p99 {p.p99_ms:.2f} ms"
        )
        dots.append(
            f'<circle cx="{x:.1f}" cy="{y:.1f}" r="5" fill="{color}">'
            f"<title>{title}</title></circle>"
        )
    budget = ""
    if budget_ms is not None and budget_ms < max_x:
        bx = m + budget_ms / max_x * (w - 2 * m)
        budget = (
            f'<line x1="{bx:.1f}" y1="{m}" x2="{bx:.1f}" y2="{h - m}" stroke="#999" '
            'stroke-dasharray="4"/>'
        )
    path.write_text(
        f"<!doctype html><meta charset=utf-8><title>tune {html.escape(model)}</title>"
        f"<h3>{html.escape(model)}: throughput vs p99 (red: chosen)</h3>"
        f'<svg width="{w}" height="{h}" style="font:12px sans-serif">'
        f'<line x1="{m}" y1="{h - m}" x2="{w - m}" y2="{h - m}" stroke="black"/>'
        f'<line x1="{m}" y1="{m}" x2="{m}" y2="{h - m}" stroke="black"/>'
        f'<text x="{w / 2}" y="{h - 15}">p99 latency (ms), 0 to {max_x:.1f}</text>'
        f'<text x="5" y="{m - 10}">infer/s, 0 to {max_y:.0f}</text>{budget}{"".join(dots)}'
        "</svg>"
    )


def serving_traffic(server_url: str, model: str) -> bool:
    """Whether a local server answered requests for `model` in the last minute."""
    url = f"http://{server_url}/v2/models/{model}/stats"
    try:
        with urllib.request.urlopen(url, timeout=1) as resp:
            stats = json.load(resp)
    except (OSError, ValueError):
        return False
    now_ms = time.time() * 1000
    return any(
        now_ms - int(s.get("last_inference", 0)) < 60_000
        for s in stats.get("model_stats", [])
        if int(s.get("last_inference", 0)) > 0
    )


def parser(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.description = (
        "Find a model's best configuration by measuring it on this device: instance count, "
        "max_batch_size with dynamic batching, max_queue_delay_microseconds, ONNX Runtime "
        "threads, one at a time, through the server's own code path. The repository is only "
        "changed with --apply."
    )
    p.add_argument(
        "--model-repository",
        required=True,
        type=Path,
        metavar="DIR",
        help="the local model repository holding the model (required)",
    )
    p.add_argument("--model", required=True, metavar="NAME", help="the model to tune (required)")
    p.add_argument(
        "--latency-budget-ms",
        type=float,
        default=None,
        metavar="P99",
        help="a configuration counts only at concurrencies whose p99 latency is within this "
        "(default: no budget, the highest throughput wins)",
    )
    p.add_argument(
        "--concurrency",
        default="1,4,16",
        metavar="N,N,...",
        help="the numbers of closed-loop clients each configuration is measured at",
    )
    p.add_argument(
        "--time-budget-s",
        type=float,
        default=120.0,
        metavar="SECONDS",
        help="no new configuration is tried past this; the best one found is reported",
    )
    p.add_argument(
        "--seconds-per-point",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="how long each configuration runs at each concurrency",
    )
    p.add_argument(
        "--shape",
        action="append",
        default=[],
        metavar="INPUT:D1xD2...",
        help="concrete dims (batch excluded) for an input with variable dims",
    )
    p.add_argument(
        "--output",
        type=Path,
        metavar="DIR",
        help="write the best config.pbtxt (and the CSV and chart) here; default: print it",
    )
    p.add_argument("--csv", type=Path, metavar="FILE", help="write every measurement here as CSV")
    p.add_argument(
        "--chart",
        type=Path,
        metavar="FILE.html",
        help="write a chart of throughput against p99 latency here (one HTML file)",
    )
    p.add_argument(
        "--apply",
        action="store_true",
        help="write the best config.pbtxt into the repository (the old one is "
        "kept as config.pbtxt.bak)",
    )
    p.add_argument(
        "--force", action="store_true", help="tune even if a local server is serving this model"
    )
    p.add_argument(
        "--server-url",
        default="127.0.0.1:8000",
        help="the local server checked for live traffic (default %(default)s)",
    )
    p.add_argument(
        "--quiet", action="store_true", help="no progress line on stderr (only the result)"
    )
    return p


def _parse_shapes(values: Sequence[str]) -> dict[str, list[int]]:
    shapes = {}
    for value in values:
        name, _, dims = value.partition(":")
        try:
            shapes[name] = [int(d) for d in dims.split("x") if d]
        except ValueError:
            shapes[name] = []
        if not name or not shapes[name]:
            raise TuneError(f"--shape {value!r}: expected INPUT:D1xD2..., e.g. data_0:3x224x224")
    return shapes


def _check_args(args: argparse.Namespace) -> list[int]:
    try:
        concurrency = [int(c) for c in args.concurrency.split(",") if c.strip()]
    except ValueError:
        raise TuneError(
            f"--concurrency {args.concurrency!r}: expected integers like 1,4,16"
        ) from None
    if not concurrency or min(concurrency) < 1:
        raise TuneError("--concurrency needs at least one level, each >= 1")
    if args.latency_budget_ms is not None and args.latency_budget_ms <= 0:
        raise TuneError("--latency-budget-ms must be > 0")
    if args.time_budget_s <= 0 or args.seconds_per_point <= 0:
        raise TuneError("--time-budget-s and --seconds-per-point must be > 0")
    try:
        models = list_models([args.model_repository])
    except ApplianceError as exc:
        raise TuneError(exc.message) from None
    if args.model not in models:
        raise TuneError(
            f"no model '{args.model}' in {args.model_repository} "
            f"(found: {', '.join(sorted(models)) or 'none'})"
        )
    if not args.force and serving_traffic(args.server_url, args.model):
        raise TuneError(
            f"a server at {args.server_url} is serving '{args.model}' (requests in the last "
            "minute); tuning beside it would skew both. Stop it, or pass --force"
        )
    return concurrency


def main(argv: Sequence[str]) -> int:
    args = parser(Parser(prog="edge-appliance tune")).parse_args(list(argv))
    logging.basicConfig(level=logging.ERROR, format="%(message)s", stream=sys.stderr)
    os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
    try:
        concurrency = _check_args(args)
        shapes = _parse_shapes(args.shape)
    except TuneError as exc:
        print(f"edge-appliance tune: {exc}", file=sys.stderr)  # noqa: T201
        return 2
    live = not args.quiet and sys.stderr.isatty()
    started = time.monotonic()

    def progress(text: str) -> None:
        if live:
            elapsed = time.monotonic() - started
            sys.stderr.write(f"\r\x1b[K[{elapsed:5.0f} s] {text}")
            sys.stderr.flush()

    # Work on a copy: the served repository is only written with --apply.
    with tempfile.TemporaryDirectory(prefix="edge-tune-") as tmp:
        work = Path(tmp) / "models"
        shutil.copytree(args.model_repository / args.model, work / args.model, symlinks=True)
        tuner = Tuner(
            work,
            args.model,
            concurrency,
            args.latency_budget_ms,
            args.time_budget_s,
            args.seconds_per_point,
            shapes,
            progress,
        )
        try:
            base, results = asyncio.run(tuner.run())
        except TuneError as exc:
            print(f"\nedge-appliance tune: {exc}", file=sys.stderr)  # noqa: T201
            return 1
    if live:
        sys.stderr.write("\r\x1b[K")
    best = best_result(results, args.latency_budget_ms)
    out = sys.stdout
    out.write(table(results, best, args.latency_budget_ms) + "\n")
    warning = few_requests_warning(results, args.seconds_per_point)
    if warning:
        out.write(f"\n{warning}\n")
    if best is None:
        if args.latency_budget_ms is None:
            out.write("\nno configuration could be measured (the table says why)\n")
        else:
            out.write(f"\nno configuration met the p99 budget of {args.latency_budget_ms} ms\n")
        return 1
    point = best.best(args.latency_budget_ms)
    assert point is not None
    out.write(
        f"\nbest: {best.candidate.label()}: {point.throughput:,.1f} infer/s at "
        f"concurrency {point.concurrency}, p99 {point.p99_ms:.2f} ms\n"
    )
    text = text_format.MessageToString(apply_candidate(base, best.candidate))
    if args.output:
        args.output.mkdir(parents=True, exist_ok=True)
        (args.output / "config.pbtxt").write_text(text)
        write_csv(args.output / "tune.csv", results)
        write_chart(args.output / "tune.html", results, best, args.latency_budget_ms, args.model)
        out.write(f"wrote {args.output / 'config.pbtxt'}, tune.csv and tune.html\n")
    else:
        out.write(f"\n# config.pbtxt for '{args.model}'\n{text}")
    if args.csv:
        write_csv(args.csv, results)
    if args.chart:
        write_chart(args.chart, results, best, args.latency_budget_ms, args.model)
    if args.apply:
        target = args.model_repository / args.model / "config.pbtxt"
        kept = apply_config(target, text)
        if kept is None:
            out.write(f"applied: {target} (there was no config.pbtxt before: nothing to keep)\n")
        else:
            out.write(f"applied: {target} (previous kept as {kept})\n")
    return 0


def apply_config(target: Path, text: str) -> Path | None:
    """Write `text` to `target`, keeping the file it replaces under the first free name of
    config.pbtxt.bak, .bak.1, ... (never over an older backup); the backup's path, or None
    when there was nothing to keep."""
    kept = None
    if target.exists():
        kept = target.with_name(f"{target.name}.bak")
        number = 0
        while kept.exists():
            number += 1
            kept = target.with_name(f"{target.name}.bak.{number}")
        shutil.copy2(target, kept)
    partial = target.with_name(f".{target.name}.tune")
    partial.write_text(text)
    if kept is not None:
        shutil.copymode(kept, partial)
    os.replace(partial, target)  # a reader sees the old config or the new one, never half
    return kept


def few_requests_warning(results: Sequence[Result], seconds_per_point: float) -> str:
    """A warning when points' p99 rests on fewer than MIN_P99_REQUESTS requests, with the
    --seconds-per-point that would give the slowest of them enough."""
    few = [p for r in results for p in r.points if p.requests < MIN_P99_REQUESTS]
    if not few:
        return ""
    slowest = min(p.throughput for p in few)
    needed_s = math.ceil(MIN_P99_REQUESTS / slowest * 10) / 10 if slowest > 0 else 0.0
    fewest = min(p.requests for p in few)
    points = sum(len(r.points) for r in results)
    return (
        f"warning: {len(few)} of {points} points measured fewer than {MIN_P99_REQUESTS} "
        f"requests (fewest: {fewest}), so their p99 is one of the slowest few requests, not a "
        f"percentile (marked 'few'); for {MIN_P99_REQUESTS} at the slowest point's rate, run "
        f"with --seconds-per-point {max(needed_s, seconds_per_point):g} (now {seconds_per_point:g})"
    )
