"""Tree models served as Triton's FIL backend serves them, run by ONNX Runtime.

Config: `backend: "fil"`, input `input__0` FP32 [features], output `output__0` FP32, and
parameters `model_type` (xgboost, xgboost_json, xgboost_ubj, lightgbm, or onnx for a forest
already exported to ONNX-ML), `output_class`, `predict_proba` and `threshold`:

- `output_class: false` (a regressor): output__0 is [1], the prediction (for a binary
  classifier, the probability of class 1).
- `output_class: true`: output__0 is [1], the class id as FP32; a binary model says 1 when
  P(class 1) > threshold (0.5 unless set), a multi-class one the most likely class.
- `predict_proba: true`: output__0 is [classes], one probability per class (2 for binary).

Boosters are converted once to ONNX-ML (edge_backends/fil_convert.py) and cached; instances are
ONNX Runtime sessions (edge_backends/ort.py), so `intra_op_thread_count` and friends apply.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from edge_backends.api import (
    Arrays,
    BackendBase,
    InstanceBase,
    InstanceSpec,
    ModelLoadError,
    ModelSignature,
    TensorSpec,
)
from edge_backends.fil_convert import TreeModel, describe_onnx, load_tree_model
from edge_backends.fil_params import (
    FAMILY_NAMES,
    INPUT,
    MODEL_TYPES,
    OUTPUT,
    FilOptions,
    cache_root,
    parse_options,
    sniff_family,
)
from edge_backends.ort import OrtBackend, OrtInstance

_REMEMBERED = 64  # model files whose description is kept in memory


def output_width(model: TreeModel, options: FilOptions) -> int:
    """How many values output__0 holds per row for this model and these parameters."""
    what = f"{model.description} model"
    if model.kind == "regressor":
        if options.output_class or options.predict_proba:
            raise ModelLoadError(
                f"{what} is a regressor: set output_class and predict_proba to false"
            )
        return 1
    if options.predict_proba:
        return model.num_classes
    if not options.output_class and model.num_classes > 2:
        raise ModelLoadError(
            f"{what} has {model.num_classes} classes: set output_class true for class ids, "
            "and predict_proba true for probabilities"
        )
    return 1


def check_type(model: TreeModel, options: FilOptions, path: Path) -> None:
    """The file must be what model_type says (XGBoost's JSON, UBJSON and binary are one family:
    XGBoost reads each, and recent XGBoost writes UBJSON to 'xgboost.model')."""
    if model.family != options.family:
        suggested = [t for t, (family, _) in MODEL_TYPES.items() if family == model.family]
        raise ModelLoadError(
            f"model_type '{options.model_type}' expects a {FAMILY_NAMES[options.family]} model "
            f"but '{path}' holds a model written by {FAMILY_NAMES[model.family]}; set "
            f"model_type to {' or '.join(repr(t) for t in suggested)}"
        )


def _parameters(config: dict[str, Any]) -> dict[str, str]:
    return {k: str(v.get("string_value", "")) for k, v in config.get("parameters", {}).items()}


class FilInstance(InstanceBase):
    """One ONNX Runtime session and the FIL output rules."""

    def __init__(self, session: OrtInstance, model: TreeModel, options: FilOptions) -> None:
        self._session = session
        self.placement = session.placement  # the forest runs where its session does
        self._model = model
        self._options = options

    def execute(
        self, inputs: Arrays, output_names: Sequence[str]
    ) -> dict[str, np.ndarray[Any, Any]]:
        model, options = self._model, self._options
        rows = np.asarray(inputs[INPUT], dtype=np.float32)
        rows = rows.reshape(-1, model.num_features)
        raw = self._session.execute({model.input_name: rows}, [model.output_name])
        values = raw[model.output_name].reshape(len(rows), -1)
        if model.kind == "regressor" or options.predict_proba:
            out = values
        elif not options.output_class:  # binary classifier read as a regressor: P(class 1)
            out = values[:, 1:2]
        elif model.num_classes == 2:
            out = (values[:, 1:2] > options.threshold).astype(np.float32)
        else:
            out = np.argmax(values, axis=1).astype(np.float32).reshape(-1, 1)
        return {OUTPUT: np.ascontiguousarray(out, dtype=np.float32)}

    def close(self) -> None:
        self._session.close()


class FilBackend(BackendBase):
    """XGBoost / LightGBM / ONNX-ML forests behind Triton FIL's config and tensors."""

    name = "fil"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._models: OrderedDict[tuple[str, int, int, int], TreeModel] = OrderedDict()

    def model(self, path: Path) -> TreeModel:
        """The model file as ONNX-ML, converted at most once (per process, then per cache)."""
        try:
            stat = path.stat()
        except OSError as exc:
            raise ModelLoadError(f"model file '{path}' cannot be read: {exc.strerror}") from None
        key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns, stat.st_ino)
        with self._lock:
            if key in self._models:
                return self._models[key]
        with open(path, "rb") as f:
            head = f.read(64)
        family = sniff_family(head, path.suffix)
        if family is None:
            raise ModelLoadError(
                f"'{path}' is not a model this backend reads (XGBoost JSON, UBJSON or binary, "
                f"LightGBM text, ONNX); it starts with {head[:16]!r}"
            )
        if family == "onnx":
            model = describe_onnx(path, "onnx", "ONNX")
        else:
            model = load_tree_model(path, family, cache_root())
        with self._lock:
            self._models[key] = model
            while len(self._models) > _REMEMBERED:
                self._models.popitem(last=False)
        return model

    def inspect(self, model_path: Path) -> ModelSignature:
        # The output width depends on parameters the signature cannot see: auto_complete and
        # create_instance check it.
        model = self.model(model_path)
        return ModelSignature(
            inputs=(TensorSpec(INPUT, "FP32", (-1, model.num_features)),),
            outputs=(TensorSpec(OUTPUT, "FP32", (-1, -1)),),
        )

    def auto_complete(
        self, model_path: Path, config: dict[str, Any], default_max_batch_size: int
    ) -> dict[str, Any]:
        """Fill input__0 / output__0 from the model and the FIL parameters; a config without
        tensors or max_batch_size gets the server's default (a forest batches any rows)."""
        options = parse_options(_parameters(config))
        model = self.model(model_path)
        check_type(model, options, model_path)
        width = output_width(model, options)
        inputs, outputs = config.setdefault("input", []), config.setdefault("output", [])
        if not inputs and not outputs and not config.get("max_batch_size"):
            config["max_batch_size"] = default_max_batch_size
            if default_max_batch_size > 1 and "sequence_batching" not in config:
                config.setdefault("dynamic_batching", {})
        batch = [] if config.get("max_batch_size") else [-1]
        if not inputs:
            inputs.append({"name": INPUT})
        if not outputs:
            outputs.append({"name": OUTPUT})
        for entries, dims in ((inputs, [*batch, model.num_features]), (outputs, [*batch, width])):
            for entry in entries:
                if entry.get("data_type", "TYPE_INVALID") == "TYPE_INVALID":
                    entry["data_type"] = "TYPE_FP32"
                if not entry.get("dims") and "reshape" not in entry:
                    entry["dims"] = dims
        _check_output_dims(config, width, model)
        return config

    def gpu_problem(self) -> str:
        return "tree models run on CPU here (ONNX Runtime); FIL's GPU kernels are not included"

    def create_instance(self, spec: InstanceSpec) -> FilInstance:
        options = parse_options(spec.parameters)
        model = self.model(spec.model_path)
        check_type(model, options, spec.model_path)
        width = output_width(model, options)
        if spec.model_config is not None:
            _check_output_dims(dict(spec.model_config), width, model)
        session = OrtBackend().create_instance(replace(spec, model_path=model.onnx_path))
        return FilInstance(session, model, options)


def _check_output_dims(config: dict[str, Any], width: int, model: TreeModel) -> None:
    """output__0's last dimension must be what the parameters make the model return."""
    for entry in config.get("output", []):
        dims = [int(d) for d in entry.get("dims", [])]
        if entry.get("name") == OUTPUT and dims and dims[-1] not in (-1, width):
            raise ModelLoadError(
                f"output '{OUTPUT}' dims {dims} do not match what the {model.description} "
                f"model returns with these parameters: [{width}] per row"
                + (f" ({model.num_classes} classes)" if model.kind == "classifier" else "")
            )
