"""XGBoost / LightGBM boosters to ONNX-ML, once per model file, checked and cached on disk.

The cache key is the model file's sha256 with the versions of the libraries that read and
convert it, so a second load (or a restart) opens the cached .onnx without importing XGBoost,
LightGBM or onnxmltools at all. Each conversion is checked against the library's own
predictions on probe rows before it is cached: a converter that mishandles an objective fails
the load instead of serving wrong answers.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import json
import logging
import os
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from edge_backends.api import BackendError, InstanceSpec, ModelLoadError, ModelSignature
from edge_backends.fil_params import FAMILY_NAMES, INSTALL_HINT
from edge_backends.ort import OrtBackend

log = logging.getLogger(__name__)

FORMAT = 1  # bump when the conversion or the cached metadata changes
# family -> (module, distributions that provide it)
_LIBRARIES = {
    "xgboost": ("xgboost", ("xgboost", "xgboost-cpu")),
    "lightgbm": ("lightgbm", ("lightgbm",)),
}
_CONVERTER = ("onnxmltools", ("onnxmltools",))
_locks: dict[str, threading.Lock] = {}  # conversion key -> its lock (a few per process)
_locks_guard = threading.Lock()


@dataclass(frozen=True)
class TreeModel:
    """A forest as ONNX-ML, with what the FIL interface needs to know about it."""

    family: str  # xgboost | lightgbm | onnx
    description: str  # e.g. "XGBoost binary:logistic"
    kind: str  # classifier | regressor
    num_features: int
    num_classes: int  # 0 for a regressor
    onnx_path: Path
    input_name: str
    output_name: str  # the probabilities (classifier) or the prediction (regressor)


def require(module: str, family: str) -> ModuleType:
    """Import a library a model needs, or fail the load saying what to install."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ModelLoadError(
            f"{FAMILY_NAMES.get(family, family)} models need the Python package '{module}', "
            f"which cannot be imported ({exc}); {INSTALL_HINT}"
        ) from exc


def _version(module: str, dists: tuple[str, ...], family: str) -> str:
    for dist in dists:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    # No metadata (a frozen build, or not installed): the module itself decides.
    return str(getattr(require(module, family), "__version__", "unknown"))


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _library_message(exc: Exception) -> str:
    """A library error without XGBoost's '[time] file:line:' prefix and C++ stack trace."""
    text = str(exc).split("Stack trace:")[0].strip()
    if text.startswith("[") and "] " in text:
        text = text.split("] ", 1)[1]
        head, sep, rest = text.partition(": ")
        if sep and ("/" in head or ".cc" in head):
            text = rest
    return " ".join(text.split())


def load_tree_model(path: Path, family: str, cache: Path) -> TreeModel:
    """The model at `path` as ONNX-ML: from the cache, else converted, checked and cached."""
    module, dists = _LIBRARIES[family]
    versions = (
        f"format={FORMAT} {module}={_version(module, dists, family)} "
        f"onnxmltools={_version(*_CONVERTER, family)} onnx={_version('onnx', ('onnx',), family)}"
    )
    source_sha = sha256_file(path)
    key = hashlib.sha256(f"{source_sha} {family} {versions}".encode()).hexdigest()[:40]
    entry, onnx_file = cache / f"{key}.json", cache / f"{key}.onnx"
    with _lock_for(key):  # versions or models sharing a file convert it once
        cached = _read_entry(entry, onnx_file)
        if cached is not None:
            log.info("model file '%s': reusing its ONNX conversion '%s'", path, onnx_file)
            return cached
        return _convert(path, family, cache, key, source_sha)


def _lock_for(key: str) -> threading.Lock:
    with _locks_guard:
        return _locks.setdefault(key, threading.Lock())


