"""OpenVINO in f32 (the backend's default) against bf16 (HINT_BF16: YES), with ONNX Runtime.

    python -m bench.ov_precision [--rounds 4] [--seconds 1.5] [--threads N]

The three run interleaved, batch 1, on the onnx wheel's DenseNet-121 and SqueezeNet, through
this server's own backends; each prints its best milliseconds per batch over the rounds (the
best, because the machine is shared). On a CPU without bf16 the two OpenVINO rows are the same
computation. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.formats import LIGHT, MODELS, _dynamic_batch, _spec
from edge_backends.api import ModelInstance
from edge_backends.params import usable_cpu_count


def run_ms(
    instance: ModelInstance, feed: dict[str, np.ndarray], output: str, seconds: float
) -> float:
    """Milliseconds per batch over about `seconds`, after one warm-up run."""
    instance.execute(feed, [output])
    start, runs = time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        instance.execute(feed, [output])
        runs += 1
    return (time.perf_counter() - start) / runs * 1e3


def main() -> None:
    import openvino as ov

    from edge_backends.openvino_backend import OpenVinoBackend
    from edge_backends.ort import OrtBackend

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=1.5, help="per run")
    parser.add_argument("--threads", type=int, default=usable_cpu_count())
    args = parser.parse_args()
    threads = str(args.threads)
    print("| model | onnxruntime, ms | openvino f32, ms | openvino bf16, ms | bf16 speed-up |")
    print("|---|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as folder:
        for model in sorted(MODELS):
            onnx_path, ir_path = Path(folder) / f"{model}.onnx", Path(folder) / f"{model}.xml"
            inp, out = _dynamic_batch(LIGHT / MODELS[model], onnx_path)
            ov.save_model(ov.convert_model(str(onnx_path)), str(ir_path), compress_to_fp16=False)
            ov_f32 = {"INFERENCE_NUM_THREADS": threads}
            instances = {
                "ort": OrtBackend().create_instance(
                    _spec("ort", onnx_path, {"intra_op_thread_count": threads})
                ),
                "f32": OpenVinoBackend().create_instance(_spec("f32", ir_path, ov_f32)),
                "bf16": OpenVinoBackend().create_instance(
                    _spec("bf16", ir_path, {**ov_f32, "HINT_BF16": "YES"})
                ),
            }
            image = np.random.default_rng(0).random((1, 3, 224, 224), dtype=np.float32)
            best = dict.fromkeys(instances, float("inf"))
            for _ in range(args.rounds):
                for name, instance in instances.items():
                    ms = run_ms(instance, {inp: image}, out, args.seconds)
                    best[name] = min(best[name], ms)
            for instance in instances.values():
                instance.close()
            print(
                f"| {model} | {best['ort']:.1f} | {best['f32']:.1f} | {best['bf16']:.1f} "
                f"| {best['f32'] / best['bf16']:.2f}x |"
            )


if __name__ == "__main__":
    main()
