"""Backend lookup by config `platform` / `backend` name; backends are imported lazily."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Mapping

from edge_backends.api import Backend, ModelLoadError

# backend name -> (module, class); platform names map onto backend names below.
_BACKENDS: dict[str, tuple[str, str]] = {
    "onnxruntime": ("edge_backends.ort", "OrtBackend"),
    "python": ("edge_backends.python.backend", "PythonBackend"),
    "tensorrt": ("edge_backends.trt", "TensorRTBackend"),
    "fil": ("edge_backends.fil", "FilBackend"),
    "openvino": ("edge_backends.openvino_backend", "OpenVinoBackend"),
    "pytorch": ("edge_backends.torch_backend", "TorchBackend"),
    "identity": ("edge_backends.identity", "IdentityBackend"),
}
PLATFORM_TO_BACKEND: dict[str, str] = {
    "onnxruntime_onnx": "onnxruntime",
    "tensorrt_plan": "tensorrt",
    "pytorch_libtorch": "pytorch",
}
BACKEND_TO_PLATFORM: dict[str, str] = {v: k for k, v in PLATFORM_TO_BACKEND.items()}
# The file a version folder holds when config.pbtxt does not name one.
DEFAULT_MODEL_FILENAME: dict[str, str] = {
    "onnxruntime": "model.onnx",
    "python": "model.py",
    "tensorrt": "model.plan",
    "fil": "xgboost.model",  # Triton's FIL default; model_type picks others
    "openvino": "model.xml",
    "pytorch": "model.pt",
}

_loaded: dict[str, Backend] = {}


def default_model_filename(backend: str, parameters: Mapping[str, str]) -> str:
    """The file a version folder holds when config.pbtxt names none ('' when unknown)."""
    if backend == "fil" and "model_type" in parameters:  # FIL's file follows its model_type
        from edge_backends.fil_params import default_filename  # standard library only

        return default_filename(parameters["model_type"])
    return DEFAULT_MODEL_FILENAME.get(backend, "")


def backend_name(platform: str, backend: str) -> str:
    """The backend that serves a config's platform / backend pair ('' when neither is known)."""
    if backend:
        return backend
    return PLATFORM_TO_BACKEND.get(platform, "")


def known_backends() -> list[str]:
    return sorted(_BACKENDS)


def backend_module(name: str) -> str:
    """The module that implements backend `name` (for version reports; KeyError if unknown)."""
    return _BACKENDS[name][0]


def get_backend(name: str) -> Backend:
    """The backend called `name`, imported on first use."""
    if name in _loaded:
        return _loaded[name]
    try:
        module_name, class_name = _BACKENDS[name]
    except KeyError:
        raise ModelLoadError(
            f"unknown backend '{name}'; this server has: {', '.join(known_backends())}"
        ) from None
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        missing = (exc.name or "").partition(".")[0]
        if missing in _EXTRA_OF:
            raise ModelLoadError(
                f"backend '{name}' needs {missing}, which is not installed: {_how_to_get(missing)}"
            ) from exc
        raise ModelLoadError(f"backend '{name}' is not available: {exc}") from exc
    backend: Backend = getattr(module, class_name)()
    _loaded[name] = backend
    return backend


# The optional libraries of backends -> the extra that installs them (pyproject.toml). The
# one-file binary leaves torch and openvino out (build/edge-appliance.spec).
_EXTRA_OF = {"torch": "torch", "openvino": "openvino", "tensorrt": "gpu", "pycuda": "gpu"}


def _how_to_get(module: str) -> str:
    pip = f"pip install 'edge-appliance[{_EXTRA_OF[module]}]'"
    if getattr(sys, "frozen", False):
        return f"this binary does not include {module}; a Python install has it ({pip})"
    return pip