def _convert(path: Path, family: str, cache: Path, key: str, source_sha: str) -> TreeModel:
    entry, onnx_file = cache / f"{key}.json", cache / f"{key}.onnx"
    start = time.monotonic()
    data = path.read_bytes()
    if family == "xgboost":
        booster, description, onnx_bytes = _convert_xgboost(path, data)
    else:
        booster, description, onnx_bytes = _convert_lightgbm(path, data)
    partial = cache / f".{key}.{os.getpid()}.{threading.get_ident()}.onnx"
    _write(partial, onnx_bytes)
    try:
        model = describe_onnx(partial, family, description)
        _check(model, partial, booster, family, path)
        os.replace(partial, onnx_file)
    finally:
        partial.unlink(missing_ok=True)
    model = TreeModel(**{**asdict(model), "onnx_path": onnx_file})
    record = {**asdict(model), "onnx_path": onnx_file.name, "source": str(path)}
    record.update(source_sha256=source_sha, onnx_sha256=hashlib.sha256(onnx_bytes).hexdigest())
    _write(entry, json.dumps(record, indent=1).encode())
    log.info(
        "model file '%s' (%s): converted to ONNX in %.2f s, cached as '%s'",
        path,
        description,
        time.monotonic() - start,
        onnx_file,
    )
    return model


