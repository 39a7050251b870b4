"""Turning a model folder into served versions: config, auto-complete, instances (blocking)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from google.protobuf import json_format

from appliance.common.errors import ApplianceError, ConfigError, NoVersionAvailable
from appliance.common.host_policy import HostPolicy, policy_name
from appliance.common.model_config import (
    CONFIG_FILENAME,
    DEFAULT_BOUNDS,
    ENSEMBLE,
    ConfigBounds,
    ModelConfig,
    check_file_names,
    config_file,
    datatype_of,
    model_shape,
    read_config,
    validate_config,
)
from appliance.common.protocol import model_config_pb2 as mc
from appliance.common.protojson import message_to_dict
from appliance.common.settings import DEFAULT_MAX_BATCH_SIZE
from appliance.ops import affinity
from appliance.repository.ledger import LOAD, VERIFICATION, WARM_UP
from appliance.repository.local import escapes, list_versions
from appliance.repository.manifest import (
    NO_MANIFEST_RULES,
    ManifestPolicy,
    check_model_level,
    check_version,
    model_level_files,
)
from appliance.repository.model_signature import check_model_signature
from appliance.repository.store import damage_of, read_record, remove_damaged
from appliance.runtime.autocomplete import (
    complete_config,
    complete_scheduling,
    resolve_backend,
)
from appliance.runtime.placement import onnx_substitute, place_group, tensorrt_problem
from appliance.runtime.specs import batch_shaping, plan_from_config
from appliance.runtime.version_policy import select_versions
from appliance.runtime.warmup import warm_up
from appliance.scheduling.ensemble import EnsemblePlan
from appliance.scheduling.instances import InstanceWorker
from edge_backends.api import (
    Backend,
    BackendError,
    InferenceHost,
    InstanceSpec,
    ModelInstance,
    ModelLoadError,
    ModelSignature,
    Placement,
)
from edge_backends.datatypes import BY_TRITON
from edge_backends.registry import get_backend

log = logging.getLogger(__name__)


class WarmUpFailed(ConfigError):
    """A version loaded but its warm-up failed (recorded as such in the ledger)."""


@dataclass(frozen=True)
class TensorRule:
    """A config input or output, precomputed for per-request checks."""

    name: str
    datatype: str
    dtype: np.dtype[Any]
    dims: tuple[int, ...]  # as clients see it, without the batch dimension
    model_dims: tuple[int, ...] | None  # the model's own shape when config has `reshape`
    optional: bool = False
    ragged: bool = False  # allow_ragged_batch: requests batch whatever its shape


@dataclass
class PreparedVersion:
    """A version whose instances are loaded, not yet serving."""

    version: int
    workers: list[InstanceWorker]


@dataclass
class PreparedModel:
    """The outcome of loading one model folder: its config and each version's instances or error."""

    name: str
    config: ModelConfig
    labels: dict[str, list[str]] = field(default_factory=dict)  # output name -> class labels
    versions: list[PreparedVersion] = field(default_factory=list)
    ensemble: EnsemblePlan | None = None
    notes: list[str] = field(default_factory=list)  # what the index reports for a ready model
    failed: dict[int, str] = field(default_factory=dict)  # version -> reason
    # version -> where it failed (ledger.VERIFICATION, LOAD, WARM_UP), for the durable record
    failed_stage: dict[int, str] = field(default_factory=dict)
    # versions found damaged in the store (also in `failed`): taken out of it to be fetched
    # again, so not recorded as failed content
    damaged: set[int] = field(default_factory=set)


def tensor_rules(entries: Any) -> dict[str, TensorRule]:
    rules = {}
    for e in entries:
        datatype = datatype_of(e.data_type)
        reshaped = tuple(model_shape(e)) if e.HasField("reshape") else None
        rules[e.name] = TensorRule(
            name=e.name,
            datatype=datatype,
            dtype=BY_TRITON[datatype].numpy,
            dims=tuple(e.dims),
            model_dims=reshaped,
            optional=bool(getattr(e, "optional", False)),
            ragged=bool(getattr(e, "allow_ragged_batch", False)),
        )
    return rules


