"""Build the bundled example model repository (configs/models) from code, not binaries.

    python -m configs.generate [OUTPUT_DIR]

- simple: Triton's quick-start model (INT32 INPUT0 + INPUT1 -> OUTPUT0 sum, OUTPUT1 difference)
- densenet_onnx / squeezenet_onnx: the real architectures shipped in the onnx wheel, with the
  batch dimension made dynamic; densenet_onnx as Triton's own example config, squeezenet_onnx
  batching (max_batch_size 8) without dynamic batching (SQUEEZENET_BATCHING says why)
- simple_string: Triton's string quick-start model (BYTES numbers in, their sum and difference
  as BYTES out)
- simple_identity, simple_int8: the other models Triton's string and int8 examples call
- densenet_preprocess: a Python model (model.py) that turns an HWC UINT8 image into the
  normalised NCHW tensor and calls densenet_onnx through BLS
- identity_fp32: no config.pbtxt at all, served through auto-complete
- the models Triton's client examples (client repository, src/python/examples) call:
  simple_sequence (OUTPUT = READY * (INPUT + START), direct), simple_dyna_sequence (the same
  plus END * CORRID, oldest, two instances), custom_identity_int32 (INT32 identity),
  repeat_int32 (a decoupled Python model: one response per IN element, after DELAY ms each),
  preprocess_inception_ensemble (raw image bytes -> image_preprocess (a Python model; decoding
  needs Pillow beside the server) -> densenet_onnx, classified with densenet_onnx's labels)

The builders are also used by the tests.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import onnx
from onnx import TensorProto, helper

OPSET = 13
IR_VERSION = 8
ONNX_LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"

SIMPLE_CONFIG = """\
name: "simple"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [
  { name: "INPUT0", data_type: TYPE_INT32, dims: [ 16 ] },
  { name: "INPUT1", data_type: TYPE_INT32, dims: [ 16 ] }
]
output [
  { name: "OUTPUT0", data_type: TYPE_INT32, dims: [ 16 ] },
  { name: "OUTPUT1", data_type: TYPE_INT32, dims: [ 16 ] }
]
"""

IMAGE_CONFIG = """\
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ {{ name: "data_0", data_type: TYPE_FP32, format: FORMAT_NCHW, dims: [ 3, 224, 224 ] }} ]
output [
  {{ name: "{output}", data_type: TYPE_FP32, dims: [ 1000, 1, 1 ], label_filename: "labels.txt" }}
]
{batching}
instance_group [ {{ count: 1, kind: KIND_CPU }} ]
"""

# squeezenet_onnx runs each request alone (Triton's default scheduler), as a client's batch of
# up to 8 if it sends one. Dynamic batching costs a CPU image model on a single-thread instance
# throughput and gains it nothing: per image, one ONNX Runtime thread is no faster at batch 4-8
# than at batch 1 (about 8% slower here), and a batch answers all its clients at once, so the
# queue runs dry while they send their next requests and the instance waits for them; run one
# at a time, the requests queued behind the running one hide those round trips. Measured in
# docs/benchmarks/history.md ("Hot path (issue 20)"). A GPU instance, or a model whose cost per item
# falls with the batch, is where `dynamic_batching { }` belongs.
SQUEEZENET_BATCHING = ""

# Triton's own example config of densenet_onnx (server repository, docs/examples/
# model_repository): no batching, the batch dimension of 1 added and removed by reshape. Its
# clients depend on it: grpc_client.py sends an unbatched [3, 224, 224].
DENSENET_CONFIG = """\
name: "densenet_onnx"
platform: "onnxruntime_onnx"
max_batch_size: 0
input [ { name: "data_0", data_type: TYPE_FP32, format: FORMAT_NCHW, dims: [ 3, 224, 224 ],
          reshape { shape: [ 1, 3, 224, 224 ] } } ]
output [ { name: "fc6_1", data_type: TYPE_FP32, dims: [ 1000 ],
           reshape { shape: [ 1, 1000, 1, 1 ] }, label_filename: "labels.txt" } ]
instance_group [ { count: 1, kind: KIND_CPU } ]
"""


PREPROCESS_MODEL = """\
import numpy as np
import triton_python_backend_utils as pb_utils

MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32).reshape(3, 1, 1)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32).reshape(3, 1, 1)


class TritonPythonModel:
    \"\"\"HWC UINT8 image -> normalised CHW FP32 -> densenet_onnx (BLS) -> class scores.\"\"\"

    def execute(self, requests):
        responses = []
        for request in requests:
            image = pb_utils.get_input_tensor_by_name(request, "IMAGE").as_numpy()
            chw = (image.astype(np.float32) / 255.0).transpose(2, 0, 1)
            chw = (chw - MEAN) / STD  # densenet_onnx takes one unbatched image
            result = pb_utils.InferenceRequest(
                model_name="densenet_onnx",
                requested_output_names=["fc6_1"],
                inputs=[pb_utils.Tensor("data_0", chw)],
            ).exec()
            if result.has_error():
                raise pb_utils.TritonModelException(result.error().message())
            scores = pb_utils.get_output_tensor_by_name(result, "fc6_1").as_numpy()
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("SCORES", scores.reshape(1000))]))
        return responses
"""

PREPROCESS_CONFIG = """\
name: "densenet_preprocess"
backend: "python"
max_batch_size: 0
input [ { name: "IMAGE", data_type: TYPE_UINT8, dims: [ 224, 224, 3 ] } ]
output [ { name: "SCORES", data_type: TYPE_FP32, dims: [ 1000 ] } ]
"""


SEQUENCE_CONFIG = """\
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 8
sequence_batching {{
  {strategy}
  control_input [
    {{ name: "START", control [ {{ kind: CONTROL_SEQUENCE_START, int32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "READY", control [ {{ kind: CONTROL_SEQUENCE_READY, int32_false_true: [ 0, 1 ] }} ] }}
    {controls}
  ]
}}
input [ {{ name: "INPUT", data_type: TYPE_INT32, dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT", data_type: TYPE_INT32, dims: [ 1 ] }} ]
instance_group [ {{ count: {count}, kind: KIND_CPU }} ]
"""

DYNA_CONTROLS = """,
    { name: "END", control [ { kind: CONTROL_SEQUENCE_END, int32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID", control [ { kind: CONTROL_SEQUENCE_CORRID, data_type: TYPE_UINT64 } ] }"""

REPEAT_MODEL = """\
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    \"\"\"Decoupled: for each element of IN, after DELAY[i] ms, a response OUT = [IN[i]],
    IDX = [i]; then WAIT ms before the final flag.\"\"\"

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            delays = pb_utils.get_input_tensor_by_name(request, "DELAY").as_numpy()
            wait = pb_utils.get_input_tensor_by_name(request, "WAIT").as_numpy()
            for index, value in enumerate(values):
                time.sleep(float(delays[index]) / 1000)
                sender.send(pb_utils.InferenceResponse([
                    pb_utils.Tensor("OUT", np.array([value], dtype=np.int32)),
                    pb_utils.Tensor("IDX", np.array([index], dtype=np.uint32)),
                ]))
            time.sleep(float(wait[0]) / 1000)
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

REPEAT_CONFIG = """\
name: "repeat_int32"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [
  { name: "IN", data_type: TYPE_INT32, dims: [ -1 ] },
  { name: "DELAY", data_type: TYPE_UINT32, dims: [ -1 ] },
  { name: "WAIT", data_type: TYPE_UINT32, dims: [ 1 ] }
]
output [
  { name: "OUT", data_type: TYPE_INT32, dims: [ 1 ] },
  { name: "IDX", data_type: TYPE_UINT32, dims: [ 1 ] }
]
instance_group [ { count: 1, kind: KIND_CPU } ]
"""

IMAGE_PREPROCESS_MODEL = """\
import io

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    \"\"\"Encoded images (BYTES, one per batch row) -> RGB 224x224, scaled to [-1, 1] (Inception
    scaling), CHW FP32. Decoding needs Pillow where the server runs.\"\"\"

    def initialize(self, args):
        try:
            from PIL import Image
        except ImportError:
            Image = None
        self.image = Image

    def execute(self, requests):
        if self.image is None:
            raise pb_utils.TritonModelException(
                "image_preprocess decodes images with Pillow: install it beside the server "
                "(pip install pillow)")
        responses = []
        for request in requests:
            encoded = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            batch = []
            for item in encoded.reshape(len(encoded), -1)[:, 0]:
                image = self.image.open(io.BytesIO(bytes(item))).convert("RGB")
                pixels = np.asarray(image.resize((224, 224)), dtype=np.float32)
                batch.append((pixels / 127.5 - 1.0).transpose(2, 0, 1))
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUTPUT", np.stack(batch).astype(np.float32))]))
        return responses
"""

IMAGE_PREPROCESS_CONFIG = """\
name: "image_preprocess"
backend: "python"
max_batch_size: 8
input [ { name: "INPUT", data_type: TYPE_STRING, dims: [ 1 ] } ]
output [ { name: "OUTPUT", data_type: TYPE_FP32, dims: [ 3, 224, 224 ] } ]
instance_group [ { count: 1, kind: KIND_CPU } ]
"""

IMAGE_ENSEMBLE_CONFIG = """\
name: "preprocess_inception_ensemble"
platform: "ensemble"
max_batch_size: 8
input [ { name: "INPUT", data_type: TYPE_STRING, dims: [ 1 ] } ]
output [ { name: "OUTPUT", data_type: TYPE_FP32, dims: [ 1000 ] } ]
ensemble_scheduling { step [
  { model_name: "image_preprocess", model_version: -1,
    input_map { key: "INPUT" value: "INPUT" }
    output_map { key: "OUTPUT" value: "preprocessed_image" } },
  { model_name: "densenet_onnx", model_version: -1,
    input_map { key: "data_0" value: "preprocessed_image" }
    output_map { key: "fc6_1" value: "OUTPUT" } }
] }
"""


def save(model: onnx.ModelProto, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def make_model(
    nodes: list[onnx.NodeProto],
    inputs: list[onnx.ValueInfoProto],
    outputs: list[onnx.ValueInfoProto],
    name: str = "model",
) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, name, inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    return model


def simple_model(elem_type: int = TensorProto.INT32, dims: int = 16) -> onnx.ModelProto:
    """INPUT0 + INPUT1 -> OUTPUT0, INPUT0 - INPUT1 -> OUTPUT1, with a dynamic batch dimension."""
    shape: list[int | str] = ["batch", dims]

    def info(name: str) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, elem_type, shape)

    return make_model(
        [
            helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
            helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"]),
        ],
        [info("INPUT0"), info("INPUT1")],
        [info("OUTPUT0"), info("OUTPUT1")],
        "simple",
    )


def simple_string_model() -> onnx.ModelProto:
    """Triton's simple_string: BYTES decimal numbers -> their sum and difference as BYTES."""
    text, number = TensorProto.STRING, TensorProto.INT32

    def info(name: str) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, text, ["batch", 16])

    return make_model(
        [
            helper.make_node("Cast", ["INPUT0"], ["a"], to=number),
            helper.make_node("Cast", ["INPUT1"], ["b"], to=number),
            helper.make_node("Add", ["a", "b"], ["sum"]),
            helper.make_node("Sub", ["a", "b"], ["difference"]),
            helper.make_node("Cast", ["sum"], ["OUTPUT0"], to=text),
            helper.make_node("Cast", ["difference"], ["OUTPUT1"], to=text),
        ],
        [info("INPUT0"), info("INPUT1")],
        [info("OUTPUT0"), info("OUTPUT1")],
        "simple_string",
    )


def simple_int8_model() -> onnx.ModelProto:
    """simple on INT8 (ONNX Runtime has no INT8 Add: compute in INT32, cast back)."""
    int8, int32 = TensorProto.INT8, TensorProto.INT32

    def info(name: str) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, int8, ["batch", 16])

    return make_model(
        [
            helper.make_node("Cast", ["INPUT0"], ["a"], to=int32),
            helper.make_node("Cast", ["INPUT1"], ["b"], to=int32),
            helper.make_node("Add", ["a", "b"], ["sum"]),
            helper.make_node("Sub", ["a", "b"], ["difference"]),
            helper.make_node("Cast", ["sum"], ["OUTPUT0"], to=int8),
            helper.make_node("Cast", ["difference"], ["OUTPUT1"], to=int8),
        ],
        [info("INPUT0"), info("INPUT1")],
        [info("OUTPUT0"), info("OUTPUT1")],
        "simple_int8",
    )


def sequence_model(dyna: bool) -> onnx.ModelProto:
    """Triton's simple_sequence: OUTPUT = READY * (INPUT + START); dyna (simple_dyna_sequence):
    READY * (INPUT + START + END * CORRID)."""
    int32 = TensorProto.INT32

    def info(name: str, elem: int = int32) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, elem, ["batch", 1])

    nodes = [helper.make_node("Add", ["INPUT", "START"], ["started"])]
    inputs = [info("INPUT"), info("START"), info("READY")]
    total = "started"
    if dyna:
        nodes += [
            helper.make_node("Cast", ["CORRID"], ["corrid"], to=int32),
            helper.make_node("Mul", ["END", "corrid"], ["ended"]),
            helper.make_node("Add", ["started", "ended"], ["total"]),
        ]
        inputs += [info("END"), info("CORRID", TensorProto.UINT64)]
        total = "total"
    nodes.append(helper.make_node("Mul", ["READY", total], ["OUTPUT"]))
    name = "simple_dyna_sequence" if dyna else "simple_sequence"
    return make_model(nodes, inputs, [info("OUTPUT")], name)


def identity_model(
    elem_type: int, shape: list[int | str], in_name: str = "INPUT0", out_name: str = "OUTPUT0"
) -> onnx.ModelProto:
    """OUTPUT0 = INPUT0 for any element type (BYTES included: ONNX strings)."""
    return make_model(
        [helper.make_node("Identity", [in_name], [out_name])],
        [helper.make_tensor_value_info(in_name, elem_type, shape)],
        [helper.make_tensor_value_info(out_name, elem_type, shape)],
        "identity",
    )


def matmul_chain_model(width: int, steps: int, batch: int | str) -> onnx.ModelProto:
    """OUTPUT0 = tanh(... tanh(INPUT0 @ W) ... @ W), W a constant [width, width]: a CPU-bound
    FP32 model whose cost grows with `steps` (for tests and benches of slow models)."""
    weight = helper.make_tensor("W", TensorProto.FLOAT, [width, width], [0.001] * (width * width))
    nodes, current = [], "INPUT0"
    for i in range(steps):
        nodes.append(helper.make_node("MatMul", [current, "W"], [f"m{i}"]))
        current = "OUTPUT0" if i == steps - 1 else f"t{i}"
        nodes.append(helper.make_node("Tanh", [f"m{i}"], [current]))
    graph = helper.make_graph(
        nodes,
        "matmul_chain",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, [batch, width])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, [batch, width])],
        initializer=[weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    return model


def light_model(name: str) -> onnx.ModelProto:
    """An onnx-wheel model (e.g. 'light_densenet121') with its batch dimension made dynamic."""
    model = onnx.load(str(ONNX_LIGHT / f"{name}.onnx"))
    graph = model.graph
    initializers = {i.name for i in graph.initializer}
    # Old IR versions list weights as graph inputs; keep only real inputs.
    real_inputs = [i for i in graph.input if i.name not in initializers]
    del graph.input[:]
    graph.input.extend(real_inputs)
    for tensor in list(graph.input) + list(graph.output):
        dim = tensor.type.tensor_type.shape.dim[0]
        dim.Clear()
        dim.dim_param = "batch"
    del graph.value_info[:]
    model.ir_version = max(model.ir_version, 4)
    return model


def write_repository(root: Path) -> Path:
    """Write the example repository under `root`; returns it."""
    save(simple_model(), root / "simple" / "1" / "model.onnx")
    (root / "simple" / "config.pbtxt").write_text(SIMPLE_CONFIG)
    save(simple_string_model(), root / "simple_string" / "1" / "model.onnx")
    (root / "simple_string" / "config.pbtxt").write_text(
        SIMPLE_CONFIG.replace('"simple"', '"simple_string"').replace("TYPE_INT32", "TYPE_STRING")
    )
    save(simple_int8_model(), root / "simple_int8" / "1" / "model.onnx")
    (root / "simple_int8" / "config.pbtxt").write_text(
        SIMPLE_CONFIG.replace('"simple"', '"simple_int8"').replace("TYPE_INT32", "TYPE_INT8")
    )
    save(
        identity_model(TensorProto.STRING, ["batch", "n"]),
        root / "simple_identity" / "1" / "model.onnx",
    )
    (root / "simple_identity" / "config.pbtxt").write_text(
        'name: "simple_identity"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
        'input [ { name: "INPUT0", data_type: TYPE_STRING, dims: [ -1 ] } ]\n'
        'output [ { name: "OUTPUT0", data_type: TYPE_STRING, dims: [ -1 ] } ]\n'
    )
    for model_name, light, output in (
        ("densenet_onnx", "light_densenet121", "fc6_1"),
        ("squeezenet_onnx", "light_squeezenet", "softmaxout_1"),
    ):
        save(light_model(light), root / model_name / "1" / "model.onnx")
        (root / model_name / "config.pbtxt").write_text(
            DENSENET_CONFIG
            if model_name == "densenet_onnx"
            else IMAGE_CONFIG.format(name=model_name, output=output, batching=SQUEEZENET_BATCHING)
        )
        # The onnx wheel's models carry no class names; number the 1000 ImageNet classes.
        (root / model_name / "labels.txt").write_text(
            "".join(f"class_{i:03d}\n" for i in range(1000))
        )
    (root / "densenet_preprocess" / "1").mkdir(parents=True, exist_ok=True)
    (root / "densenet_preprocess" / "1" / "model.py").write_text(PREPROCESS_MODEL)
    (root / "densenet_preprocess" / "config.pbtxt").write_text(PREPROCESS_CONFIG)
    save(
        identity_model(TensorProto.FLOAT, ["batch", 4]), root / "identity_fp32" / "1" / "model.onnx"
    )
    write_client_example_models(root)
    return root


def write_client_example_models(root: Path) -> None:
    """The models Triton's client examples call that the models above do not cover."""
    for name, dyna, strategy, count in (
        ("simple_sequence", False, "direct { }", 1),
        ("simple_dyna_sequence", True, "oldest { max_candidate_sequences: 1024 }", 2),
    ):
        save(sequence_model(dyna), root / name / "1" / "model.onnx")
        (root / name / "config.pbtxt").write_text(
            SEQUENCE_CONFIG.format(
                name=name,
                strategy=strategy + " max_sequence_idle_microseconds: 10000000",
                controls=DYNA_CONTROLS if dyna else "",
                count=count,
            )
        )
    save(
        identity_model(TensorProto.INT32, ["batch", "n"]),
        root / "custom_identity_int32" / "1" / "model.onnx",
    )
    (root / "custom_identity_int32" / "config.pbtxt").write_text(
        'name: "custom_identity_int32"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
        'input [ { name: "INPUT0", data_type: TYPE_INT32, dims: [ -1 ] } ]\n'
        'output [ { name: "OUTPUT0", data_type: TYPE_INT32, dims: [ -1 ] } ]\n'
    )
    for name, source, config in (
        ("repeat_int32", REPEAT_MODEL, REPEAT_CONFIG),
        ("image_preprocess", IMAGE_PREPROCESS_MODEL, IMAGE_PREPROCESS_CONFIG),
    ):
        (root / name / "1").mkdir(parents=True, exist_ok=True)
        (root / name / "1" / "model.py").write_text(source)
        (root / name / "config.pbtxt").write_text(config)
    (root / "preprocess_inception_ensemble" / "1").mkdir(parents=True, exist_ok=True)
    (root / "preprocess_inception_ensemble" / "config.pbtxt").write_text(IMAGE_ENSEMBLE_CONFIG)


def main(argv: list[str]) -> int:
    default = Path(__file__).parent / "models"
    parser = argparse.ArgumentParser(
        prog="python -m configs.generate",
        description="Build the bundled example model repository (ONNX models written from code, "
        "Python models, their config.pbtxt files).",
    )
    parser.add_argument(
        "output",
        nargs="?",
        type=Path,
        default=default,
        metavar="OUTPUT_DIR",
        help="where the repository is written (default: configs/models beside this file)",
    )
    root = parser.parse_args(argv).output
    write_repository(root)
    print(f"example model repository written to {root}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
