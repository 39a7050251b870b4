"""The loader's placement on a backend that can use a GPU: instances per listed GPU, KIND_AUTO
on the GPU, and the served config saying where instances really run. The backend is the small
echo backend of edge_backends/api.py's docstring, registered for the test."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from appliance.common.protocol import model_config_pb2 as mc
from appliance.runtime.loader import prepare_model
from edge_backends import registry
from edge_backends.api import (
    BackendBase,
    InstanceBase,
    InstanceSpec,
    ModelSignature,
    Placement,
    TensorSpec,
)

CONFIG = """
name: "echo"
backend: "echo_gpu"
default_model_filename: "model.echo"
max_batch_size: 4
input [ { name: "x", data_type: TYPE_FP32, dims: [ 2 ] } ]
output [ { name: "y", data_type: TYPE_FP32, dims: [ 2 ] } ]
instance_group [
  { name: "gpu", kind: KIND_GPU, count: 2, gpus: [ 0, 1 ] },
  { name: "auto", kind: KIND_AUTO, count: 1 },
  { name: "cpu", kind: KIND_CPU, count: 1, gpus: [ 1 ] }
]
"""


class EchoInstance(InstanceBase):
    def __init__(self, spec: InstanceSpec, on_gpu: bool) -> None:
        self.spec = spec
        fell_back = spec.kind == "KIND_GPU" and not on_gpu
        self.placement = Placement(
            "KIND_GPU" if on_gpu else "KIND_CPU",
            "the GPU was full; running on CPU" if fell_back else "",
        )

    def execute(self, inputs: Any, output_names: Sequence[str]) -> dict[str, np.ndarray]:
        return {"y": inputs["x"]}

    def close(self) -> None:
        pass


class EchoGpuBackend(BackendBase):
    name = "echo_gpu"

    def __init__(self) -> None:
        self.specs: list[InstanceSpec] = []
        self.gpu_full = False

    def gpu_problem(self) -> str:
        return ""

    def inspect(self, model_path: Path) -> ModelSignature:
        return ModelSignature(
            inputs=(TensorSpec("x", "FP32", (-1, 2)),), outputs=(TensorSpec("y", "FP32", (-1, 2)),)
        )

    def create_instance(self, spec: InstanceSpec) -> EchoInstance:
        self.specs.append(spec)
        return EchoInstance(spec, spec.kind == "KIND_GPU" and not self.gpu_full)


@pytest.fixture
def backend() -> Iterator[EchoGpuBackend]:
    echo = EchoGpuBackend()
    registry._loaded["echo_gpu"] = echo  # type: ignore[assignment]
    try:
        yield echo
    finally:
        registry._loaded.pop("echo_gpu", None)


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "echo"
    for version in (1, 2):
        (folder / str(version)).mkdir(parents=True)
        (folder / str(version) / "model.echo").write_text("echo")
    (folder / "config.pbtxt").write_text(CONFIG + 'version_policy: { all { } }\n')
    return folder


def _stop(prepared: Any) -> None:
    for version in prepared.versions:
        for worker in version.workers:
            worker.stop()


def test_gpu_groups_get_count_instances_per_listed_gpu(
    backend: EchoGpuBackend, model_dir: Path
) -> None:
    prepared = prepare_model(model_dir, strict=False)
    try:
        assert sorted(v.version for v in prepared.versions) == [1, 2]
        v1 = [s for s in backend.specs if s.model_version == 1]
        placed = [(s.instance_name, s.kind, s.device_id) for s in v1]
        assert placed == [
            ("gpu_0", "KIND_GPU", 0), ("gpu_1", "KIND_GPU", 0),
            ("gpu_2", "KIND_GPU", 1), ("gpu_3", "KIND_GPU", 1),
            ("auto_0", "KIND_GPU", 0),  # AUTO takes the GPU when the backend can use one
            ("cpu_0", "KIND_CPU", 0),  # gpus is ignored for CPU groups
        ]
        assert {s.instance_count for s in v1} == {6}
        kinds = [mc.ModelInstanceGroup.Kind.Name(g.kind) for g in prepared.config.instance_group]
        assert kinds == ["KIND_GPU", "KIND_GPU", "KIND_CPU"]
        assert prepared.notes == []
    finally:
        _stop(prepared)


def test_instances_that_came_up_on_cpu_are_reported(
    backend: EchoGpuBackend, model_dir: Path
) -> None:
    backend.gpu_full = True
    prepared = prepare_model(model_dir, strict=False)
    try:
        # Both versions asked for the GPU (the requested kinds are kept), and the served
        # config says where the instances really run.
        assert {s.kind for s in backend.specs if s.instance_name.startswith("gpu")} == {
            "KIND_GPU"
        }
        kinds = [mc.ModelInstanceGroup.Kind.Name(g.kind) for g in prepared.config.instance_group]
        assert kinds == ["KIND_CPU", "KIND_CPU", "KIND_CPU"]
        assert "instance 'gpu_0': the GPU was full; running on CPU" in prepared.notes
        assert not any("cpu_0" in note for note in prepared.notes)
    finally:
        _stop(prepared)