def read_labels(model_dir: Path, config: ModelConfig) -> dict[str, list[str]]:
    """Output name -> class labels from each output's label_filename."""
    labels = {}
    for output in config.output:
        if output.label_filename:
            path = model_dir / output.label_filename
            if escapes(path, model_dir):
                # An absolute or '../' name (or a link out) would hand any file the server
                # can read to clients as class names (tests/security/test_cve_classes.py).
                raise ConfigError(
                    f"model '{config.name}' output '{output.name}': label_filename "
                    f"'{output.label_filename}' lies outside the model folder"
                )
            try:
                labels[output.name] = path.read_text(encoding="utf-8").splitlines()
            except OSError as exc:
                raise ConfigError(
                    f"model '{config.name}' output '{output.name}': cannot read label_filename "
                    f"'{path}': {exc.strerror}"
                ) from exc
            except UnicodeDecodeError as exc:  # found by fuzzing (fuzz/corpus/labels)
                raise ConfigError(
                    f"model '{config.name}' output '{output.name}': label_filename '{path}' is "
                    f"not UTF-8 text (byte {exc.start})"
                ) from None
    return labels


def prepare_model(
    model_dir: Path,
    strict: bool,
    override: ModelConfig | None = None,
    host: InferenceHost | None = None,
    manifest: ManifestPolicy = NO_MANIFEST_RULES,
    skip: dict[int, str] | None = None,
    cache_dir: Path | None = None,
    pin: int | None = None,
    bounds: ConfigBounds = DEFAULT_BOUNDS,
    config_name: str = "",
    default_max_batch: Mapping[str, int] | None = None,
    loading: Callable[[int], None] | None = None,
    load_retries: int = 0,
    host_policies: Mapping[str, HostPolicy] | None = None,
) -> PreparedModel:
    """Read, complete and validate the config, then load the instances of each chosen version
    (a version whose instances fail to load is tried `load_retries` more times, as
    tritonserver's --model-load-retry-count: at once, each try from the start).

    `skip`: versions not to load (they failed before, with this content); `pin`: load this
    version alone, whatever the version policy says; `bounds`: the limits on config numbers
    (--max-instances-per-model among them); `config_name`: --model-config-name (the config
    is `configs/<config_name>.pbtxt` where that exists); `default_max_batch`: the
    max_batch_size auto-complete gives a model that can batch, by backend ('': the others;
    default DEFAULT_MAX_BATCH_SIZE); `loading(version)`: told before a version's model file
    is opened (the ledger's durable "loading" marker; the caller clears it); `host_policies`:
    --host-policy's, by name (an instance is created and runs under its group's). Blocking:
    run it in a thread.
    A config error raises; a version that fails to load is recorded in `failed` so the other
    versions still serve.
    """
    name = model_dir.name
    source = None
    if manifest.signed:  # before a byte of config.pbtxt is read
        untrusted = check_model_level(model_level_files(model_dir), manifest)
        if untrusted:
            raise ConfigError(f"model '{name}' not loaded: {untrusted}")
    if override is not None:
        config, found = override, True
    else:
        source = config_file(model_dir, config_name)
        config, found = read_config(model_dir, config_name)
        if source != model_dir / CONFIG_FILENAME:
            log.info("model '%s': configuration from %s (--model-config-name)", name, source)
    if not found and strict:
        raise ConfigError(f"{model_dir}: config.pbtxt is missing and --strict-model-config is set")
    if not config.name:
        config.name = name
    check_file_names(config, f"{source or model_dir / CONFIG_FILENAME} (model '{name}')")
    skip = skip or {}
    available = [v for v in list_versions(model_dir) if v not in skip]  # e.g. rolled back
    if pin is not None:
        if pin in skip:
            raise ConfigError(
                f"model '{name}' is pinned to version {pin}, which failed: {skip[pin]}"
            )
        if pin not in available:
            raise ConfigError(
                f"model '{name}' is pinned to version {pin}, which is not in '{model_dir}' "
                "(unpin it to serve what the version policy selects)"
            )
        available = [pin]
    if config.platform == ENSEMBLE:
        return _prepare_ensemble(config, model_dir, available, bounds, source)
    backend_name = resolve_backend(config, model_dir, available)
    versions = available if pin is not None else select_versions(config.version_policy, available)
    versions, damaged, hashed = _damaged_in_store(
        model_dir, config, available, versions, pin is not None
    )
    if not versions:
        log.warning(  # the client gets tritonserver's words; the operator also what was found
            "model '%s': its version policy matches none of the version folders (found %s in '%s')",
            name,
            available or "no numbered folders",
            model_dir,
        )
        raise NoVersionAvailable(
            name, "".join(f"; version {v} {why}" for v, why in sorted(damaged.items()))
        )
    # The newest version that can be read describes the model; unreadable ones fail alone.
    unreadable: dict[int, str] = {}
    unverified: set[int] = set()  # failed their manifest or path checks
    placement_notes: list[str] = []
    if backend_name == "tensorrt":
        problem = tensorrt_problem()
        substitute = onnx_substitute(config, model_dir, versions, problem) if problem else None
        if substitute is not None:
            log.warning("model '%s': %s", name, substitute.note)
            placement_notes.append(substitute.note)
            unreadable.update(substitute.missing)
            backend_name = "onnxruntime"
        elif problem:
            raise ConfigError(f"model '{name}': TensorRT engines cannot run here: {problem}")
    try:
        backend = get_backend(backend_name)
    except ModelLoadError as exc:  # unknown, or its library is missing (the reason says how)
        raise ConfigError(f"model '{name}': {exc}") from None
    for version in versions:
        model_file = model_dir / str(version) / config.default_model_filename
        if model_file.exists() and escapes(model_file, model_dir):
            unreadable[version] = (
                f"'{model_file}' resolves to '{model_file.resolve()}', outside the model folder"
            )
            unverified.add(version)
            continue
        why = check_version(model_dir / str(version), manifest, hashed.get(version))
        if not why and manifest.model_signature is not None:
            why = check_model_signature(model_dir / str(version), manifest.model_signature)
        if why:
            unreadable[version] = why
            unverified.add(version)
    signature, described_version = None, 0
    for version in (v for v in versions if v not in unreadable):
        newest_file = model_dir / str(version) / config.default_model_filename
        if loading is not None:
            loading(version)
        try:
            signature, described_version = backend.inspect(newest_file), version
            break
        except BackendError as exc:
            unreadable[version] = str(exc)
    stages = {v: VERIFICATION if v in unverified else LOAD for v in unreadable}
    if signature is None:  # no version to describe the model: each failed on its own
        for version, reason in unreadable.items():
            log.error("model '%s' version %d failed to load: %s", name, version, reason)
        return PreparedModel(
            name=name,
            config=config,
            failed={**damaged, **unreadable},
            failed_stage=stages,
            damaged=set(damaged),
        )
    described = bool(signature.inputs or signature.outputs)  # Python models say nothing
    batch_defaults = default_max_batch or {}
    batch_default = batch_defaults.get(backend_name, batch_defaults.get("", DEFAULT_MAX_BATCH_SIZE))
    if not strict:
        try:
            completed = backend.auto_complete(newest_file, message_to_dict(config), batch_default)
        except BackendError as exc:
            raise ConfigError(f"model '{name}': {exc}") from exc
        if completed is not None:
            config = json_format.ParseDict(completed, ModelConfig(), ignore_unknown_fields=True)
    if strict or not described:
        complete_scheduling(config)
    else:
        complete_config(config, signature, name, batch_default)
    validate_config(config, model_dir, signature if described else None, bounds, source)

    prepared = PreparedModel(name=name, config=config, labels=read_labels(model_dir, config))
    prepared.notes.extend(placement_notes)
    prepared.failed.update(damaged)
    prepared.damaged.update(damaged)
    for version, reason in unreadable.items():
        log.error("model '%s' version %d failed to load: %s", name, version, reason)
        prepared.failed[version] = reason
    prepared.failed_stage.update(stages)
    # Placement is decided from what the config asked, for every version alike; the served
    # config then says where the instances really run.
    requested = [mc.ModelInstanceGroup.Kind.Name(g.kind) for g in config.instance_group]
    on_gpu = [0] * len(requested)
    for version in (v for v in versions if v not in unreadable):
        if loading is not None:
            loading(version)
        for attempt in range(load_retries + 1):
            try:
                workers = _load_instances(
                    backend_name,
                    config,
                    model_dir,
                    version,
                    prepared.notes,
                    host,
                    cache_dir,
                    requested,
                    on_gpu,
                    # The file that described the model is not read again (an engine or a
                    # converted forest costs seconds to open).
                    signature if version == described_version and not attempt else None,
                    bounds,
                    source,
                    host_policies or {},
                )
            except (BackendError, ApplianceError) as exc:
                left = load_retries - attempt
                log.error(
                    "model '%s' version %d failed to load: %s%s",
                    name,
                    version,
                    exc,
                    f" (retrying: {left} more {'try' if left == 1 else 'tries'}, "
                    "--model-load-retry-count)"
                    if left
                    else "",
                )
                if left:
                    continue
                prepared.failed[version] = str(exc)
                stage = WARM_UP if isinstance(exc, WarmUpFailed) else LOAD
                prepared.failed_stage[version] = stage
                break
            prepared.versions.append(PreparedVersion(version, workers))
            break
    if prepared.versions:
        for group, gpu_instances in zip(config.instance_group, on_gpu, strict=True):
            group.kind = (
                mc.ModelInstanceGroup.KIND_GPU if gpu_instances else mc.ModelInstanceGroup.KIND_CPU
            )
    return prepared


