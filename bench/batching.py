"""Scheduling benchmark: what dynamic batching buys, what the queue delay costs, bursts.

    python -m bench.batching [--seconds N] [--output FILE.md]

1. Batching gain: densenet_onnx at concurrency 16 over gRPC, with no dynamic batching, with
   `dynamic_batching { }` and with the example's `preferred_batch_size: [ 2 ]`.
2. Queue delay: `simple` with dynamic batching at concurrency 16 over gRPC, for several
   `max_queue_delay_microseconds`: throughput, p50, p99.
3. Bursts: squeezenet_onnx (dynamic batching) at a fixed mean request rate below capacity, with
   steady (constant) and bursty (Poisson) arrivals; the target is a bursty p99 no worse than
   1.5x the steady one.

Server on core 0, perf_analyzer on core 1, as in bench.run.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from bench import perf
from bench.common import Stats
from bench.server import start_server, stop_server, wait_ready
from configs.generate import IMAGE_CONFIG, SIMPLE_CONFIG, light_model, save, simple_model

DELAYS_US = (0, 500, 2000, 5000)
DENSENET_VARIANTS = {
    "densenet_none": "",
    "densenet_dynamic": "dynamic_batching { }",
    "densenet_pref2": "dynamic_batching { preferred_batch_size: [ 2 ] }",
}


def build_repository(root: Path) -> Path:
    densenet = light_model("light_densenet121")
    for name, batching in DENSENET_VARIANTS.items():
        save(densenet, root / name / "1" / "model.onnx")
        text = IMAGE_CONFIG.format(name=name, output="fc6_1", batching=batching)
        (root / name / "config.pbtxt").write_text(
            text.replace(', label_filename: "labels.txt"', "")
        )
    for delay in DELAYS_US:
        name = f"simple_delay_{delay}"
        save(simple_model(), root / name / "1" / "model.onnx")
        (root / name / "config.pbtxt").write_text(
            SIMPLE_CONFIG.replace('"simple"', f'"{name}"')
            + f"dynamic_batching {{ max_queue_delay_microseconds: {delay} }}\n"
        )
    save(light_model("light_squeezenet"), root / "squeezenet_onnx" / "1" / "model.onnx")
    (root / "squeezenet_onnx" / "config.pbtxt").write_text(
        IMAGE_CONFIG.format(
            name="squeezenet_onnx", output="softmaxout_1", batching="dynamic_batching { }"
        ).replace(', label_filename: "labels.txt"', "")
    )
    return root


def measure(
    pa: perf.PerfAnalyzer, model: str, url: str, load: list[str], seconds: float, workdir: Path
) -> Stats:
    csv_path = workdir / f"{model}-{'-'.join(load)}.csv".replace(":", "_")
    window_ms = max(500, round(seconds * 1000 / perf.WINDOWS))
    cmd = [
        "taskset",
        "-c",
        "1",
        *perf.base_command(pa, model, url, "grpc", load, window_ms, csv_path),
    ]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=seconds * 4 + 120, check=False
    )
    if proc.returncode != 0 or not csv_path.exists():
        raise RuntimeError(
            f"perf_analyzer failed for {model}: {proc.stdout[-800:]}{proc.stderr[-800:]}"
        )
    return perf.parse_result(csv_path.read_text(), proc.stdout)


def row(label: str, setting: str, stats: Stats) -> str:
    return (
        f"| {label} | {setting} | {stats.infer_per_s:,.1f} | {stats.p50_ms:.1f} | "
        f"{stats.p99_ms:.1f} |"
    )


def run(seconds: float, rate: int) -> list[str]:
    pa, why = perf.find_perf_analyzer(perf.DEFAULT_TOOL)
    if pa is None:
        raise SystemExit(f"perf_analyzer is needed for this benchmark: {why}")
    lines = [
        "| measurement | setting | infer/s | p50 ms | p99 ms |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    with tempfile.TemporaryDirectory(prefix="bench-batching-") as tmp:
        workdir = Path(tmp)
        repo = build_repository(workdir / "models")
        server = start_server(repo, 0, workdir / "server.log")
        try:
            wait_ready(server)
            concurrency = ["--concurrency-range", "16:16"]
            for name, batching in DENSENET_VARIANTS.items():
                stats = measure(pa, name, server.grpc_url, concurrency, seconds, workdir)
                lines.append(row("densenet c=16", batching or "no dynamic batching", stats))
                print(lines[-1], flush=True)
            for delay in DELAYS_US:
                stats = measure(
                    pa, f"simple_delay_{delay}", server.grpc_url, concurrency, seconds, workdir
                )
                lines.append(row("simple c=16", f"max_queue_delay {delay} us", stats))
                print(lines[-1], flush=True)
            steady = bursty = None
            for distribution in ("constant", "poisson"):
                load = [
                    "--request-rate-range",
                    f"{rate}:{rate}",
                    "--request-distribution",
                    distribution,
                ]
                stats = measure(pa, "squeezenet_onnx", server.grpc_url, load, seconds * 2, workdir)
                lines.append(row(f"squeezenet {rate} req/s", f"{distribution} arrivals", stats))
                print(lines[-1], flush=True)
                steady, bursty = (stats, bursty) if distribution == "constant" else (steady, stats)
        finally:
            stop_server(server)
    if steady is None or bursty is None:
        raise RuntimeError("the burst measurements did not run")
    ratio = bursty.p99_ms / steady.p99_ms
    verdict = "PASS" if ratio <= 1.5 else "FAIL"
    lines += ["", f"{verdict} bursty p99 / steady p99 = {ratio:.2f} (target <= 1.5)"]
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.batching",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--seconds", type=float, default=6.0, help="per point (bursts: twice)")
    parser.add_argument("--rate", type=int, default=55, help="squeezenet request rate, req/s")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args(argv)
    emit(run(args.seconds, args.rate), args.output)
    return 0


def emit(lines: list[str], output: Path | None) -> None:
    """Print the table and, when asked, write it to a Markdown file."""
    text = "\n".join(lines)
    print(text)
    if output:
        output.write_text(text + "\n")


if __name__ == "__main__":
    sys.exit(main())
