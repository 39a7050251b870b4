"""What the control service answers, as plain typed values before any protocol shapes them.

Each front end has one converter from these to its wire form (`frontends/http/convert.py`: JSON
objects, `frontends/grpc/convert.py`: protobuf messages), so both protocols say the same thing
and neither parses the other's. Versions are integers here; the converters write Triton's
strings. The log settings are `appliance.ops.logs.LogState`, already a frozen value in Triton's
names; the model configuration is the `ModelConfig` protobuf message, the schema itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class ServerMetadata:
    name: str
    version: str
    extensions: tuple[str, ...]
    # Commit, Python, platform, backends: the HTTP JSON carries it (tritonclient ignores it);
    # the gRPC message has no such field.
    build: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TensorMetadata:
    name: str
    datatype: str
    shape: tuple[int, ...]  # with -1 first for a batching model's batch dimension


@dataclass(frozen=True, slots=True)
class ModelMetadata:
    name: str
    versions: tuple[int, ...]  # the ready versions, ascending
    platform: str
    inputs: tuple[TensorMetadata, ...]
    outputs: tuple[TensorMetadata, ...]


@dataclass(frozen=True, slots=True)
class StatisticDuration:
    count: int = 0
    ns: int = 0


@dataclass(frozen=True, slots=True)
class InferStatistics:
    success: StatisticDuration
    fail: StatisticDuration
    queue: StatisticDuration
    compute_input: StatisticDuration
    compute_infer: StatisticDuration
    compute_output: StatisticDuration
    cache_hit: StatisticDuration
    cache_miss: StatisticDuration


# InferStatistics' durations in Triton's order; the converters and the rows iterate them.
INFER_DURATIONS = (
    "success",
    "fail",
    "queue",
    "compute_input",
    "compute_infer",
    "compute_output",
    "cache_hit",
    "cache_miss",
)


@dataclass(frozen=True, slots=True)
class BatchStatistics:
    """One batch size's executions (each execution counted once)."""

    batch_size: int
    compute_input: StatisticDuration
    compute_infer: StatisticDuration
    compute_output: StatisticDuration


@dataclass(frozen=True, slots=True)
class ModelStatistics:
    """A snapshot of one model version's counters (Triton's statistics extension)."""

    name: str
    version: int
    last_inference_ms: int  # wall clock, ms since the epoch; 0: never
    inference_count: int
    execution_count: int
    inference_stats: InferStatistics
    batch_stats: tuple[BatchStatistics, ...]  # by ascending batch size


@dataclass(frozen=True, slots=True)
class IndexRow:
    """One row of the repository index: a model version, or a model with no version to show
    (never loaded: state and reason empty; or failed as a whole)."""

    name: str
    version: int | None
    state: str  # READY, UNAVAILABLE, LOADING, UNLOADING, or "" when never loaded
    reason: str


@dataclass(frozen=True, slots=True)
class Readiness:
    """The server's readiness and why: what keeps a model from serving (a version not fetched
    for lack of disk, one that failed), and notes on what serves (a pin)."""

    ready: bool
    problems: tuple[str, ...]
    notes: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class TraceSettings:
    """The effective trace settings (global, or a model's with its overrides).

    Values stay the strings clients sent (Triton's protocol carries strings), checked valid.
    """

    trace_file: str
    trace_level: tuple[str, ...]
    trace_rate: str
    trace_count: str
    log_frequency: str
    trace_mode: str


@dataclass(frozen=True, slots=True)
class SystemSharedMemoryRegion:
    name: str
    key: str
    offset: int
    byte_size: int


@dataclass(frozen=True, slots=True)
class CudaSharedMemoryRegion:
    name: str
    device_id: int
    byte_size: int
