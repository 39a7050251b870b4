"""Result rows, the results table (plain text and Markdown) and the target checks."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from bench.common import Stats

HEADERS = (
    "model",
    "protocol",
    "concurrency",
    "infer/s",
    "p50 ms",
    "p99 ms",
    "% of raw",
    "other CPU",
    "client",
)
RAW_PROTOCOLS = ("raw ORT (before)", "raw ORT (after)")
IMAGE_MODELS = ("squeezenet_onnx", "densenet_onnx")
PCT_OF_RAW_TARGET = 88.0
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

    @property
    def is_raw(self) -> bool:
        return self.protocol in RAW_PROTOCOLS


def raw_ceiling(rows: Sequence[Row], model: str) -> float | None:
    """The best raw ORT throughput measured for the model (before or after the server runs)."""
    values = [r.stats.infer_per_s for r in rows if r.is_raw and r.model == model and r.stats]
    return max(values) if values else None


def pct_of_raw(rows: Sequence[Row], row: Row) -> float | None:
    ceiling = raw_ceiling(rows, row.model)
    if row.stats is None or not ceiling:
        return None
    return 100.0 * row.stats.infer_per_s / ceiling


def fmt_rate(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def fmt_ms(value: float) -> str:
    if math.isnan(value):
        return "-"
    return f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def fmt_pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}%"


def cells(rows: Sequence[Row], row: Row) -> list[str]:
    head = [row.model, row.protocol, str(row.concurrency)]
    other = fmt_pct(row.other_cpu_pct)
    if row.stats is None:
        return [*head, "error", "-", "-", "-", other, row.client]
    return [
        *head,
        fmt_rate(row.stats.infer_per_s),
        fmt_ms(row.stats.p50_ms),
        fmt_ms(row.stats.p99_ms),
        fmt_pct(pct_of_raw(rows, row)),
        other,
        row.client,
    ]


def text_table(rows: Sequence[Row]) -> str:
    grid = [list(HEADERS)] + [cells(rows, r) for r in rows]
    widths = [max(len(line[i]) for line in grid) for i in range(len(HEADERS))]
    numeric = {2, 3, 4, 5, 6, 7}
    lines = []
    for n, line in enumerate(grid):
        padded = [
            c.rjust(widths[i]) if i in numeric else c.ljust(widths[i]) for i, c in enumerate(line)
        ]
        lines.append("  ".join(padded).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def markdown_table(rows: Sequence[Row]) -> str:
    align = ["---", "---", "---:", "---:", "---:", "---:", "---:", "---:", "---"]
    lines = ["| " + " | ".join(HEADERS) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(cells(rows, r)) + " |" for r in rows]
    return "\n".join(lines)


def errors(rows: Sequence[Row]) -> list[str]:
    return [f"{r.model} / {r.protocol} / c={r.concurrency}: {r.error}" for r in rows if r.error]


def _find(rows: Sequence[Row], model: str, protocol: str) -> Row | None:
    for row in rows:
        if (row.model, row.protocol, row.concurrency) == (model, protocol, TARGET_CONCURRENCY):
            return row
    return None


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def target_checks(rows: Sequence[Row]) -> list[str]:
    """The project's targets, for the points that were measured."""
    checks = []
    for model in IMAGE_MODELS:
        row = _find(rows, model, "grpc")
        pct = pct_of_raw(rows, row) if row else None
        if pct is not None:
            checks.append(
                f"{_verdict(pct >= PCT_OF_RAW_TARGET)} {model} grpc c={TARGET_CONCURRENCY}: "
                f"{pct:.0f}% of raw (target >= {PCT_OF_RAW_TARGET:.0f}%)"
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
