"""TensorFlow models are not run here: what to do instead, in one place.

The server's load error (runtime/autocomplete.py) and `edge-appliance check` both use
`tensorflow_advice`, so the two say the same thing: convert with tf2onnx, then serve the ONNX
file with ONNX Runtime.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from appliance.common.protocol import ModelConfig

SAVEDMODEL = "tensorflow_savedmodel"
GRAPHDEF = "tensorflow_graphdef"
# Triton's default file names for the two TensorFlow platforms.
DEFAULT_FILES = {SAVEDMODEL: "model.savedmodel", GRAPHDEF: "model.graphdef"}
OPSET = 17


@dataclass(frozen=True)
class TensorflowAdvice:
    """How to turn one TensorFlow model folder into an ONNX model this server runs."""

    model: str
    platform: str  # SAVEDMODEL or GRAPHDEF
    command: str  # the tf2onnx command line for the newest version
    config_change: str

    @property
    def kind(self) -> str:
        return "SavedModel" if self.platform == SAVEDMODEL else "GraphDef"

    def message(self) -> str:
        """One line, for the load error and the repository index."""
        return (
            f"model '{self.model}' is a TensorFlow {self.kind} ({self.platform}), which "
            f"edge-appliance does not run; convert it to ONNX (pip install tf2onnx tensorflow): "
            f"{self.command} ; then {self.config_change}"
        )


def _platform_of(config: ModelConfig, model_dir: Path, versions: list[int]) -> str:
    if config.platform in DEFAULT_FILES:
        return str(config.platform)
    named = config.default_model_filename
    if config.backend == "tensorflow" or not (config.platform or config.backend):
        for platform, default in DEFAULT_FILES.items():
            wanted = named or default
            if any((model_dir / str(v) / wanted).exists() for v in versions):
                return platform
        if config.backend == "tensorflow":  # no file found: a directory means SavedModel
            return SAVEDMODEL if not named or not Path(named).suffix else GRAPHDEF
    return ""


def tensorflow_advice(
    config: ModelConfig, model_dir: Path, versions: list[int]
) -> TensorflowAdvice | None:
    """The advice when the config or the version folders make this a TensorFlow model.

    A folder with no platform or backend counts as TensorFlow only by its files; the caller
    asks only once no file of a supported format was found.
    """
    platform = _platform_of(config, model_dir, versions)
    if not platform:
        return None
    name = config.name or model_dir.name
    filename = config.default_model_filename or DEFAULT_FILES[platform]
    version = str(max(versions)) if versions else "1"
    source = model_dir / version / filename
    target = model_dir / version / "model.onnx"
    if platform == SAVEDMODEL:
        command = f"python -m tf2onnx.convert --saved-model {source}"
    else:  # a frozen graph needs its tensors named: the config's, ':0' added, then renamed
        inputs = [i.name for i in config.input] or ["INPUT_NAME"]
        outputs = [o.name for o in config.output] or ["OUTPUT_NAME"]
        command = (
            f"python -m tf2onnx.convert --graphdef {source} "
            f"--inputs {','.join(n + ':0' for n in inputs)} "
            f"--outputs {','.join(n + ':0' for n in outputs)} "
            f"--rename-inputs {','.join(inputs)} --rename-outputs {','.join(outputs)}"
        )
    command += f" --output {target} --opset {OPSET}"
    config_file = model_dir / "config.pbtxt"
    if config.platform or config.backend:
        change = f'set platform: "onnxruntime_onnx" in {config_file}'
        if config.backend:
            change += " and remove its backend line"
        if config.default_model_filename:
            change += " and remove default_model_filename"
    elif config.default_model_filename:
        change = f"remove default_model_filename from {config_file}"
    else:
        change = "nothing else: the server finds model.onnx by its name"
    change += " (repeat the conversion for each version folder)" if len(versions) > 1 else ""
    return TensorflowAdvice(name, platform, command, change)
