"""The control service's typed results as the JSON objects of Triton's HTTP API.

Key order is Triton's (and what this server has always sent); versions become strings.
"""

from __future__ import annotations

from typing import Any

from appliance.common.protocol import model_config_pb2 as mc
from appliance.common.protojson import message_to_dict
from appliance.ops.logs import LogState
from appliance.services.results import (
    INFER_DURATIONS,
    CudaSharedMemoryRegion,
    IndexRow,
    ModelMetadata,
    ModelStatistics,
    Readiness,
    ServerMetadata,
    StatisticDuration,
    SystemSharedMemoryRegion,
    TensorMetadata,
    TraceSettings,
)


def server_metadata(result: ServerMetadata) -> dict[str, Any]:
    return {
        "name": result.name,
        "version": result.version,
        "extensions": list(result.extensions),
        "build": result.build,
    }


def _tensor(tensor: TensorMetadata) -> dict[str, Any]:
    return {"name": tensor.name, "datatype": tensor.datatype, "shape": list(tensor.shape)}


def model_metadata(result: ModelMetadata) -> dict[str, Any]:
    return {
        "name": result.name,
        "versions": [str(v) for v in result.versions],
        "platform": result.platform,
        "inputs": [_tensor(t) for t in result.inputs],
        "outputs": [_tensor(t) for t in result.outputs],
    }


def model_config(config: mc.ModelConfig) -> dict[str, Any]:
    """Every field, names as in the .proto, 64-bit integers as numbers (as Triton writes it)."""
    return message_to_dict(config)


def _duration(duration: StatisticDuration) -> dict[str, int]:
    return {"count": duration.count, "ns": duration.ns}


def _model_statistics(row: ModelStatistics) -> dict[str, Any]:
    stats = row.inference_stats
    return {
        "name": row.name,
        "version": str(row.version),
        "last_inference": row.last_inference_ms,
        "inference_count": row.inference_count,
        "execution_count": row.execution_count,
        "inference_stats": {name: _duration(getattr(stats, name)) for name in INFER_DURATIONS},
        # Per-response (decoupled) and memory statistics are not kept: empty, as Triton
        # sends them then.
        "response_stats": {},
        "batch_stats": [
            {
                "batch_size": batch.batch_size,
                "compute_input": _duration(batch.compute_input),
                "compute_infer": _duration(batch.compute_infer),
                "compute_output": _duration(batch.compute_output),
            }
            for batch in row.batch_stats
        ],
        "memory_usage": [],
    }


def statistics(rows: list[ModelStatistics]) -> dict[str, Any]:
    return {"model_stats": [_model_statistics(row) for row in rows]}


def repository_index(rows: list[IndexRow]) -> list[dict[str, Any]]:
    """A model with no version to show has no "version" key, an empty state (never loaded) no
    "state" key, an empty reason (a READY entry's) no "reason" key, as tritonserver writes them."""
    index = []
    for row in rows:
        entry: dict[str, Any] = {"name": row.name}
        if row.version is not None:
            entry["version"] = str(row.version)
        if row.state:  # a model never loaded: its name alone, as tritonserver lists it
            entry["state"] = row.state
        if row.reason:
            entry["reason"] = row.reason
        index.append(entry)
    return index


def readiness(result: Readiness) -> dict[str, Any]:
    """The body of `/v2/health/ready?verbose=true` (the plain one is empty, as Triton's)."""
    return {"ready": result.ready, "problems": list(result.problems), "notes": list(result.notes)}


def trace_settings(result: TraceSettings) -> dict[str, Any]:
    return {
        "trace_file": result.trace_file,
        "trace_level": list(result.trace_level),
        "trace_rate": result.trace_rate,
        "trace_count": result.trace_count,
        "log_frequency": result.log_frequency,
        "trace_mode": result.trace_mode,
    }


def log_settings(state: LogState) -> dict[str, Any]:
    return {
        "log_file": state.log_file,
        "log_info": state.log_info,
        "log_warning": state.log_warning,
        "log_error": state.log_error,
        "log_verbose_level": state.log_verbose_level,
        "log_format": state.log_format,
    }


def system_shared_memory_status(regions: list[SystemSharedMemoryRegion]) -> list[dict[str, Any]]:
    return [
        {"name": r.name, "key": r.key, "offset": r.offset, "byte_size": r.byte_size}
        for r in regions
    ]


def cuda_shared_memory_status(regions: list[CudaSharedMemoryRegion]) -> list[dict[str, Any]]:
    return [{"name": r.name, "device_id": r.device_id, "byte_size": r.byte_size} for r in regions]