def _write(path: Path, data: bytes) -> None:
    """Write whole or not at all: a power cut mid-write leaves no half file under the name."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _read_entry(entry: Path, onnx_file: Path) -> TreeModel | None:
    if not entry.is_file():
        return None
    try:
        record = json.loads(entry.read_text(encoding="utf-8"))
        if hashlib.sha256(onnx_file.read_bytes()).hexdigest() != record["onnx_sha256"]:
            raise ValueError("the .onnx file does not match its recorded sha256")
        return TreeModel(
            family=record["family"],
            description=record["description"],
            kind=record["kind"],
            num_features=int(record["num_features"]),
            num_classes=int(record["num_classes"]),
            onnx_path=onnx_file,
            input_name=record["input_name"],
            output_name=record["output_name"],
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("cached conversion '%s' is unusable (%s); converting again", entry, exc)
        return None


def _initial_types(num_features: int, family: str) -> list[tuple[str, Any]]:
    require("onnxmltools", family)
    types = importlib.import_module("onnxmltools.convert.common.data_types")
    return [("input__0", types.FloatTensorType([None, num_features]))]


def _convert_xgboost(path: Path, data: bytes) -> tuple[Any, str, bytes]:
    xgb = require("xgboost", "xgboost")
    onnxmltools = require("onnxmltools", "xgboost")
    booster = xgb.Booster()
    try:
        booster.load_model(bytearray(data))  # from bytes, XGBoost tells JSON/UBJSON/binary apart
    except (xgb.core.XGBoostError, ValueError) as exc:
        raise ModelLoadError(
            f"cannot read XGBoost model '{path}': {_library_message(exc)}"
        ) from None
    objective = json.loads(booster.save_config())["learner"]["objective"]["name"]
    description = f"XGBoost {objective}"
    booster.feature_names = None  # the converter parses tree dumps that must say f0, f1, ...
    try:
        onnx_model = onnxmltools.convert_xgboost(
            booster, initial_types=_initial_types(booster.num_features(), "xgboost")
        )
    except Exception as exc:  # converters raise anything from RuntimeError to KeyError
        raise ModelLoadError(
            f"cannot convert '{path}' ({description}) to ONNX: {type(exc).__name__}: {exc}"
        ) from exc
    return booster, description, onnx_model.SerializeToString()


def _convert_lightgbm(path: Path, data: bytes) -> tuple[Any, str, bytes]:
    lgb = require("lightgbm", "lightgbm")
    onnxmltools = require("onnxmltools", "lightgbm")
    try:
        booster = lgb.Booster(model_str=data.decode("utf-8"))
    except (lgb.basic.LightGBMError, UnicodeDecodeError) as exc:
        raise ModelLoadError(
            f"cannot read LightGBM model '{path}': {_library_message(exc)}"
        ) from None
    description = f"LightGBM {booster.params.get('objective', 'model')}"
    try:
        onnx_model = onnxmltools.convert_lightgbm(
            booster, initial_types=_initial_types(booster.num_feature(), "lightgbm"), zipmap=False
        )
    except Exception as exc:  # converters raise anything from RuntimeError to KeyError
        raise ModelLoadError(
            f"cannot convert '{path}' ({description}) to ONNX: {type(exc).__name__}: {exc}"
        ) from exc
    return booster, description, onnx_model.SerializeToString()


def _probe_instance(path: Path) -> Any:
    spec = InstanceSpec(
        model_name="fil-probe",
        model_version=0,
        model_path=path,
        instance_name="probe",
        parameters={"intra_op_thread_count": "1"},
    )
    return OrtBackend().create_instance(spec)


def describe_onnx(path: Path, family: str, description: str) -> TreeModel:
    """Which input takes the features and which output holds the probabilities / prediction."""
    try:
        signature: ModelSignature = OrtBackend().inspect(path)
    except BackendError as exc:
        hint = ""
        if "seq(map" in str(exc):
            hint = "; export classifiers without ZipMap (skl2onnx: options={'zipmap': False})"
        raise ModelLoadError(f"{exc}{hint}") from None
    if len(signature.inputs) != 1:
        names = [t.name for t in signature.inputs]
        raise ModelLoadError(f"'{path}' has inputs {names}; a forest takes one feature matrix")
    feature = signature.inputs[0]
    if feature.datatype != "FP32" or len(feature.shape) != 2 or feature.shape[1] < 1:
        raise ModelLoadError(
            f"'{path}' input '{feature.name}' is {feature.datatype} {list(feature.shape)}; "
            "FIL-style models take FP32 [batch, features] with the feature count fixed"
        )
    floats = [t for t in signature.outputs if t.datatype == "FP32"]
    labels = [t for t in signature.outputs if t.datatype == "INT64"]
    if not floats:
        raise ModelLoadError(f"'{path}' has no FP32 output (probabilities or predictions)")
    chosen = floats[0]
    kind, classes = ("classifier", chosen.shape[-1]) if labels else ("regressor", 0)
    if kind == "classifier" and classes < 1:  # not fixed in the graph: one row tells
        rows = np.zeros((1, feature.shape[1]), np.float32)
        instance = _probe_instance(path)
        try:
            out = instance.execute({feature.name: rows}, [chosen.name])[chosen.name]
        finally:
            instance.close()
        classes = int(out.shape[-1])
    return TreeModel(
        family=family,
        description=description,
        kind=kind,
        num_features=feature.shape[1],
        num_classes=classes,
        onnx_path=path,
        input_name=feature.name,
        output_name=chosen.name,
    )


def probe_rows(num_features: int) -> np.ndarray[Any, Any]:
    """Rows at several scales, some with missing values (NaN), to compare predictions on."""
    rng = np.random.default_rng(1234)
    parts = [np.zeros((1, num_features)), rng.uniform(0, 1, (32, num_features))]
    parts += [rng.normal(scale=s, size=(32, num_features)) for s in (1, 10, 1000)]
    missing = rng.normal(size=(16, num_features))
    missing[rng.random(missing.shape) < 0.3] = np.nan
    return np.concatenate([*parts, missing]).astype(np.float32)


def _check(model: TreeModel, onnx_path: Path, booster: Any, family: str, source: Path) -> None:
    rows = probe_rows(model.num_features)
    if family == "xgboost":
        xgb = require("xgboost", family)
        expected = booster.predict(xgb.DMatrix(rows, missing=np.nan))
    else:
        expected = booster.predict(rows)
    instance = _probe_instance(onnx_path)
    try:
        got = instance.execute({model.input_name: rows}, [model.output_name])[model.output_name]
    finally:
        instance.close()
    expected = np.asarray(expected, dtype=np.float64)
    got = np.asarray(got, dtype=np.float64).reshape(len(rows), -1)
    if model.kind == "regressor" or expected.ndim == 2:
        got = got.reshape(expected.shape)
    elif model.num_classes == 2:  # the library gives P(class 1) alone
        got = got[:, 1]
    else:  # multi:softmax gives class ids
        got = np.argmax(got, axis=1).astype(np.float64)
    if got.shape != expected.shape or not np.allclose(got, expected, rtol=1e-3, atol=1e-4):
        worst = float(np.max(np.abs(got - expected))) if got.shape == expected.shape else np.inf
        raise ModelLoadError(
            f"the ONNX conversion of '{source}' ({model.description}) disagrees with "
            f"{FAMILY_NAMES[family]} on probe rows (largest difference {worst:.3g}); "
            "this model cannot be served faithfully"
        )
