"""FIL-style model settings: model types, default file names, parameters, the conversion cache.

Imports nothing but the standard library: the server reads default file names from here while
the tree libraries stay unimported until a FIL model is actually loaded.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from edge_backends.api import ModelLoadError

INPUT = "input__0"
OUTPUT = "output__0"
# model_type -> (file family, Triton FIL's default file name). "onnx" is this server's own
# addition: a forest already exported to ONNX-ML (e.g. by skl2onnx) behind the FIL interface.
MODEL_TYPES: dict[str, tuple[str, str]] = {
    "xgboost": ("xgboost", "xgboost.model"),
    "xgboost_json": ("xgboost", "xgboost.json"),
    "xgboost_ubj": ("xgboost", "xgboost.ubj"),
    "lightgbm": ("lightgbm", "model.txt"),
    "onnx": ("onnx", "model.onnx"),
}
UNSUPPORTED_TYPES: dict[str, tuple[str, str]] = {
    "treelite_checkpoint": (
        "checkpoint.tl",
        "Treelite checkpoints are tied to Treelite's version and this server does not read "
        "them; export a scikit-learn forest with skl2onnx and use model_type 'onnx' "
        "(docs/model-formats.md)",
    ),
}
DEFAULT_MODEL_TYPE = "xgboost"  # Triton FIL's default
FAMILY_NAMES = {"xgboost": "XGBoost", "lightgbm": "LightGBM", "onnx": "ONNX"}
INSTALL_HINT = "install edge-appliance[trees]"


def default_filename(model_type: str) -> str:
    """The file a version folder holds for `model_type` when config.pbtxt names none."""
    model_type = model_type or DEFAULT_MODEL_TYPE
    if model_type in MODEL_TYPES:
        return MODEL_TYPES[model_type][1]
    if model_type in UNSUPPORTED_TYPES:
        return UNSUPPORTED_TYPES[model_type][0]
    return MODEL_TYPES[DEFAULT_MODEL_TYPE][1]  # an unknown type fails later, with its name


@dataclass(frozen=True)
class FilOptions:
    """The FIL parameters this server acts on (GPU tuning ones such as `algo` are ignored)."""

    model_type: str = DEFAULT_MODEL_TYPE
    output_class: bool = False
    predict_proba: bool = False
    threshold: float = 0.5

    @property
    def family(self) -> str:
        return MODEL_TYPES[self.model_type][0]


def _bool(parameters: Mapping[str, str], key: str, default: bool) -> bool:
    raw = parameters.get(key, "").strip().lower()
    if not raw:
        return default
    if raw in ("true", "1", "yes", "on"):
        return True
    if raw in ("false", "0", "no", "off"):
        return False
    raise ModelLoadError(f"parameter '{key}' must be true or false, got '{parameters[key]}'")


def parse_options(parameters: Mapping[str, str]) -> FilOptions:
    """FilOptions from config `parameters` (string values, as Triton passes them)."""
    model_type = parameters.get("model_type", "").strip() or DEFAULT_MODEL_TYPE
    if model_type in UNSUPPORTED_TYPES:
        raise ModelLoadError(
            f"model_type '{model_type}' is not supported: {UNSUPPORTED_TYPES[model_type][1]}"
        )
    if model_type not in MODEL_TYPES:
        raise ModelLoadError(
            f"unknown model_type '{model_type}'; expected one of {', '.join(MODEL_TYPES)}"
        )
    # Newer FIL releases call output_class `is_classifier`; either is accepted.
    key = "is_classifier" if "is_classifier" in parameters else "output_class"
    raw_threshold = parameters.get("threshold", "").strip()
    try:
        threshold = float(raw_threshold) if raw_threshold else 0.5
    except ValueError:
        raise ModelLoadError(
            f"parameter 'threshold' must be a number, got '{raw_threshold}'"
        ) from None
    return FilOptions(
        model_type=model_type,
        output_class=_bool(parameters, key, False),
        predict_proba=_bool(parameters, "predict_proba", False),
        threshold=threshold,
    )


def sniff_family(head: bytes, suffix: str) -> str | None:
    """Which library wrote a model file, from its first bytes (None when unrecognised)."""
    text = head.lstrip()
    if text.startswith(b"{"):  # XGBoost JSON ('{"') or UBJSON ('{' then a type marker)
        rest = text[1:].lstrip()
        if rest[:1] in (b'"', b"}") or rest[:1] in (b"L", b"l", b"i", b"I", b"U", b"$", b"#"):
            return "xgboost"
    if head.startswith((b"tree\n", b"tree\r\n")):
        return "lightgbm"
    if head[:1] == b"\x08" and suffix == ".onnx":  # ModelProto starts with ir_version (field 1)
        return "onnx"
    if suffix in (".model", ".bin", ".deprecated"):  # XGBoost's legacy binary has no magic
        return "xgboost"
    return None


def cache_root(env: Mapping[str, str] | None = None) -> Path:
    """Where converted models are kept: the first usable of $EDGE_APPLIANCE_FIL_CACHE,
    $STATE_DIRECTORY/fil-cache (systemd), the user's cache folder, a private temp folder.

    Not beside the model: the poller fingerprints every file of a model folder and signed
    manifests refuse unlisted files in a version folder, so a cache there would trigger a reload
    or fail the version."""
    env = os.environ if env is None else env
    candidates = []
    if env.get("EDGE_APPLIANCE_FIL_CACHE"):
        candidates.append(Path(env["EDGE_APPLIANCE_FIL_CACHE"]))
    state = env.get("STATE_DIRECTORY", "").split(":")[0]
    if state:
        candidates.append(Path(state) / "fil-cache")
    xdg = env.get("XDG_CACHE_HOME") or (str(Path.home() / ".cache") if env.get("HOME") else "")
    if xdg:
        candidates.append(Path(xdg) / "edge-appliance" / "fil")
    for folder in candidates:
        try:
            folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError:
            continue
        if os.access(folder, os.W_OK | os.X_OK):
            return folder
    folder = Path(tempfile.gettempdir()) / f"edge-appliance-fil-{os.getuid()}"
    folder.mkdir(exist_ok=True, mode=0o700)
    if folder.stat().st_uid != os.getuid():  # a shared /tmp: never trust another user's folder
        raise ModelLoadError(f"cache folder '{folder}' belongs to another user")
    return folder