def _damaged_in_store(
    model_dir: Path, config: ModelConfig, available: list[int], versions: list[int], pinned: bool
) -> tuple[list[int], dict[int, str], dict[int, dict[str, str]]]:
    """Check the chosen versions' files against the hashes the store recorded for them
    (store.damage_of: damage at rest, a flipped bit); a damaged version is taken out of the
    store, so the next sync fetches it again, and the version policy chooses again among the
    others within this load (the model keeps serving the version below). Returns the versions
    to load, the damaged ones with why, and each checked version's hashes (the manifest check
    then hashes nothing again)."""
    damaged: dict[int, str] = {}
    hashed: dict[int, dict[str, str]] = {}
    while True:
        found = {}
        for version in (v for v in versions if v not in damaged and v not in hashed):
            folder = model_dir / str(version)
            why, checked = damage_of(folder)
            if not why and not checked and read_record(folder):  # stored without hashes
                problem = check_version(folder, NO_MANIFEST_RULES)
                why = f"damaged in the store: {problem}" if problem else ""
            if why:
                found[version] = why
                log.error(
                    "model '%s' version %d is %s; taken out of the store to be fetched again",
                    model_dir.name,
                    version,
                    why,
                )
                remove_damaged(folder)
            else:
                hashed[version] = checked
        damaged.update(found)
        if not found or pinned:
            return [v for v in versions if v not in damaged], damaged, hashed
        versions = select_versions(
            config.version_policy, [v for v in available if v not in damaged]
        )


