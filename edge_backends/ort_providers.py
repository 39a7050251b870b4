"""Which ONNX Runtime execution providers an instance asks for, with which options.

Triton's onnxruntime_backend names GPU accelerators in the model config::

    optimization { execution_accelerators {
      gpu_execution_accelerator : [ {
        name : "tensorrt"
        parameters { key: "precision_mode" value: "FP16" }
        parameters { key: "max_workspace_size_bytes" value: "1073741824" }
        parameters { key: "trt_engine_cache_enable" value: "true" }
      } ]
    } }

Those names are mapped here onto ONNX Runtime's provider options. A pure function, so each rule
is tested without a GPU; unverified on hardware until a device with onnxruntime-gpu runs it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from edge_backends.api import ModelLoadError

CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"
TENSORRT = "TensorrtExecutionProvider"

# onnxruntime_backend's TensorRT accelerator parameters -> TensorRT EP options (same meaning).
_TRT_OPTIONS = {
    "max_workspace_size_bytes": "trt_max_workspace_size",
    "int8_calibration_table_name": "trt_int8_calibration_table_name",
    "int8_use_native_calibration_table": "trt_int8_use_native_calibration_table",
    **{
        name: name
        for name in (
            "trt_max_partition_iterations",
            "trt_min_subgraph_size",
            "trt_dla_enable",
            "trt_dla_core",
            "trt_engine_cache_enable",
            "trt_engine_cache_path",
            "trt_timing_cache_enable",
            "trt_timing_cache_path",
            "trt_layer_norm_fp32_fallback",
            "trt_build_heuristics_enable",
            "trt_sparsity_enable",
            "trt_builder_optimization_level",
            "trt_auxiliary_streams",
            "trt_force_sequential_engine_build",
            "trt_context_memory_sharing_enable",
            "trt_cuda_graph_enable",
            "trt_profile_min_shapes",
            "trt_profile_max_shapes",
            "trt_profile_opt_shapes",
        )
    },
}
_PRECISIONS = {"FP32": {}, "FP16": {"trt_fp16_enable": "True"},
               "INT8": {"trt_fp16_enable": "True", "trt_int8_enable": "True"}}
# The CUDA accelerator's parameters are CUDA EP options as they are.
_CUDA_OPTIONS = frozenset((
    "cudnn_conv_algo_search", "gpu_mem_limit", "arena_extend_strategy",
    "cudnn_conv_use_max_workspace", "cudnn_conv1d_pad_to_nc1d", "do_copy_in_default_stream",
    "enable_cuda_graph", "use_tf32", "prefer_nhwc",
))


@dataclass(frozen=True)
class ProviderPlan:
    providers: list[tuple[str, dict[str, str]]]
    notes: list[str] = field(default_factory=list)

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.providers]


def _trt_options(
    params: Mapping[str, str], device_id: int, cache_dir: Path | None
) -> dict[str, str]:
    options = {"device_id": str(device_id)}
    for key, value in params.items():
        if key == "precision_mode":
            try:
                options.update(_PRECISIONS[value.upper()])
            except KeyError:
                raise ModelLoadError(
                    f"tensorrt accelerator: precision_mode must be FP32, FP16 or INT8, got "
                    f"'{value}'"
                ) from None
        elif key in _TRT_OPTIONS:
            options[_TRT_OPTIONS[key]] = value
        else:
            raise ModelLoadError(
                f"tensorrt accelerator: unknown parameter '{key}'; known: precision_mode, "
                + ", ".join(sorted(_TRT_OPTIONS))
            )
    # Building an engine takes minutes on a Jetson: keep them, per device, in the state folder.
    if cache_dir is not None and "trt_engine_cache_enable" not in params:
        options["trt_engine_cache_enable"] = "True"
        options.setdefault("trt_engine_cache_path", str(cache_dir / "trt-engines"))
        options.setdefault("trt_timing_cache_enable", "True")
        options.setdefault("trt_timing_cache_path", str(cache_dir / "trt-engines"))
    return options


def plan_providers(
    kind: str,
    device_id: int,
    accelerators: Sequence[tuple[str, Mapping[str, str]]],
    available: Sequence[str],
    cache_dir: Path | None = None,
) -> ProviderPlan:
    """The providers, best first, for an instance of `kind` (already resolved to KIND_CPU or
    KIND_GPU by the server), given the providers this onnxruntime build has."""
    if kind != "KIND_GPU":
        return ProviderPlan([(CPU, {})])
    notes = []
    providers: list[tuple[str, dict[str, str]]] = []
    cuda_options = {"device_id": str(device_id)}
    for name, params in accelerators:
        if name == "tensorrt":
            options = _trt_options(params, device_id, cache_dir)
            if TENSORRT in available:
                providers.append((TENSORRT, options))
            else:
                notes.append(
                    "the tensorrt accelerator is not in this onnxruntime build; "
                    "running with the CUDA execution provider"
                )
        elif name == "cuda":
            unknown = sorted(set(params) - _CUDA_OPTIONS)
            if unknown:
                raise ModelLoadError(
                    f"cuda accelerator: unknown parameter(s) {', '.join(unknown)}; known: "
                    + ", ".join(sorted(_CUDA_OPTIONS))
                )
            cuda_options.update(params)
        else:
            raise ModelLoadError(
                f"gpu_execution_accelerator '{name}' is not supported; use 'tensorrt' or 'cuda'"
            )
    if CUDA in available:
        providers.append((CUDA, cuda_options))
    providers.append((CPU, {}))
    return ProviderPlan(providers, notes)


def fallen_back(plan: ProviderPlan, active: Sequence[str]) -> str:
    """Why a GPU session is running on CPU after all ('' when it is not): ONNX Runtime drops a
    provider that fails to initialise (no driver, no device) without raising."""
    wanted_gpu = [name for name in plan.names if name != CPU]
    if wanted_gpu and not any(name in active for name in wanted_gpu):
        return (
            f"{', '.join(wanted_gpu)} did not initialise (no GPU device or driver?); "
            "running on CPU"
        )
    return ""
