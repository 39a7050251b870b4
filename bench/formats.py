"""OpenVINO vs ONNX Runtime on the CPU: the same model, the same threads, in process.

    python -m bench.formats [--models densenet121 squeezenet] [--seconds 3] [--threads N]

Each model comes from the onnx wheel (backend/test/data/light), with its batch dimension made
dynamic; OpenVINO gets the IR converted from that file (full-precision weights). Both run
through this server's own backends (edge_backends.ort and edge_backends.openvino_backend) with their
default settings for one instance, so the numbers are what a served model gets, minus the
network. "other CPU" is what other processes took meanwhile (the machine may be shared).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from bench.cpu import other_cpu_pct, snapshot
from edge_backends.api import InstanceSpec, ModelInstance
from edge_backends.params import usable_cpu_count

LIGHT = Path(onnx.__file__).parent / "backend/test/data/light"
MODELS = {"densenet121": "light_densenet121.onnx", "squeezenet": "light_squeezenet.onnx"}


def _dynamic_batch(source: Path, target: Path) -> tuple[str, str]:
    """Copy the model with a symbolic batch dimension; return its input and output names."""
    model = onnx.load(str(source))
    inits = {i.name for i in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in inits]
    for value in (*inputs, *model.graph.output):
        value.type.tensor_type.shape.dim[0].dim_param = "batch"
    onnx.save(model, str(target))
    return inputs[0].name, model.graph.output[0].name


def _spec(name: str, path: Path, parameters: dict[str, str]) -> InstanceSpec:
    return InstanceSpec(
        model_name=name,
        model_version=1,
        model_path=path,
        instance_name=f"{name}_0",
        parameters=parameters,
        model_config={"max_batch_size": 8},
    )


def _instances(onnx_path: Path, ir_path: Path, threads: int) -> dict[str, ModelInstance]:
    import openvino as ov

    from edge_backends.openvino_backend import OpenVinoBackend
    from edge_backends.ort import OrtBackend

    ov.save_model(ov.convert_model(str(onnx_path)), str(ir_path), compress_to_fp16=False)
    ort_params = {"intra_op_thread_count": str(threads)}
    ov_params = {"INFERENCE_NUM_THREADS": str(threads)}
    return {
        "onnxruntime": OrtBackend().create_instance(_spec("ort", onnx_path, ort_params)),
        "openvino": OpenVinoBackend().create_instance(_spec("ov", ir_path, ov_params)),
    }


def _measure(
    instance: ModelInstance, feed: dict[str, Any], outputs: list[str], seconds: float
) -> tuple[int, float, float]:
    """Runs, wall seconds and others' CPU % over about `seconds` after two warm-up runs."""
    instance.execute(feed, outputs)
    instance.execute(feed, outputs)
    before = snapshot()
    start = time.perf_counter()
    count = 0
    while time.perf_counter() - start < seconds:
        instance.execute(feed, outputs)
        count += 1
    wall = time.perf_counter() - start
    return count, wall, other_cpu_pct(before, snapshot())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), default=sorted(MODELS))
    parser.add_argument("--seconds", type=float, default=3.0, help="per measurement")
    parser.add_argument("--threads", type=int, default=usable_cpu_count())
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    args = parser.parse_args()
    print(f"threads: {args.threads} (of {usable_cpu_count()} usable CPUs), {args.seconds:g} s each")
    header = "| model | batch | runtime | images/s | ms per batch | vs ORT | other CPU |"
    print(header)
    print("|---|---:|---|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models:
            onnx_path = Path(tmp) / f"{model}.onnx"
            in_name, out_name = _dynamic_batch(LIGHT / MODELS[model], onnx_path)
            instances = _instances(onnx_path, Path(tmp) / f"{model}.xml", args.threads)
            try:
                for batch in args.batches:
                    rng = np.random.default_rng(0)
                    images = rng.random((batch, 3, 224, 224), dtype=np.float32)
                    outputs = {}
                    rates = {}
                    for runtime, instance in instances.items():
                        feed = {in_name: images}
                        outputs[runtime] = instance.execute(feed, [out_name])
                        count, wall, other = _measure(instance, feed, [out_name], args.seconds)
                        rates[runtime] = count * batch / wall
                        ratio = rates[runtime] / rates["onnxruntime"]
                        print(
                            f"| {model} | {batch} | {runtime} | {rates[runtime]:.1f} | "
                            f"{1000 * wall / count:.1f} | {ratio:.2f}x | {other:.0f}% |"
                        )
                    np.testing.assert_allclose(  # same model, same answers
                        outputs["openvino"][out_name],
                        outputs["onnxruntime"][out_name],
                        rtol=1e-3,
                        atol=1e-4,
                    )
            finally:
                for instance in instances.values():
                    instance.close()


if __name__ == "__main__":
    main()
