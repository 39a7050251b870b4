"""GPU or CPU: the placement rules and ONNX Runtime's provider choices, decided without a GPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from appliance.common.model_config import ModelConfig
from appliance.common.protocol import model_config_pb2 as mc
from appliance.runtime.placement import onnx_substitute, place_group
from edge_backends.api import ModelLoadError
from edge_backends.ort_providers import CPU, CUDA, TENSORRT, fallen_back, plan_providers

GPU_BUILD = [TENSORRT, CUDA, CPU]


def test_instance_kinds_resolve_by_what_the_backend_can_use() -> None:
    assert place_group("KIND_GPU", "g", 2, "").kind == "KIND_GPU"
    assert place_group("KIND_AUTO", "g", 1, "").kind == "KIND_GPU"
    assert place_group("KIND_CPU", "g", 1, "").kind == "KIND_CPU"
    auto = place_group("KIND_AUTO", "g", 1, "no usable GPU")
    assert (auto.kind, auto.note) == ("KIND_CPU", "")  # AUTO asks for exactly this: no warning
    gpu = place_group("KIND_GPU", "fast", 2, "no usable GPU (no driver)")
    assert gpu.kind == "KIND_CPU"
    assert gpu.note == (
        "2 KIND_GPU instance(s) of group 'fast' run on CPU: no usable GPU (no driver)"
    )


def _tensorrt_config() -> ModelConfig:
    config = ModelConfig(name="det", platform="tensorrt_plan", backend="tensorrt")
    config.default_model_filename = "model.plan"
    config.instance_group.add(kind=mc.ModelInstanceGroup.KIND_GPU, count=1)
    return config


def test_tensorrt_model_falls_back_to_its_onnx_file(tmp_path: Path) -> None:
    for version, files in ((1, ("model.plan", "model.onnx")), (2, ("model.plan",))):
        (tmp_path / str(version)).mkdir()
        for name in files:
            (tmp_path / str(version) / name).write_bytes(b"x")
    config = _tensorrt_config()
    substitute = onnx_substitute(config, tmp_path, [1, 2], "no usable GPU")
    assert substitute is not None
    assert substitute.versions == (1,)
    assert "version 2 has no model.onnx" in substitute.missing[2]
    assert "serving model.onnx of version(s) 1 with onnxruntime on CPU" in substitute.note
    # The served config says what really serves it.
    assert (config.platform, config.backend, config.default_model_filename) == (
        "onnxruntime_onnx", "onnxruntime", "model.onnx")
    assert config.instance_group[0].kind == mc.ModelInstanceGroup.KIND_CPU


def test_tensorrt_only_model_has_no_substitute(tmp_path: Path) -> None:
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "model.plan").write_bytes(b"x")
    config = _tensorrt_config()
    assert onnx_substitute(config, tmp_path, [1], "no usable GPU") is None
    assert config.platform == "tensorrt_plan"  # untouched


def test_cpu_instances_use_the_cpu_provider_only() -> None:
    plan = plan_providers("KIND_CPU", 0, [("tensorrt", {})], GPU_BUILD)
    assert plan.providers == [(CPU, {})]


def test_gpu_instance_uses_cuda_on_its_device() -> None:
    plan = plan_providers("KIND_GPU", 1, [], GPU_BUILD)
    assert plan.providers == [(CUDA, {"device_id": "1"}), (CPU, {})]


def test_tensorrt_accelerator_maps_tritons_parameter_names(tmp_path: Path) -> None:
    params = {
        "precision_mode": "FP16",
        "max_workspace_size_bytes": "1073741824",
        "trt_engine_cache_enable": "true",
        "trt_engine_cache_path": "/var/cache/engines",
    }
    plan = plan_providers("KIND_GPU", 0, [("tensorrt", params)], GPU_BUILD, tmp_path)
    assert plan.names == [TENSORRT, CUDA, CPU]
    trt_options = plan.providers[0][1]
    assert trt_options == {
        "device_id": "0",
        "trt_fp16_enable": "True",
        "trt_max_workspace_size": "1073741824",
        "trt_engine_cache_enable": "true",
        "trt_engine_cache_path": "/var/cache/engines",
    }


def test_tensorrt_engines_are_cached_in_the_state_directory_by_default(tmp_path: Path) -> None:
    plan = plan_providers("KIND_GPU", 0, [("tensorrt", {"precision_mode": "INT8"})], GPU_BUILD,
                          tmp_path)
    options = plan.providers[0][1]
    assert options["trt_engine_cache_enable"] == "True"
    assert options["trt_engine_cache_path"] == str(tmp_path / "trt-engines")
    assert options["trt_int8_enable"] == "True"
    # Without a state directory nothing is cached (ONNX Runtime's default).
    bare = plan_providers("KIND_GPU", 0, [("tensorrt", {})], GPU_BUILD).providers[0][1]
    assert "trt_engine_cache_enable" not in bare


def test_accelerator_errors_name_the_parameter() -> None:
    with pytest.raises(ModelLoadError, match="must be FP32, FP16 or INT8, got 'FP8'"):
        plan_providers("KIND_GPU", 0, [("tensorrt", {"precision_mode": "FP8"})], GPU_BUILD)
    with pytest.raises(ModelLoadError, match="unknown parameter 'max_batch'"):
        plan_providers("KIND_GPU", 0, [("tensorrt", {"max_batch": "4"})], GPU_BUILD)
    with pytest.raises(ModelLoadError, match="accelerator 'openvino' is not supported"):
        plan_providers("KIND_GPU", 0, [("openvino", {})], GPU_BUILD)
    with pytest.raises(ModelLoadError, match="unknown parameter"):
        plan_providers("KIND_GPU", 0, [("cuda", {"bogus": "1"})], GPU_BUILD)


def test_missing_tensorrt_provider_is_noted_and_cuda_used() -> None:
    plan = plan_providers("KIND_GPU", 0, [("tensorrt", {})], [CUDA, CPU])
    assert plan.names == [CUDA, CPU]
    assert "not in this onnxruntime build" in plan.notes[0]


def test_a_gpu_session_that_came_up_on_cpu_is_reported() -> None:
    plan = plan_providers("KIND_GPU", 0, [], GPU_BUILD)
    assert fallen_back(plan, [CUDA, CPU]) == ""
    assert "did not initialise" in fallen_back(plan, [CPU])
