"""Per-request overhead of a Python model against an ONNX model doing the same (identity).

    python -m bench.python_overhead [--seconds N] [--output FILE.md]

Both models take FP32 [1, 4] and return it; perf_analyzer over gRPC at concurrency 1 on core 1,
the server on core 0. The difference in p50 latency is what the Python backend costs per
request (process hop, shared memory, pb_utils objects).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from onnx import TensorProto

from bench import perf
from bench.batching import emit, measure, row
from bench.server import start_server, stop_server, wait_ready
from configs.generate import identity_model, save

IDENTITY_PY = """\
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
            for r in requests]
"""

CONFIG = """\
name: "{name}"
{engine}
max_batch_size: 4
input [ {{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 4 ] }} ]
"""


def build(root: Path) -> Path:
    save(
        identity_model(TensorProto.FLOAT, ["batch", 4]), root / "identity_onnx" / "1" / "model.onnx"
    )
    (root / "identity_onnx" / "config.pbtxt").write_text(
        CONFIG.format(name="identity_onnx", engine='platform: "onnxruntime_onnx"')
    )
    (root / "identity_python" / "1").mkdir(parents=True)
    (root / "identity_python" / "1" / "model.py").write_text(IDENTITY_PY)
    (root / "identity_python" / "config.pbtxt").write_text(
        CONFIG.format(name="identity_python", engine='backend: "python"')
    )
    return root


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.python_overhead",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args(argv)
    pa, why = perf.find_perf_analyzer(perf.DEFAULT_TOOL)
    if pa is None:
        raise SystemExit(f"perf_analyzer is needed: {why}")
    lines = [
        "| measurement | setting | infer/s | p50 ms | p99 ms |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    p50 = {}
    with tempfile.TemporaryDirectory(prefix="bench-python-") as tmp:
        workdir = Path(tmp)
        server = start_server(build(workdir / "models"), 0, workdir / "server.log")
        try:
            wait_ready(server)
            for model in ("identity_onnx", "identity_python"):
                stats = measure(
                    pa,
                    model,
                    server.grpc_url,
                    ["--concurrency-range", "1:1"],
                    args.seconds,
                    workdir,
                )
                p50[model] = stats.p50_ms
                lines.append(row(model, "gRPC, concurrency 1", stats))
                print(lines[-1], flush=True)
        finally:
            stop_server(server)
    overhead = p50["identity_python"] - p50["identity_onnx"]
    verdict = "PASS" if overhead < 1.0 else "FAIL"
    lines += [
        "",
        f"{verdict} Python backend overhead per request (p50) = {overhead:.2f} ms (target < 1 ms)",
    ]
    emit(lines, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
