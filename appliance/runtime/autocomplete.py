"""What a model's config leaves out, filled in when it loads: which backend serves it (from the
platform, the backend name or the files present) and Triton's auto-complete from the model's
signature (max_batch_size, the dynamic batcher, tensors, instance groups, version policy).

The config's schema (reading, validation, bounds) is common/model_config.py.
"""

from __future__ import annotations

from pathlib import Path

from appliance.common.errors import ConfigError
from appliance.common.model_config import CONFIG_FILENAME, ModelConfig, config_type_of
from appliance.common.protocol import model_config_pb2 as mc
from appliance.common.settings import DEFAULT_MAX_BATCH_SIZE, SEQUENCE_IDLE_DEFAULT_US
from appliance.common.tf_advice import tensorflow_advice
from edge_backends.api import ModelSignature, TensorSpec
from edge_backends.registry import (
    BACKEND_TO_PLATFORM,
    DEFAULT_MODEL_FILENAME,
    backend_name,
    default_model_filename,
)


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
    """TensorFlow models fail with what to do instead (appliance/common/tf_advice.py)."""
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


def complete_config(
    config: ModelConfig,
    signature: ModelSignature,
    model_name: str,
    default_max_batch: int = DEFAULT_MAX_BATCH_SIZE,
) -> None:
    """Triton-style auto-complete of a missing or partial config from the model's signature;
    a model that can batch gets `default_max_batch` (--backend-config
    default-max-batch-size; 0: it does not batch) and, above 1, the dynamic batcher."""
    if not config.name:
        config.name = model_name
    fully_auto = not config.input and not config.output
    if fully_auto and config.max_batch_size == 0 and default_max_batch and _batchable(signature):
        config.max_batch_size = default_max_batch
        scheduled = config.HasField("sequence_batching") or config.HasField("dynamic_batching")
        if default_max_batch > 1 and not scheduled:
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
    """Defaults that do not need the model file, as Triton's core normalises a config
    (`NormalizeModelConfig`, `NormalizeInstanceGroup`): the version policy, the batchers'
    preferred sizes and idle time, the pinned-memory options and the instance groups. Each is
    what the schedulers assume when the field is unset (specs.py, policy.py), so the served
    config says what runs; an ensemble gets neither instance groups nor `optimization`."""
    if not config.HasField("version_policy"):
        config.version_policy.latest.num_versions = 1
    batching = config.max_batch_size > 0
    dynamic = config.dynamic_batching
    if config.HasField("dynamic_batching") and not dynamic.preferred_batch_size and batching:
        dynamic.preferred_batch_size.append(config.max_batch_size)
    if config.HasField("sequence_batching"):
        sequence = config.sequence_batching
        if not sequence.max_sequence_idle_microseconds:
            sequence.max_sequence_idle_microseconds = SEQUENCE_IDLE_DEFAULT_US
        oldest = sequence.oldest
        if sequence.HasField("oldest") and not oldest.preferred_batch_size and batching:
            oldest.preferred_batch_size.append(config.max_batch_size)
    if config.HasField("ensemble_scheduling"):
        return
    optimization = config.optimization
    if not optimization.HasField("input_pinned_memory"):
        optimization.input_pinned_memory.enable = True
    if not optimization.HasField("output_pinned_memory"):
        optimization.output_pinned_memory.enable = True
    if not config.instance_group:
        config.instance_group.add().name = config.name  # Triton's default group: the model's name
    for i, group in enumerate(config.instance_group):
        if not group.name:
            group.name = f"{config.name}_{i}"
        if group.count < 1:
            # Triton's count is 2 for ONNX Runtime and TensorFlow on CPU; here 1, as before
            # (ONNX Runtime's intra-op threads are split by the instance count: ort.py).
            group.count = 1
        # KIND_AUTO is resolved when the model loads (runtime/placement.py).
