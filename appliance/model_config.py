"""config.pbtxt <-> Triton's ModelConfig protobuf: reading, auto-complete and validation.

Errors name the file and the field, e.g.
`models/simple/config.pbtxt: input 'INPUT0': dims must be positive or -1, got [0, 16]`.
"""

from __future__ import annotations

from pathlib import Path

from google.protobuf import text_format

from appliance.errors import ConfigError
from appliance.protocol import ModelConfig as ModelConfig
from appliance.protocol import model_config_pb2 as mc
from appliance.tf_advice import tensorflow_advice
from edge_backends.api import ModelSignature, TensorSpec
from edge_backends.datatypes import BY_CONFIG, BY_TRITON
from edge_backends.registry import (
    BACKEND_TO_PLATFORM,
    DEFAULT_MODEL_FILENAME,
    backend_name,
    default_model_filename,
)

CONFIG_FILENAME = "config.pbtxt"
ENSEMBLE = "ensemble"
# Triton's auto-complete default for models whose first dimension is dynamic.
DEFAULT_MAX_BATCH_SIZE = 4


def read_config(model_dir: Path) -> tuple[ModelConfig, bool]:
    """Parse `model_dir/config.pbtxt`; an absent file gives an empty config and False."""
    path = model_dir / CONFIG_FILENAME
    config = mc.ModelConfig()
    if not path.is_file():
        return config, False
    try:
        text_format.Parse(path.read_text(encoding="utf-8"), config)
    except (text_format.ParseError, ValueError) as exc:  # also bad UTF-8, numbers out of range
        raise ConfigError(f"{path}: {exc}") from exc
    return config, True


def parse_config_text(text: str, origin: str) -> ModelConfig:
    """Parse config text given inline (JSON overrides are handled by the caller)."""
    config = mc.ModelConfig()
    try:
        text_format.Parse(text, config)
    except (text_format.ParseError, ValueError) as exc:  # ValueError: numbers out of range
        raise ConfigError(f"{origin}: {exc}") from exc
    return config


def config_to_text(config: ModelConfig) -> str:
    return str(text_format.MessageToString(config))


def datatype_of(config_type: int) -> str:
    """The Triton datatype name (e.g. 'FP32') of a config DataType enum value."""
    name = mc.DataType.Name(config_type)
    dtype = BY_CONFIG.get(name)
    return dtype.triton if dtype else name.removeprefix("TYPE_")


def config_type_of(triton: str) -> int:
    return int(mc.DataType.Value(BY_TRITON[triton].config))


def resolve_backend(config: ModelConfig, model_dir: Path, versions: list[int]) -> str:
    """Fill platform / backend (from the files present when neither is set); return the backend."""
    name = backend_name(config.platform, config.backend)
    if name == "tensorflow" or (not name and config.platform.startswith("tensorflow")):
        _refuse_tensorflow(config, model_dir, versions)
    if not name:
        if config.platform or config.backend:
            raise ConfigError(
                f"{model_dir / CONFIG_FILENAME}: unsupported platform '{config.platform}'"
            )
        for candidate, filename in DEFAULT_MODEL_FILENAME.items():
            wanted = config.default_model_filename or filename
            if any((model_dir / str(v) / wanted).exists() for v in versions):
                name = candidate
                break
        if not name:
            _refuse_tensorflow(config, model_dir, versions)
            raise ConfigError(
                f"{model_dir}: no config.pbtxt names a platform or backend and no version folder "
                f"holds a known model file ({', '.join(DEFAULT_MODEL_FILENAME.values())})"
            )
    if not config.backend:
        config.backend = name
    if not config.platform and name in BACKEND_TO_PLATFORM:
        config.platform = BACKEND_TO_PLATFORM[name]
    if not config.default_model_filename:
        parameters = {k: v.string_value for k, v in config.parameters.items()}
        config.default_model_filename = default_model_filename(name, parameters)
    return name


