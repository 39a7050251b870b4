"""The control service called directly, with no transport: real ONNX models loaded by a real
ModelRuntime from a temporary repository, answers checked as typed results."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from multiprocessing import shared_memory
from pathlib import Path

import numpy as np
import pytest

from appliance import __version__
from appliance.common.errors import (
    ApplianceError,
    ErrorCode,
    InvalidInput,
    ModelNotFound,
    ModelNotReady,
)
from appliance.common.settings import ServerSettings
from appliance.common.types import InferRequest, Tensor
from appliance.ops.logs import LogSettings, LogState
from appliance.runtime.models import ModelRuntime
from appliance.runtime.settings import RuntimeSettings
from appliance.services.control import ControlService, ServerState
from appliance.services.inference import InferenceService
from appliance.services.results import (
    BatchStatistics,
    IndexRow,
    ModelMetadata,
    StatisticDuration,
    SystemSharedMemoryRegion,
    TensorMetadata,
    TraceSettings,
)
from appliance.services.shared_memory import RegionExists
from configs.generate import SIMPLE_CONFIG, save, simple_model

SIMPLE_TENSORS = (
    (TensorMetadata("INPUT0", "INT32", (-1, 16)), TensorMetadata("INPUT1", "INT32", (-1, 16))),
    (TensorMetadata("OUTPUT0", "INT32", (-1, 16)), TensorMetadata("OUTPUT1", "INT32", (-1, 16))),
)


def _repository(root: Path) -> Path:
    for name, versions, extra in (
        ("simple", (1,), ""),
        ("versioned", (1, 2), "version_policy: { all { } }\n"),
        ("never_loaded", (1,), ""),
    ):
        for version in versions:
            save(simple_model(), root / name / str(version) / "model.onnx")
        config = SIMPLE_CONFIG.replace('"simple"', f'"{name}"') + extra
        (root / name / "config.pbtxt").write_text(config)
    broken = root / "broken" / "1" / "model.onnx"
    broken.parent.mkdir(parents=True)
    broken.write_bytes(b"this is not an onnx file")
    return root


@dataclass
class Services:
    runtime: ModelRuntime
    control: ControlService
    inference: InferenceService


@pytest.fixture
async def services(tmp_path: Path) -> AsyncIterator[Services]:
    settings = ServerSettings(model_repositories=(_repository(tmp_path / "models"),))
    runtime = ModelRuntime(RuntimeSettings.from_server(settings))
    await runtime.load_all(["simple", "versioned", "broken"])
    control = ControlService(
        runtime,
        ServerState(loading_done=True),
        "explicit",
        False,
        logs=LogSettings(),
        allow_client_shm=True,
    )
    try:
        yield Services(runtime, control, InferenceService(runtime))
    finally:
        await runtime.stop(5.0)


def _request(model: str, version: str = "", batch: int = 1) -> InferRequest:
    data = np.arange(batch * 16, dtype=np.int32).reshape(batch, 16)
    inputs = [Tensor(name, "INT32", data.shape, data) for name in ("INPUT0", "INPUT1")]
    return InferRequest(model_name=model, model_version=version, inputs=inputs)


async def test_health(services: Services) -> None:
    control = services.control
    assert control.server_live()
    assert control.server_ready()
    assert control.model_ready("simple")
    assert control.model_ready("versioned", "1")
    assert not control.model_ready("versioned", "3")
    assert not control.model_ready("broken")
    assert not control.model_ready("never_loaded")


async def test_server_metadata(services: Services) -> None:
    result = services.control.server_metadata()
    assert (result.name, result.version) == ("triton", __version__)
    assert "model_repository" in result.extensions
    assert "system_shared_memory" in result.extensions
    assert result.build["version"] == __version__
    assert "onnxruntime" in result.build["backends"]


async def test_model_metadata(services: Services) -> None:
    control = services.control
    assert control.model_metadata("simple") == ModelMetadata(
        "simple", (1,), "onnxruntime_onnx", *SIMPLE_TENSORS
    )
    assert control.model_metadata("versioned", "1") == ModelMetadata(
        "versioned", (1, 2), "onnxruntime_onnx", *SIMPLE_TENSORS
    )


async def test_model_metadata_errors(services: Services) -> None:
    control = services.control
    with pytest.raises(ModelNotFound, match="Request for unknown model: 'nope' is not found"):
        control.model_metadata("nope")
    with pytest.raises(ModelNotFound, match="'versioned' version 7 is not found"):
        control.model_metadata("versioned", "7")
    with pytest.raises(InvalidInput, match="version string 'x'"):
        control.model_metadata("simple", "x")
    with pytest.raises(ModelNotFound, match="'broken' has no available versions: version 1"):
        control.model_metadata("broken")


async def test_model_config(services: Services) -> None:
    config = services.control.model_config("versioned", "2")
    assert config.name == "versioned"
    assert config.max_batch_size == 8
    assert [i.name for i in config.input] == ["INPUT0", "INPUT1"]


async def test_statistics_count_what_ran(services: Services) -> None:
    control, inference = services.control, services.inference
    await inference.infer(_request("simple", batch=2))
    await inference.infer(_request("versioned", "1"))
    [simple] = control.statistics("simple")
    assert (simple.name, simple.version) == ("simple", 1)
    assert (simple.inference_count, simple.execution_count) == (2, 1)
    assert simple.last_inference_ms > 0
    stats = simple.inference_stats
    assert stats.success.count == 1
    assert stats.success.ns > 0
    assert stats.fail == StatisticDuration(0, 0)
    assert stats.cache_hit == StatisticDuration(0, 0)
    [batch] = simple.batch_stats
    assert isinstance(batch, BatchStatistics)
    assert batch.batch_size == 2
    assert batch.compute_infer.count == 1
    # A model's ready versions in order; every ready version of every model without a name.
    assert [(s.version, s.inference_count) for s in control.statistics("versioned")] == [
        (1, 1),
        (2, 0),
    ]
    assert [s.version for s in control.statistics("versioned", "2")] == [2]
    everything = [(s.name, s.version) for s in control.statistics()]
    assert sorted(everything) == [("simple", 1), ("versioned", 1), ("versioned", 2)]


async def test_statistics_errors(services: Services) -> None:
    control = services.control
    with pytest.raises(InvalidInput, match="requested model 'nope' is not available"):
        control.statistics("nope")
    with pytest.raises(InvalidInput, match="requested model 'broken' is not available"):
        control.statistics("broken")


async def test_repository_index(services: Services) -> None:
    rows = services.control.repository_index()
    assert [(r.name, r.version, r.state) for r in rows] == [
        ("broken", 1, "UNAVAILABLE"),
        ("never_loaded", None, ""),
        ("simple", 1, "READY"),
        ("versioned", 1, "READY"),
        ("versioned", 2, "READY"),
    ]
    assert "onnxruntime cannot load" in rows[0].reason
    assert services.control.repository_index(ready_only=True) == [
        IndexRow("simple", 1, "READY", ""),
        IndexRow("versioned", 1, "READY", ""),
        IndexRow("versioned", 2, "READY", ""),
    ]


async def test_load_and_unload_show_in_the_index(services: Services) -> None:
    control = services.control
    await control.unload_model("versioned")
    await control.load_model("never_loaded", {})
    rows = {(r.name, r.version): r for r in control.repository_index()}
    assert rows["versioned", None] == IndexRow("versioned", None, "UNAVAILABLE", "unloaded")
    assert rows["never_loaded", 1] == IndexRow("never_loaded", 1, "READY", "")
    assert not control.model_ready("versioned")


async def test_load_needs_explicit_mode(services: Services) -> None:
    polling = ControlService(services.runtime, ServerState(), "poll", False)
    with pytest.raises(ModelNotReady, match="not allowed if polling is enabled"):
        await polling.load_model("simple", {})


async def test_trace_settings(services: Services) -> None:
    control = services.control
    default = TraceSettings("", ("OFF",), "1000", "-1", "0", "triton")
    assert control.trace_settings() == default
    changed = control.trace_settings("simple", {"trace_rate": "5", "trace_level": ["OFF"]})
    assert changed == TraceSettings("", ("OFF",), "5", "-1", "0", "triton")
    assert control.trace_settings("simple") == changed
    assert control.trace_settings() == default  # a model's override stays its own
    assert control.trace_settings("simple", {"trace_rate": None}) == default
    with pytest.raises(InvalidInput, match=r"^Request for unknown model : nope$"):
        control.trace_settings("nope")
    with pytest.raises(InvalidInput, match="unknown trace setting 'bogus'"):
        control.trace_settings("", {"bogus": "1"})


async def test_log_settings(services: Services) -> None:
    control = services.control
    assert control.log_settings() == LogState()
    assert control.log_settings({"log_verbose_level": 1, "log_info": False}) == LogState(
        log_info=False, log_verbose_level=1
    )
    assert control.log_settings().log_verbose_level == 1
    with pytest.raises(InvalidInput, match="'log_verbose_level' must be an integer >= 0"):
        control.log_settings({"log_verbose_level": "x"})


async def test_system_shared_memory(services: Services) -> None:
    control = services.control
    memory = shared_memory.SharedMemory(create=True, size=4096)
    key = "/" + memory.name
    try:
        assert control.system_shared_memory_status() == []
        control.register_system_shared_memory("input", key, 8, 32)
        region = SystemSharedMemoryRegion("input", key, 8, 32)
        assert control.system_shared_memory_status() == [region]
        assert control.system_shared_memory_status("input") == [region]
        with pytest.raises(RegionExists, match="'input' already in manager"):
            control.register_system_shared_memory("input", key, 0, 8)
        with pytest.raises(InvalidInput, match="byte_size must be an integer > 0"):
            control.register_system_shared_memory("other", key, 0, 0)
        with pytest.raises(ModelNotFound, match="Unable to find system shared memory region"):
            control.system_shared_memory_status("other")
        control.unregister_system_shared_memory("input")
        assert control.system_shared_memory_status() == []
    finally:
        control.unregister_system_shared_memory()
        memory.close()
        memory.unlink()


async def test_cuda_shared_memory_refuses_a_bad_handle(services: Services) -> None:
    control = services.control
    assert control.cuda_shared_memory_status() == []
    with pytest.raises(ApplianceError) as caught:
        await control.register_cuda_shared_memory("gpu", bytes(64), 0, 64)
    # No CUDA here: UNSUPPORTED with the reason; on a GPU, a zero handle is refused.
    assert caught.value.code in (ErrorCode.UNSUPPORTED, ErrorCode.INVALID_ARG)
    assert control.cuda_shared_memory_status() == []
    with pytest.raises(ModelNotFound, match="Unable to find cuda shared memory region: 'gpu'"):
        control.cuda_shared_memory_status("gpu")
    control.unregister_cuda_shared_memory()  # nothing registered: nothing to do