def _prepare_ensemble(
    config: ModelConfig,
    model_dir: Path,
    available: list[int],
    bounds: ConfigBounds,
    source: Path | None,
) -> PreparedModel:
    """An ensemble has no instances of its own: check its config and wiring, and read its
    outputs' own labels (an output without `label_filename` classifies with the labels of the
    step output that makes it)."""
    if not config.input or not config.output:
        raise ConfigError(
            f"{source or model_dir / CONFIG_FILENAME}: an ensemble must list its inputs and outputs"
        )
    complete_scheduling(config)
    validate_config(config, model_dir, bounds=bounds, source=source)
    plan = plan_from_config(config)
    versions = select_versions(config.version_policy, available or [1])
    return PreparedModel(
        name=config.name,
        config=config,
        labels=read_labels(model_dir, config),
        versions=[PreparedVersion(v, []) for v in versions],
        ensemble=plan,
    )


def _create_instances(
    backend: Backend,
    model: str,
    planned: list[tuple[str, HostPolicy | None, InstanceSpec]],
    instances: list[ModelInstance],
) -> list[ModelInstance]:
    """One group's instances, in order; each one created is appended to `instances` (closed
    by the caller on failure). A backend with `parallel_instances` (Python: each instance is a
    process whose initialize() may take seconds) creates them at once, as tritonserver does."""

    def create(instance_name: str, policy: HostPolicy | None, spec: InstanceSpec) -> ModelInstance:
        try:
            # what the instance starts (runtime threads, a model's process) inherits it
            with affinity.bound(policy):
                return backend.create_instance(spec)
        except affinity.NotApplied as exc:
            raise ConfigError(
                f"model '{model}' instance '{instance_name}': "
                f"{policy.describe() if policy else ''}: {exc.strerror}"
            ) from exc

    if len(planned) < 2 or not getattr(backend, "parallel_instances", False):
        for entry in planned:
            instances.append(create(*entry))
        return instances[len(instances) - len(planned) :]
    with ThreadPoolExecutor(len(planned), thread_name_prefix=f"load-{model}") as pool:
        futures = [pool.submit(create, *entry) for entry in planned]
    failure: BaseException | None = None
    created = []
    for future in futures:
        exc = future.exception()
        if exc is None:
            created.append(future.result())
            instances.append(created[-1])
        elif failure is None:
            failure = exc
    if failure is not None:
        raise failure
    return created