def _refuse_tensorflow(config: ModelConfig, model_dir: Path, versions: list[int]) -> None:
    """TensorFlow models fail with what to do instead (appliance/tf_advice.py)."""
    advice = tensorflow_advice(config, model_dir, versions)
    if advice is not None:
        raise ConfigError(advice.message())


def _batchable(signature: ModelSignature) -> bool:
    tensors = signature.inputs + signature.outputs
    return bool(tensors) and all(t.shape and t.shape[0] == -1 for t in tensors)


def _fill_tensor(entry: mc.ModelInput | mc.ModelOutput, spec: TensorSpec, batching: bool) -> None:
    if entry.data_type == mc.TYPE_INVALID:
        entry.data_type = config_type_of(spec.datatype)
    if not entry.dims and not entry.HasField("reshape"):
        entry.dims.extend(spec.shape[1:] if batching else spec.shape)


def complete_config(config: ModelConfig, signature: ModelSignature, model_name: str) -> None:
    """Triton-style auto-complete of a missing or partial config from the model's signature."""
    if not config.name:
        config.name = model_name
    fully_auto = not config.input and not config.output
    if fully_auto and config.max_batch_size == 0 and _batchable(signature):
        config.max_batch_size = DEFAULT_MAX_BATCH_SIZE
        if not config.HasField("sequence_batching") and not config.HasField("dynamic_batching"):
            config.dynamic_batching.SetInParent()
    batching = config.max_batch_size > 0
    for kind, entries, specs in (
        ("input", config.input, signature.inputs),
        ("output", config.output, signature.outputs),
    ):
        by_name = {s.name: s for s in specs}
        if not entries:
            for spec in specs:
                entry = entries.add()
                entry.name = spec.name
                _fill_tensor(entry, spec, batching)
            continue
        for entry in entries:
            found = by_name.get(entry.name)
            if found is None:
                raise ConfigError(
                    f"model '{config.name}': {kind} '{entry.name}' in config.pbtxt is not in the "
                    f"model; the model has {sorted(by_name)}"
                )
            _fill_tensor(entry, found, batching)
    complete_scheduling(config)


def complete_scheduling(config: ModelConfig) -> None:
    """Defaults that do not need the model file: instance groups and version policy."""
    if not config.instance_group:
        config.instance_group.add()
    for i, group in enumerate(config.instance_group):
        if not group.name:
            group.name = f"{config.name}_{i}"
        if group.count < 1:
            group.count = 1
        # KIND_AUTO is resolved when the model loads (runtime/placement.py).
    if not config.HasField("version_policy"):
        config.version_policy.latest.num_versions = 1


def _where(path: Path, config: ModelConfig) -> str:
    return f"{path / CONFIG_FILENAME} (model '{config.name}')"


