"""Server CPU per request of ModelStreamInfer on both of its paths, A/B between source trees,
interleaved (issue 20).

    python -m bench.grpc_stream_probe --trees /tmp/old,. [--rounds 4] [--seconds 4]

`simple` is answered on the stream's handler thread (the thread lane takes it);
`simple_batched` is `simple` with dynamic batching (max_queue_delay_microseconds 100), which the
lane leaves to the event loop (its policy waits for a batch to fill), so its requests take the
stream's loop path: handed to the loop, answered from it, the next one read by the stream's
reader thread. Both over grpc-stream (perf_analyzer --streaming, one stream per concurrent
request) and unary grpc, at concurrency 8, the server on core 0 and perf_analyzer on core 1,
measured as bench.cpu_per_request measures (server CPU time over the requests counted).
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

from bench.cpu_per_request import Points, Target, print_table, run_rounds, start_tree
from bench.perf import DEFAULT_TOOL

BATCHED = "simple_batched"
POINTS = [
    ("simple", "grpc-stream"),
    (BATCHED, "grpc-stream"),
    ("simple", "grpc"),
    (BATCHED, "grpc"),
]


def repository(root: Path) -> Path:
    """`simple` and `simple_batched` from the example repository."""
    from configs.generate import main as generate

    everything = root / "all"
    generate([str(everything)])
    models = root / "models"
    shutil.copytree(everything / "simple", models / "simple")
    shutil.copytree(everything / "simple", models / BATCHED)
    config = (models / BATCHED / "config.pbtxt").read_text()
    config = config.replace('name: "simple"', f'name: "{BATCHED}"')
    config += "dynamic_batching { max_queue_delay_microseconds: 100 }\n"
    (models / BATCHED / "config.pbtxt").write_text(config)
    return models


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.grpc_stream_probe")
    parser.add_argument("--trees", required=True, help="comma-separated checkouts")
    parser.add_argument(
        "--rounds", type=int, default=4, help="even: each server first as often as last"
    )
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--perf-analyzer", type=Path, default=DEFAULT_TOOL)
    args = parser.parse_args(argv)
    trees = [str(Path(t).resolve()) for t in args.trees.split(",") if t]
    with tempfile.TemporaryDirectory(prefix="edge-stream-") as work:
        models = repository(Path(work))

        def start(tree: str) -> tuple[Target, Points]:
            return start_tree(Path(tree), models), list(POINTS)

        results = run_rounds(trees, args.rounds, start, args.perf_analyzer, args.seconds)
    print_table(trees, POINTS, results, by_round=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