def _load_instances(
    backend_name: str,
    config: ModelConfig,
    model_dir: Path,
    version: int,
    notes: list[str],
    host: InferenceHost | None = None,
    cache_dir: Path | None = None,
    requested: list[str] | None = None,
    on_gpu: list[int] | None = None,
    signature: ModelSignature | None = None,
    bounds: ConfigBounds = DEFAULT_BOUNDS,
    source: Path | None = None,
    host_policies: Mapping[str, HostPolicy] | None = None,
) -> list[InstanceWorker]:
    """Create every instance of every group, placed on GPU or CPU (placement.py) from the kind
    each group `requested`; what runs elsewhere than asked is noted in `notes`, and `on_gpu`
    counts, per group, the instances that really run on a GPU.

    As in Triton, a GPU group has `count` instances on each GPU its `gpus` lists."""
    backend = get_backend(backend_name)
    path = model_dir / str(version) / config.default_model_filename
    if signature is None:
        signature = backend.inspect(path)
    described = bool(signature.inputs or signature.outputs)
    validate_config(config, model_dir, signature if described else None, bounds, source)
    config_json = message_to_dict(config)
    parameters = {k: v.string_value for k, v in config.parameters.items()}
    level = config.optimization.graph.level if config.optimization.HasField("graph") else None
    no_gpu = backend.gpu_problem()
    kinds = requested or [mc.ModelInstanceGroup.Kind.Name(g.kind) for g in config.instance_group]
    placements = [
        place_group(kind, group.name, group.count, no_gpu)
        for kind, group in zip(kinds, config.instance_group, strict=True)
    ]
    devices = [
        list(group.gpus) if placed.kind == "KIND_GPU" and group.gpus else [0]
        for placed, group in zip(placements, config.instance_group, strict=True)
    ]
    total = sum(g.count * len(d) for g, d in zip(config.instance_group, devices, strict=True))
    accelerators = tuple(
        (a.name, dict(a.parameters))
        for a in config.optimization.execution_accelerators.gpu_execution_accelerator
    )
    version_cache = cache_dir / "derived" / config.name / str(version) if cache_dir else None
    batching = config.max_batch_size > 0
    shaping = batch_shaping(config) if batching else None
    workers: list[InstanceWorker] = []
    instances: list[ModelInstance] = []
    try:
        for index, group in enumerate(config.instance_group):
            placed = placements[index]
            if placed.note:
                log.warning("model '%s' version %d: %s", config.name, version, placed.note)
                if placed.note not in notes:
                    notes.append(placed.note)
            kind = placed.kind
            resources = {r.name: int(r.count) for r in group.rate_limiter.resources}
            slots = [(gpu, i) for gpu in devices[index] for i in range(group.count)]
            planned = []
            for number, (gpu, _) in enumerate(slots):
                instance_name = f"{group.name}_{number}"
                policy = (host_policies or {}).get(
                    policy_name(group.host_policy, kinds[index], gpu)
                )
                spec = InstanceSpec(
                    model_name=config.name,
                    model_version=version,
                    model_path=path,
                    instance_name=instance_name,
                    kind=kind,
                    device_id=gpu,
                    parameters=parameters,
                    graph_optimization_level=level,
                    instance_count=total,
                    model_config=config_json,
                    host=host,
                    profiles=tuple(group.profile),
                    gpu_accelerators=accelerators if kind == "KIND_GPU" else (),
                    cache_dir=version_cache,
                )
                planned.append((instance_name, policy, spec))
            created = _create_instances(backend, config.name, planned, instances)
            for (instance_name, policy, _), instance in zip(planned, created, strict=True):
                actual = instance.placement or Placement(kind)
                if on_gpu is not None and actual.kind == "KIND_GPU":  # not one that fell back
                    on_gpu[index] += 1
                if actual.note:
                    note = f"instance '{instance_name}': {actual.note}"
                    log.warning("model '%s' version %d: %s", config.name, version, note)
                    notes.append(note)
                workers.append(
                    InstanceWorker(
                        f"{config.name}_v{version}_{instance_name}",
                        instance,
                        batching,
                        resources=resources,
                        priority=int(group.rate_limiter.priority),
                        shaping=shaping,
                        host_policy=policy,
                    )
                )
        try:
            warm_up(config, model_dir, version, instances)
        except ConfigError as exc:
            raise WarmUpFailed(exc.message) from exc
    except BaseException:
        for instance in instances:
            instance.close()
        raise
    return workers
