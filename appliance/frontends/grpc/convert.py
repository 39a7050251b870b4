"""The control service's typed results as the protobuf messages of Triton's gRPC API.

Each message is built field by field, never parsed from the HTTP side's JSON. Fields the
message does not have (server metadata's "build") are left out; versions become strings.
"""

from __future__ import annotations

from appliance.common.protocol import service_pb2 as pb
from appliance.ops.logs import LogState
from appliance.services.results import (
    INFER_DURATIONS,
    CudaSharedMemoryRegion,
    IndexRow,
    ModelMetadata,
    ModelStatistics,
    ServerMetadata,
    StatisticDuration,
    SystemSharedMemoryRegion,
    TensorMetadata,
    TraceSettings,
)


def server_metadata(result: ServerMetadata) -> pb.ServerMetadataResponse:
    return pb.ServerMetadataResponse(
        name=result.name, version=result.version, extensions=result.extensions
    )


def _tensor(tensor: TensorMetadata) -> pb.ModelMetadataResponse.TensorMetadata:
    return pb.ModelMetadataResponse.TensorMetadata(
        name=tensor.name, datatype=tensor.datatype, shape=tensor.shape
    )


def model_metadata(result: ModelMetadata) -> pb.ModelMetadataResponse:
    return pb.ModelMetadataResponse(
        name=result.name,
        versions=[str(v) for v in result.versions],
        platform=result.platform,
        inputs=[_tensor(t) for t in result.inputs],
        outputs=[_tensor(t) for t in result.outputs],
    )


def _duration(duration: StatisticDuration) -> pb.StatisticDuration:
    # Set even when zero: Triton's clients see every duration present ("fail {}").
    return pb.StatisticDuration(count=duration.count, ns=duration.ns)


def _model_statistics(row: ModelStatistics) -> pb.ModelStatistics:
    stats = row.inference_stats
    return pb.ModelStatistics(
        name=row.name,
        version=str(row.version),
        last_inference=row.last_inference_ms,
        inference_count=row.inference_count,
        execution_count=row.execution_count,
        inference_stats=pb.InferStatistics(
            **{name: _duration(getattr(stats, name)) for name in INFER_DURATIONS}
        ),
        batch_stats=[
            pb.InferBatchStatistics(
                batch_size=batch.batch_size,
                compute_input=_duration(batch.compute_input),
                compute_infer=_duration(batch.compute_infer),
                compute_output=_duration(batch.compute_output),
            )
            for batch in row.batch_stats
        ],
    )


def statistics(rows: list[ModelStatistics]) -> pb.ModelStatisticsResponse:
    return pb.ModelStatisticsResponse(model_stats=[_model_statistics(row) for row in rows])


def repository_index(rows: list[IndexRow]) -> pb.RepositoryIndexResponse:
    """A model with no version to show has an empty version string."""
    return pb.RepositoryIndexResponse(
        models=[
            pb.RepositoryIndexResponse.ModelIndex(
                name=row.name,
                version="" if row.version is None else str(row.version),
                state=row.state,
                reason=row.reason,
            )
            for row in rows
        ]
    )


def trace_settings(result: TraceSettings) -> pb.TraceSettingResponse:
    response = pb.TraceSettingResponse()
    values: dict[str, tuple[str, ...]] = {
        "trace_file": (result.trace_file,),
        "trace_level": result.trace_level,
        "trace_rate": (result.trace_rate,),
        "trace_count": (result.trace_count,),
        "log_frequency": (result.log_frequency,),
        "trace_mode": (result.trace_mode,),
    }
    for key, value in values.items():
        response.settings[key].value.extend(value)
    return response


def log_settings(state: LogState) -> pb.LogSettingsResponse:
    response = pb.LogSettingsResponse()
    settings = response.settings
    settings["log_file"].string_param = state.log_file
    settings["log_info"].bool_param = state.log_info
    settings["log_warning"].bool_param = state.log_warning
    settings["log_error"].bool_param = state.log_error
    settings["log_verbose_level"].uint32_param = state.log_verbose_level
    settings["log_format"].string_param = state.log_format
    return response


def system_shared_memory_status(
    regions: list[SystemSharedMemoryRegion],
) -> pb.SystemSharedMemoryStatusResponse:
    response = pb.SystemSharedMemoryStatusResponse()
    for region in regions:
        response.regions[region.name].CopyFrom(
            pb.SystemSharedMemoryStatusResponse.RegionStatus(
                name=region.name, key=region.key, offset=region.offset, byte_size=region.byte_size
            )
        )
    return response


def cuda_shared_memory_status(
    regions: list[CudaSharedMemoryRegion],
) -> pb.CudaSharedMemoryStatusResponse:
    response = pb.CudaSharedMemoryStatusResponse()
    for region in regions:
        response.regions[region.name].CopyFrom(
            pb.CudaSharedMemoryStatusResponse.RegionStatus(
                name=region.name, device_id=region.device_id, byte_size=region.byte_size
            )
        )
    return response
