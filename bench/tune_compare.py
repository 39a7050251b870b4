"""A tuned configuration against the example repository's default, measured side by side.

    python -m bench.tune_compare [--model densenet_onnx] [--latency-budget-ms 250]
        [--concurrency 1,2,4,8] [--seconds 4] [--time-budget-s 120]

1. Runs `edge-appliance tune` on the model (a copy of the example repository).
2. Measures the example's own config.pbtxt and the tuned one, alternately, through the same
   in-process harness as tune (the server's loader, scheduler and backend), at each
   concurrency, for --seconds each.
3. Prints each configuration's best throughput whose p99 is within the budget.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
from pathlib import Path

from google.protobuf import text_format

from appliance.common.model_config import ModelConfig
from appliance.runtime.models import ModelRuntime
from appliance.runtime.settings import RuntimeSettings
from appliance.services.inference import InferenceService
from appliance.tools.tune import Point, drive, make_request
from bench.common import ROOT
from configs.generate import write_repository


async def measure(
    repo: Path, model: str, config: ModelConfig | None, levels: list[int], seconds: float
) -> list[Point]:
    runtime = ModelRuntime(RuntimeSettings(repositories=(repo,)))
    inference = InferenceService(runtime)
    try:
        await runtime.load(model, override=config)
        record = runtime.record(model)
        assert record.config is not None, record.reason
        request = make_request(record.config, {})
        return [await drive(inference, request, n, seconds) for n in levels]
    finally:
        await runtime.stop()


def best(points: list[Point], budget_ms: float) -> Point | None:
    return max(
        (p for p in points if p.p99_ms <= budget_ms), key=lambda p: p.throughput, default=None
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="densenet_onnx")
    parser.add_argument("--latency-budget-ms", type=float, default=250.0)
    parser.add_argument("--concurrency", default="1,2,4,8")
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--time-budget-s", type=float, default=120.0)
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        repo = write_repository(Path(tmp) / "models")
        tuned_dir = Path(tmp) / "tuned"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "appliance",
                "tune",
                "--model-repository",
                str(repo),
                "--model",
                args.model,
                "--latency-budget-ms",
                str(args.latency_budget_ms),
                "--concurrency",
                args.concurrency,
                "--time-budget-s",
                str(args.time_budget_s),
                "--output",
                str(tuned_dir),
                "--quiet",
            ],
            cwd=ROOT,
            check=True,
        )
        tuned = text_format.Parse((tuned_dir / "config.pbtxt").read_text(), ModelConfig())
        rows = []
        for label, config in (
            ("example default", None),
            ("tuned", tuned),
            ("example default (again)", None),
            ("tuned (again)", tuned),
        ):
            points = asyncio.run(measure(repo, args.model, config, levels, args.seconds))
            rows.append((label, points))
    print(
        f"\n| {args.model} configuration | best infer/s with p99 <= "
        f"{args.latency_budget_ms:g} ms | at concurrency | p50 ms | p99 ms |"
    )
    print("|---|---:|---:|---:|---:|")
    for label, points in rows:
        point = best(points, args.latency_budget_ms)
        if point is None:
            print(f"| {label} | none within budget | | | |")
        else:
            print(
                f"| {label} | {point.throughput:,.1f} | {point.concurrency} | "
                f"{point.p50_ms:.1f} | {point.p99_ms:.1f} |"
            )
    print("\ntuned config.pbtxt:\n" + text_format.MessageToString(tuned))


if __name__ == "__main__":
    main()
