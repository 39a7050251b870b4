"""config.pbtxt <-> Triton's ModelConfig protobuf: reading and validation (the schema; the
backend's resolution and auto-complete are the runtime's: runtime/autocomplete.py).

Errors name the file and the field, e.g.
`models/simple/config.pbtxt: input 'INPUT0': dims must be positive or -1, got [0, 16]`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from google.protobuf import text_format

from appliance.common.errors import ConfigError
from appliance.common.limits import DEFAULT_MAX_TENSOR_ELEMENTS
from appliance.common.protocol import ModelConfig as ModelConfig
from appliance.common.protocol import model_config_pb2 as mc
from appliance.common.settings import SchedulingSettings
from appliance.common.tensors import MAX_DIMS
from edge_backends.api import ModelSignature
from edge_backends.datatypes import BY_CONFIG, BY_TRITON

CONFIG_FILENAME = "config.pbtxt"
# --model-config-name NAME picks `<model>/configs/NAME.pbtxt` where it exists (tritonserver's
# custom configurations: one repository, configured per kind of device).
CUSTOM_CONFIGS = "configs"
ENSEMBLE = "ensemble"


@dataclass(frozen=True)
class ConfigBounds:
    """The most a config may ask of each number that sizes memory or threads. Protobuf lets a
    config (or a client's load override) say `max_batch_size: 2147483647`, and warm-up samples
    are made that big; beyond a bound the config is refused with the field, its value and the
    bound, so the schedulers (runtime/specs.py) never see an unbounded value. Only the
    instance count is a flag (--max-instances-per-model). `priority_levels` has no bound: as
    in Triton any uint64 is accepted, and the queues keep only the levels in use."""

    # Instances of one version, all groups and GPUs together: one thread each (Python
    # models: one process each).
    max_instances: int = SchedulingSettings.max_instances_per_model
    # Requests one queue may hold (16x the server-wide default of 4096 per version).
    max_queue_size: int = 65_536
    # Requests in one execution; warm-up samples are made this big.
    max_batch_size: int = 65_536
    max_preferred_batch_sizes: int = 64  # entries; each batching decision scans them
    max_sequences: int = 4_096  # sequence_batching.oldest.max_candidate_sequences
    # Elements of an array the server makes from the config alone (warm-up samples, initial
    # sequence state): the per-input request limit's default.
    max_array_elements: int = DEFAULT_MAX_TENSOR_ELEMENTS

    @classmethod
    def from_settings(cls, scheduling: SchedulingSettings) -> ConfigBounds:
        return cls(max_instances=scheduling.max_instances_per_model)


DEFAULT_BOUNDS = ConfigBounds()


def config_file(model_dir: Path, config_name: str = "") -> Path:
    """The model's config file: `configs/<config_name>.pbtxt` when `config_name` is given and
    that file exists, else `config.pbtxt`, as tritonserver's --model-config-name chooses (looked
    up at every load, so adding or removing a custom file takes effect on the next one)."""
    if config_name:
        custom = model_dir / CUSTOM_CONFIGS / f"{config_name}.pbtxt"
        if custom.is_file():
            return custom
    return model_dir / CONFIG_FILENAME


def check_config_name(name: str) -> str:
    """`name` if it can be a custom configuration's name (a file name without its .pbtxt), else
    ValueError with the reason."""
    if not name:
        raise ValueError("empty argument for --model-config-name")
    if any(ch.isspace() for ch in name):
        raise ValueError(f"--model-config-name must not contain spaces, got {name!r}")
    if "/" in name or "\\" in name or name in (".", "..") or "\0" in name:
        raise ValueError(
            f"--model-config-name is a file name in each model's configs/ folder (without "
            f".pbtxt), not a path, got {name!r}"
        )
    return name


def read_config(model_dir: Path, config_name: str = "") -> tuple[ModelConfig, bool]:
    """Parse the model's config file (`config_file`); an absent file gives an empty config and
    False."""
    path = config_file(model_dir, config_name)
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


def plain_file_name(name: str) -> bool:
    """Whether `name` is one file name (no folder part, not '.' or '..'): what a config field
    naming a file inside the version folder or the model folder may hold."""
    return bool(name) and name not in (".", "..") and not any(c in name for c in "/\\\0")


def check_file_names(config: ModelConfig, where: str) -> None:
    """Every config field that names a file is a plain file name, so that it cannot point
    outside the version folder (default_model_filename, cc_model_filenames: the model file;
    Python models: model.py), the model folder (label_filename) or `warmup/`
    (input_data_file): '../x', 'a/b' and absolute paths are refused."""
    named = [("default_model_filename", config.default_model_filename)]
    named += [(f"cc_model_filenames['{k}']", v) for k, v in config.cc_model_filenames.items()]
    named += [(f"output '{o.name}' label_filename", o.label_filename) for o in config.output]
    for sample in config.model_warmup:
        for input_name, data in sample.inputs.items():
            if data.WhichOneof("input_data_type") == "input_data_file":
                named.append(
                    (
                        f"model_warmup '{sample.name}' input '{input_name}' input_data_file",
                        data.input_data_file,
                    )
                )
    for field_name, value in named:
        if value and not plain_file_name(value):
            raise ConfigError(
                f"{where}: {field_name} must be a plain file name (no '/', no '..'), got "
                f"{value!r}"
            )


def validate_config(
    config: ModelConfig,
    model_dir: Path,
    signature: ModelSignature | None = None,
    bounds: ConfigBounds = DEFAULT_BOUNDS,
    source: Path | None = None,
) -> None:
    """Check the config on its own and, given the model's signature, against the model.
    `source`: the file it was read from, for the messages (default config.pbtxt)."""
    where = f"{source or model_dir / CONFIG_FILENAME} (model '{config.name}')"
    if config.name != model_dir.name:
        raise ConfigError(
            f"{where}: name '{config.name}' does not match the model folder '{model_dir.name}'"
        )
    if config.max_batch_size < 0:
        raise ConfigError(f"{where}: max_batch_size must be >= 0, got {config.max_batch_size}")
    check_bounds(config, where, bounds)
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
    # A Python model may take no inputs and give no outputs (a source of data, a clock, a fixed
    # answer): Triton's core asks for neither, nor does the identity backend (as many inputs as
    # outputs). Other models' files have tensors to list.
    if config.backend not in ("python", "identity"):
        if not config.input:
            raise ConfigError(
                f"{where}: no inputs; list them under 'input' or let auto-complete do it"
            )
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
            if mc.DataType.Name(entry.data_type) not in BY_CONFIG:  # TYPE_BF16
                raise ConfigError(
                    f"{label}: data_type {mc.DataType.Name(entry.data_type)} is not supported "
                    f"here (supported: {', '.join(BY_CONFIG)})"
                )
            if any(d < -1 or d == 0 for d in entry.dims):
                raise ConfigError(f"{label}: dims must be positive or -1, got {list(entry.dims)}")
            if len(entry.dims) > MAX_DIMS:
                raise _over(
                    where, f"the number of {kind} '{entry.name}' dims", len(entry.dims), MAX_DIMS
                )
            if not entry.dims and not entry.HasField("reshape"):
                raise ConfigError(f"{label}: dims is missing")
    _check_batch_inputs(config, where)
    if signature is not None:
        _check_against_model(config, where, signature)
        _check_batch_targets(config, where, signature)
        if config.HasField("sequence_batching"):
            _check_sequence_tensors(config, where, signature)


def _check_batch_inputs(config: ModelConfig, where: str) -> None:
    """`batch_input` entries, with Triton's texts (core's ValidateBatchIO)."""
    inputs = {i.name for i in config.input}
    for entry in config.batch_input:
        kind = mc.BatchInput.Kind.Name(entry.kind)
        if len(entry.source_input) != 1:
            raise ConfigError(
                f"{where}: batch input kind '{kind}' expects 1 source input, got "
                f"{len(entry.source_input)}"
            )
        if entry.data_type not in (mc.TYPE_INT32, mc.TYPE_FP32):
            raise ConfigError(f"{where}: batch input data type must be TYPE_INT32 or TYPE_FP32")
        for source in entry.source_input:
            if source not in inputs:
                raise ConfigError(f"{where}: unknown source input name '{source}'")
        if not entry.target_name:
            raise ConfigError(f"{where}: batch input kind '{kind}' has no target_name")
    outputs = {o.name for o in config.output}
    for output in config.batch_output:
        kind = mc.BatchOutput.Kind.Name(output.kind)
        if len(output.source_input) != 1:
            raise ConfigError(
                f"{where}: batch output kind '{kind}' expects 1 source input, got "
                f"{len(output.source_input)}"
            )
        for source in output.source_input:
            if source not in inputs:
                raise ConfigError(f"{where}: unknown source input name '{source}'")
        targets: set[str] = set()
        for target in output.target_name:
            if target not in outputs:
                raise ConfigError(f"{where}: unknown target output name '{target}'")
            if target in targets:
                raise ConfigError(
                    f"{where}: target output name '{target}' can only be specified once"
                )
            targets.add(target)


def _over(where: str, field: str, value: int, bound: int) -> ConfigError:
    return ConfigError(f"{where}: {field} is {value}, more than the {bound} allowed")


def _check_array(where: str, field: str, shape: list[int], bounds: ConfigBounds) -> None:
    """An array the server makes from the config alone stays within the element bound (a
    shape that is not fixed is refused where the array is made)."""
    if len(shape) > MAX_DIMS:
        raise _over(where, f"the number of {field} {shape}", len(shape), MAX_DIMS)
    if all(d > 0 for d in shape):
        elements = math.prod(shape)
        if elements > bounds.max_array_elements:
            raise _over(
                where, f"the element count of {field} {shape}", elements, bounds.max_array_elements
            )


def instance_count(config: ModelConfig) -> int:
    """Instances one version gets: each group's count on each GPU it lists (on one device
    when it lists none, or runs on CPU)."""
    total = 0
    for group in config.instance_group:
        devices = 1 if group.kind == mc.ModelInstanceGroup.KIND_CPU else max(1, len(group.gpus))
        total += max(1, group.count) * devices
    return total


def check_bounds(config: ModelConfig, where: str, bounds: ConfigBounds = DEFAULT_BOUNDS) -> None:
    """ConfigError naming the field, its value and the bound, for every config number that
    sizes memory or threads beyond `bounds` (see ConfigBounds)."""
    if config.max_batch_size > bounds.max_batch_size:
        raise _over(where, "max_batch_size", config.max_batch_size, bounds.max_batch_size)
    for group in config.instance_group:
        if group.count < 0:
            raise ConfigError(
                f"{where}: instance_group '{group.name}' count must be >= 0, got {group.count}"
            )
    instances = instance_count(config)
    if instances > bounds.max_instances:
        counts = ", ".join(
            f"'{g.name or i}' count {g.count}" + (f" on {len(g.gpus)} GPUs" if g.gpus else "")
            for i, g in enumerate(config.instance_group)
        )
        raise ConfigError(
            f"{where}: instance_group asks for {instances} instances ({counts}), more than "
            f"the {bounds.max_instances} per model allowed (--max-instances-per-model)"
        )
    dyn = config.dynamic_batching
    policies = [("dynamic_batching.default_queue_policy", dyn.default_queue_policy)]
    policies += [
        (f"dynamic_batching.priority_queue_policy[{level}]", policy)
        for level, policy in sorted(dyn.priority_queue_policy.items())
    ]
    for field, policy in policies:
        if policy.max_queue_size > bounds.max_queue_size:
            raise _over(
                where, f"{field}.max_queue_size", policy.max_queue_size, bounds.max_queue_size
            )
    oldest = config.sequence_batching.oldest
    for field, sizes in (
        ("dynamic_batching.preferred_batch_size", dyn.preferred_batch_size),
        ("sequence_batching.oldest.preferred_batch_size", oldest.preferred_batch_size),
    ):
        if len(sizes) > bounds.max_preferred_batch_sizes:
            raise _over(
                where,
                f"the number of {field} entries",
                len(sizes),
                bounds.max_preferred_batch_sizes,
            )
        for size in sizes:
            if size > bounds.max_batch_size:
                raise _over(where, field, size, bounds.max_batch_size)
    if oldest.max_candidate_sequences > bounds.max_sequences:
        raise _over(
            where,
            "sequence_batching.oldest.max_candidate_sequences",
            oldest.max_candidate_sequences,
            bounds.max_sequences,
        )
    for state in config.sequence_batching.state:
        label = f"sequence_batching state '{state.input_name}'"
        _check_array(where, f"{label} dims", list(state.dims), bounds)
        for initial in state.initial_state:
            _check_array(where, f"{label} initial_state dims", list(initial.dims), bounds)
    batching = config.max_batch_size > 0
    for sample in config.model_warmup:
        label = f"model_warmup '{sample.name}'"
        if batching and sample.batch_size > config.max_batch_size:
            raise ConfigError(
                f"{where}: {label} batch_size is {sample.batch_size}, more than max_batch_size "
                f"{config.max_batch_size}"
            )
        batch = [max(1, sample.batch_size)] if batching else []
        for name, spec in sorted(sample.inputs.items()):
            field = f"{label} input '{name}' dims" + (" (batch first)" if batching else "")
            _check_array(where, field, [*batch, *spec.dims], bounds)


def model_shape(entry: mc.ModelInput | mc.ModelOutput) -> list[int]:
    """The shape the model file sees for a config tensor (reshape applied, no batch dim)."""
    return list(entry.reshape.shape) if entry.HasField("reshape") else list(entry.dims)


def _check_against_model(config: ModelConfig, where: str, signature: ModelSignature) -> None:
    batching = config.max_batch_size > 0
    # A batch output's shape in the model is the batch's, not a request's (onnxruntime_backend
    # does not compare it either).
    scattered = {t for b in config.batch_output for t in b.target_name}
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
            if kind == "output" and entry.name in scattered:
                continue
            if kind == "input" and batching and getattr(entry, "allow_ragged_batch", False):
                _check_ragged(config, entry, shape, where)
                continue
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


def _check_ragged(config: ModelConfig, entry: mc.ModelInput, shape: list[int], where: str) -> None:
    """A ragged input reaches the model as one 1-D tensor of the batch's elements: the model's
    input must be [-1] (onnxruntime_backend's rule and texts)."""
    start = f"{where}: unable to load model '{config.name}', configuration expects model provides"
    if entry.optional:
        raise ConfigError(
            f"{start} input with shape [-1] for ragged input '{entry.name}', which is not "
            "supported for optional input"
        )
    if shape != [-1]:
        raise ConfigError(
            f"{start} input with shape [-1] for ragged input '{entry.name}', model provides "
            f"{shape}"
        )


def _check_batch_targets(config: ModelConfig, where: str, signature: ModelSignature) -> None:
    """Each batch input fills a model input the client never sends."""
    model_inputs = {t.name for t in signature.inputs}
    for entry in config.batch_input:
        for target in entry.target_name:
            if target not in model_inputs:
                raise ConfigError(
                    f"{where}: batch input target '{target}' is not a model input; the model "
                    f"has {sorted(model_inputs)}"
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