def validate_config(
    config: ModelConfig, model_dir: Path, signature: ModelSignature | None = None
) -> None:
    """Check the config on its own and, given the model's signature, against the model."""
    where = _where(model_dir, config)
    if config.name != model_dir.name:
        raise ConfigError(
            f"{where}: name '{config.name}' does not match the model folder '{model_dir.name}'"
        )
    if config.max_batch_size < 0:
        raise ConfigError(f"{where}: max_batch_size must be >= 0, got {config.max_batch_size}")
    if config.HasField("sequence_batching") and config.HasField("dynamic_batching"):
        raise ConfigError(f"{where}: sequence_batching and dynamic_batching exclude each other")
    if (config.platform == ENSEMBLE) != config.HasField("ensemble_scheduling"):
        raise ConfigError(f'{where}: platform "ensemble" and ensemble_scheduling go together')
    if config.HasField("dynamic_batching"):
        dyn = config.dynamic_batching
        if dyn.priority_levels and not 1 <= dyn.default_priority_level <= dyn.priority_levels:
            raise ConfigError(
                f"{where}: dynamic_batching.default_priority_level must be between 1 and "
                f"priority_levels ({dyn.priority_levels}), got {dyn.default_priority_level}"
            )
        for level in dyn.priority_queue_policy:
            if not 1 <= level <= dyn.priority_levels:
                raise ConfigError(
                    f"{where}: dynamic_batching.priority_queue_policy has level {level}, outside "
                    f"1..priority_levels ({dyn.priority_levels})"
                )
        for size in config.dynamic_batching.preferred_batch_size:
            if size < 1 or size > config.max_batch_size:
                raise ConfigError(
                    f"{where}: dynamic_batching.preferred_batch_size {size} must be between 1 "
                    f"and max_batch_size {config.max_batch_size}"
                )
    if not config.input:
        raise ConfigError(f"{where}: no inputs; list them under 'input' or let auto-complete do it")
    if not config.output:
        raise ConfigError(f"{where}: no outputs")
    for kind, entries in (("input", config.input), ("output", config.output)):
        seen: set[str] = set()
        for entry in entries:
            label = f"{where}: {kind} '{entry.name}'"
            if not entry.name:
                raise ConfigError(f"{where}: an {kind} has no name")
            if entry.name in seen:
                raise ConfigError(f"{label} is listed twice")
            seen.add(entry.name)
            if entry.data_type == mc.TYPE_INVALID:
                raise ConfigError(f"{label}: data_type is missing")
            if any(d < -1 or d == 0 for d in entry.dims):
                raise ConfigError(f"{label}: dims must be positive or -1, got {list(entry.dims)}")
            if not entry.dims and not entry.HasField("reshape"):
                raise ConfigError(f"{label}: dims is missing")
    if signature is not None:
        _check_against_model(config, where, signature)
        if config.HasField("sequence_batching"):
            _check_sequence_tensors(config, where, signature)


def model_shape(entry: mc.ModelInput | mc.ModelOutput) -> list[int]:
    """The shape the model file sees for a config tensor (reshape applied, no batch dim)."""
    return list(entry.reshape.shape) if entry.HasField("reshape") else list(entry.dims)


def _check_against_model(config: ModelConfig, where: str, signature: ModelSignature) -> None:
    batching = config.max_batch_size > 0
    for kind, entries, specs in (
        ("input", config.input, signature.inputs),
        ("output", config.output, signature.outputs),
    ):
        by_name = {s.name: s for s in specs}
        for entry in entries:
            spec = by_name.get(entry.name)
            label = f"{where}: {kind} '{entry.name}'"
            if spec is None:
                raise ConfigError(f"{label} is not in the model; the model has {sorted(by_name)}")
            expected = datatype_of(entry.data_type)
            if spec.datatype != expected:
                raise ConfigError(
                    f"{label}: data_type {mc.DataType.Name(entry.data_type)} does not match the "
                    f"model's {BY_TRITON[spec.datatype].config}"
                )
            shape = list(spec.shape)
            if batching:
                if not shape or shape[0] != -1:
                    raise ConfigError(
                        f"{label}: max_batch_size is {config.max_batch_size} but the model's first "
                        f"dimension is not dynamic (model shape {shape}); set max_batch_size: 0"
                    )
                shape = shape[1:]
            want = model_shape(entry)
            compatible = len(want) == len(shape) and all(
                m == -1 or c == -1 or m == c for m, c in zip(shape, want, strict=True)
            )
            if not compatible:
                raise ConfigError(
                    f"{label}: dims {want} do not match the model's shape {shape}"
                    + (" (batch dimension excluded)" if batching else "")
                )


def _check_sequence_tensors(config: ModelConfig, where: str, signature: ModelSignature) -> None:
    """Control and state tensors are model inputs / outputs the client never sends."""
    model_inputs = {t.name for t in signature.inputs}
    model_outputs = {t.name for t in signature.outputs}
    seq = config.sequence_batching
    for control in seq.control_input:
        if control.name not in model_inputs:
            raise ConfigError(
                f"{where}: sequence_batching control input '{control.name}' is not a model "
                f"input; the model has {sorted(model_inputs)}"
            )
    for state in seq.state:
        if state.input_name not in model_inputs or state.output_name not in model_outputs:
            raise ConfigError(
                f"{where}: sequence_batching state '{state.input_name}' -> "
                f"'{state.output_name}' must name a model input and a model output"
            )
