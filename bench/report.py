"""Result rows, the results table (plain text and Markdown) and the target checks."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from bench.common import Stats

HEADERS = (
    "model",
    "protocol",
    "server",
    "concurrency",
    "infer/s",
    "p50 ms",
    "p99 ms",
    "CPU us",
    "other CPU",
    "client",
    "raw ORT",
    "x raw",
    "ceiling",
    "x ceiling",
)
NUMERIC = {3, 4, 5, 6, 7, 8, 10, 11, 13}
SERVER = "edge-appliance"
RAW = "onnxruntime"
RAW_ORT = "raw ORT"  # the protocol column of raw ONNX Runtime's rows
IMAGE_MODELS = ("squeezenet_onnx", "densenet_onnx")
# Issue 20's goals: the server's throughput over raw ONNX Runtime (in-process, same core) ...
OF_RAW_TARGETS = {
    ("squeezenet_onnx", "grpc"): 0.88,
    ("squeezenet_onnx", "http-binary"): 0.88,
    ("densenet_onnx", "grpc"): 0.90,
}
# ... and over the minimal server of the same protocol (bench.ceilings), measured in the same run.
OF_CEILING_TARGETS = {("simple", "http-binary"): 0.75, ("simple", "grpc"): 0.70}
SIMPLE_TARGETS = {"http-binary": 6000.0, "http-json": 6000.0, "grpc": 3000.0}
TARGET_CONCURRENCY = 8


@dataclass(frozen=True)
class Row:
    model: str
    protocol: str
    concurrency: int
    stats: Stats | None
    client: str
    error: str | None = None
    other_cpu_pct: float | None = None  # other people's processes, % of one core
    server: str = SERVER  # edge-appliance, a ceiling (bench.ceilings.CEILINGS) or onnxruntime
    # With --repeat: the medians of the rounds' own ratios (None: from the rows of the table).
    x_raw: float | None = None
    x_ceiling: float | None = None
    # CPU the server (ceiling, raw ORT) process used per inference, in microseconds.
    cpu_us: float | None = None

    @property
    def is_raw(self) -> bool:
        return self.protocol == RAW_ORT

    @property
    def is_server(self) -> bool:
        return self.server == SERVER


def raw_ceiling(rows: Sequence[Row], model: str) -> float | None:
    """Raw ORT's throughput on the model's file, measured in the same run (the best, if the
    rows hold several)."""
    values = [r.stats.infer_per_s for r in rows if r.is_raw and r.model == model and r.stats]
    return max(values) if values else None


def pct_of_raw(rows: Sequence[Row], row: Row) -> float | None:
    if row.x_raw is not None:
        return 100.0 * row.x_raw
    ceiling = raw_ceiling(rows, row.model)
    if row.stats is None or not ceiling:
        return None
    return 100.0 * row.stats.infer_per_s / ceiling


def best_ceiling(rows: Sequence[Row], row: Row) -> Row | None:
    """The fastest ceiling measured at the same model, protocol and concurrency as a server row:
    aiohttp for HTTP; the better of grpc.aio and synchronous grpc for gRPC."""
    if not row.is_server:
        return None
    same = [
        r
        for r in rows
        if not r.is_server
        and not r.is_raw
        and r.stats is not None
        and (r.model, r.protocol, r.concurrency) == (row.model, row.protocol, row.concurrency)
    ]
    return max(same, key=lambda r: r.stats.infer_per_s if r.stats else 0.0, default=None)


def of_ceiling(rows: Sequence[Row], row: Row) -> float | None:
    """The row's throughput as a fraction of its best ceiling's."""
    if row.x_ceiling is not None:
        return row.x_ceiling
    ceiling = best_ceiling(rows, row)
    if row.stats is None or ceiling is None or ceiling.stats is None:
        return None
    if not ceiling.stats.infer_per_s:
        return None
    return row.stats.infer_per_s / ceiling.stats.infer_per_s


def paired_ratios(
    rounds: Sequence[Sequence[Row]], point: tuple[str, int, str]
) -> tuple[float | None, float | None]:
    """x raw and x ceiling of a point (protocol, concurrency, server) over repeated rounds: the
    median of each round's ratio to that round's own raw ORT and ceilings, measured next to it,
    so load that comes and goes between rounds cancels out."""
    raws: list[float] = []
    ceilings: list[float] = []
    for rows in rounds:
        for row in rows:
            if (row.protocol, row.concurrency, row.server) != point:
                continue
            pct = pct_of_raw(rows, row)
            if pct is not None:
                raws.append(pct / 100.0)
            ratio = of_ceiling(rows, row)
            if ratio is not None:
                ceilings.append(ratio)
    return (
        statistics.median(raws) if raws else None,
        statistics.median(ceilings) if ceilings else None,
    )


def fmt_rate(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def fmt_ms(value: float) -> str:
    if math.isnan(value):
        return "-"
    return f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def fmt_pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}%"


def fmt_ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def cpu_ratio(reference: Row | None, row: Row) -> float | None:
    """The reference's CPU per inference over the row's: the throughput ratio the row would
    have on a core of its own (both CPU-bound on it), whatever else shares the core."""
    if reference is None or reference.cpu_us is None or not row.cpu_us:
        return None
    return reference.cpu_us / row.cpu_us


def with_cpu(ratio: float | None, by_cpu: float | None) -> str:
    return fmt_ratio(ratio) + ("" if by_cpu is None else f" ({by_cpu:.2f})")


def ratio_cells(rows: Sequence[Row], row: Row) -> list[str]:
    """raw ORT, x raw, ceiling, x ceiling: the references measured in the same run; the ratios
    of CPU per inference in brackets."""
    raw = raw_ceiling(rows, row.model)
    if row.is_raw or raw is None:
        raw_cells = ["-", "-"]
    else:
        pct = pct_of_raw(rows, row)
        raw_row = next((r for r in rows if r.is_raw and r.model == row.model and r.cpu_us), None)
        ratio = None if pct is None else pct / 100.0
        raw_cells = [fmt_rate(raw), with_cpu(ratio, cpu_ratio(raw_row, row))]
    ceiling = best_ceiling(rows, row)
    if ceiling is None or ceiling.stats is None:
        return [*raw_cells, "-", "-"]
    name = f"{ceiling.server} {fmt_rate(ceiling.stats.infer_per_s)}"
    return [*raw_cells, name, with_cpu(of_ceiling(rows, row), cpu_ratio(ceiling, row))]


def cells(rows: Sequence[Row], row: Row) -> list[str]:
    head = [row.model, row.protocol, row.server, str(row.concurrency)]
    other = fmt_pct(row.other_cpu_pct)
    if row.stats is None:
        return [*head, "error", "-", "-", "-", other, row.client, "-", "-", "-", "-"]
    return [
        *head,
        fmt_rate(row.stats.infer_per_s),
        fmt_ms(row.stats.p50_ms),
        fmt_ms(row.stats.p99_ms),
        "-" if row.cpu_us is None else f"{row.cpu_us:,.0f}",
        other,
        row.client,
        *ratio_cells(rows, row),
    ]


def text_table(rows: Sequence[Row]) -> str:
    grid = [list(HEADERS)] + [cells(rows, r) for r in rows]
    widths = [max(len(line[i]) for line in grid) for i in range(len(HEADERS))]
    lines = []
    for n, line in enumerate(grid):
        padded = [
            c.rjust(widths[i]) if i in NUMERIC else c.ljust(widths[i]) for i, c in enumerate(line)
        ]
        lines.append("  ".join(padded).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def markdown_table(rows: Sequence[Row]) -> str:
    align = ["---:" if i in NUMERIC else "---" for i in range(len(HEADERS))]
    lines = ["| " + " | ".join(HEADERS) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(cells(rows, r)) + " |" for r in rows]
    return "\n".join(lines)


def errors(rows: Sequence[Row]) -> list[str]:
    return [
        f"{r.model} / {r.protocol} / {r.server} / c={r.concurrency}: {r.error}"
        for r in rows
        if r.error
    ]


def _find(rows: Sequence[Row], model: str, protocol: str) -> Row | None:
    for row in rows:
        point = (row.model, row.protocol, row.concurrency)
        if row.is_server and point == (model, protocol, TARGET_CONCURRENCY):
            return row
    return None


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


DISAGREE = 0.2  # throughput and CPU ratios further apart than this: the point was disturbed


def _cpu_note(ratio: float, by_cpu: float | None) -> str:
    if by_cpu is None:
        return ""
    note = f"; by CPU per inference {by_cpu:.2f}"
    if abs(ratio - by_cpu) > DISAGREE * by_cpu:
        note += " (they disagree: other load disturbed the point; re-run or read the CPU ratio)"
    return note


def target_checks(rows: Sequence[Row]) -> list[str]:
    """The project's targets, for the points that were measured."""
    checks = []
    for (model, protocol), goal in OF_RAW_TARGETS.items():
        row = _find(rows, model, protocol)
        pct = pct_of_raw(rows, row) if row else None
        if row is not None and pct is not None:
            raw_row = next((r for r in rows if r.is_raw and r.model == model and r.cpu_us), None)
            by_cpu = cpu_ratio(raw_row, row)
            checks.append(
                f"{_verdict(pct / 100.0 >= goal)} {model} {protocol} c={TARGET_CONCURRENCY}: "
                f"{pct / 100.0:.2f} of raw ORT (goal >= {goal:.2f})" + _cpu_note(pct / 100, by_cpu)
            )
    for (model, protocol), goal in OF_CEILING_TARGETS.items():
        row = _find(rows, model, protocol)
        ratio = of_ceiling(rows, row) if row else None
        ceiling = best_ceiling(rows, row) if row else None
        if row is not None and ratio is not None and ceiling is not None:
            checks.append(
                f"{_verdict(ratio >= goal)} {model} {protocol} c={TARGET_CONCURRENCY}: "
                f"{ratio:.2f} of the {ceiling.server} ceiling (goal >= {goal:.2f})"
                + _cpu_note(ratio, cpu_ratio(ceiling, row))
            )
    for protocol, target in SIMPLE_TARGETS.items():
        row = _find(rows, "simple", protocol)
        if row and row.stats:
            rate = row.stats.infer_per_s
            checks.append(
                f"{_verdict(rate >= target)} simple {protocol} c={TARGET_CONCURRENCY}: "
                f"{rate:,.0f} infer/s (target >= {target:,.0f})"
            )
    return checks
