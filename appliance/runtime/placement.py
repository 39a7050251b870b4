"""Where a model runs: GPU or CPU, decided per model when it loads, and said out loud.

The rules (DESIGN.md, "GPU or CPU"):
- KIND_GPU runs on the GPU when its backend can use one here; otherwise on CPU, with a note in
  the repository index and a warning in the log.
- KIND_AUTO runs on the GPU when its backend can use one, else on CPU, quietly: that is what
  AUTO asks for.
- KIND_CPU runs on CPU.
- A TensorRT model that cannot run here (no GPU, no driver, no tensorrt) is served from the
  `model.onnx` beside its `model.plan` with ONNX Runtime, where the version folder has one;
  otherwise it fails to load with the reason.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from appliance.common.model_config import ModelConfig
from appliance.common.protocol import model_config_pb2 as mc
from edge_backends.api import ModelInstance, ModelLoadError, Placement
from edge_backends.registry import get_backend

ONNX_FALLBACK_FILENAME = "model.onnx"
# The notes place_group and onnx_substitute leave, read back by where_instances_run.
_GROUP_NOTE = re.compile(r"^\d+ KIND_\w+ instance\(s\) of group '(?P<group>.*)' run on CPU: ")
_SUBSTITUTE_NOTE = "TensorRT cannot run here ("


def place_group(requested: str, group_name: str, count: int, gpu_problem: str) -> Placement:
    """Where one instance group's instances run, given why the backend cannot use a GPU here
    ('' when it can); the note says why that is not what the config asked for."""
    if requested == "KIND_CPU":
        return Placement("KIND_CPU")
    if not gpu_problem:
        return Placement("KIND_GPU")
    if requested == "KIND_AUTO":
        return Placement("KIND_CPU")
    return Placement(
        "KIND_CPU",
        f"{count} {requested} instance(s) of group '{group_name}' run on CPU: {gpu_problem}",
    )


def tensorrt_problem() -> str:
    """Why TensorRT engines cannot run here ('' when they can)."""
    try:
        backend = get_backend("tensorrt")
    except ModelLoadError as exc:
        return str(exc)
    return backend.gpu_problem()


@dataclass(frozen=True)
class OnnxSubstitute:
    """A TensorRT model served from its ONNX files on CPU instead."""

    versions: tuple[int, ...]  # versions that have model.onnx
    missing: dict[int, str]  # versions that do not: their load error
    note: str


def onnx_substitute(
    config: ModelConfig, model_dir: Path, versions: list[int], problem: str
) -> OnnxSubstitute | None:
    """Switch a TensorRT config to ONNX Runtime when TensorRT cannot run and any version
    folder holds model.onnx; None when none does (the model then fails with `problem`)."""
    having = tuple(v for v in versions if (model_dir / str(v) / ONNX_FALLBACK_FILENAME).is_file())
    if not having:
        return None
    missing = {
        v: f"TensorRT cannot run here ({problem}) and version {v} has no "
        f"{ONNX_FALLBACK_FILENAME} to serve instead"
        for v in versions
        if v not in having
    }
    config.platform = "onnxruntime_onnx"
    config.backend = "onnxruntime"
    config.default_model_filename = ONNX_FALLBACK_FILENAME
    for group in config.instance_group:
        group.kind = mc.ModelInstanceGroup.KIND_CPU
    note = (
        f"TensorRT cannot run here ({problem}): serving {ONNX_FALLBACK_FILENAME} of version(s) "
        f"{', '.join(map(str, having))} with onnxruntime on CPU"
    )
    return OnnxSubstitute(having, missing, note)


@dataclass(frozen=True)
class InstancePlace:
    """Where one served instance runs, and why when that is not what its config asked."""

    group: str
    name: str  # <group>_<n>, as the loader names it
    kind: str  # KIND_GPU | KIND_CPU (KIND_MODEL: the backend's choice)
    gpu: int | None  # the device of a GPU instance
    reason: str  # why it runs elsewhere than asked; '' where it asked (or KIND_AUTO chose)


def where_instances_run(
    config: ModelConfig, instances: Sequence[ModelInstance], notes: Sequence[str]
) -> tuple[InstancePlace, ...]:
    """Pure: a served version's instances in the loader's order (group by group, `count` per
    device), placed as the served config and each instance say, with the reason for a fallback
    from the instance itself or the notes its load left (place_group's, onnx_substitute's)."""
    group_reason: dict[str, str] = {}
    every_group = ""
    for note in notes:
        found = _GROUP_NOTE.match(note)
        if found:
            group_reason[found["group"]] = note[found.end() :]
        elif note.startswith(_SUBSTITUTE_NOTE):
            every_group = note
    places: list[InstancePlace] = []
    left = list(instances)
    for group in config.instance_group:
        kind = mc.ModelInstanceGroup.Kind.Name(group.kind)
        devices = list(group.gpus) or [0]
        count = group.count * len(devices)
        # A GPU group whose every instance fell back on its own is served as KIND_CPU, with
        # an instance per listed GPU all the same.
        fell_back = all(i.placement is not None and i.placement.note for i in left[:count])
        if kind != "KIND_GPU" and not (group.gpus and left and fell_back):
            devices, count = [0], group.count
        mine, left = left[:count], left[count:]
        for number, instance in enumerate(mine):
            placed = instance.placement
            where = placed.kind if placed is not None else kind
            reason = placed.note if placed is not None and placed.note else ""
            if not reason and where != "KIND_GPU":
                reason = group_reason.get(group.name, every_group)
            places.append(
                InstancePlace(
                    group.name,
                    f"{group.name}_{number}",
                    where,
                    devices[number // group.count] if where == "KIND_GPU" else None,
                    reason,
                )
            )
    return tuple(places)
