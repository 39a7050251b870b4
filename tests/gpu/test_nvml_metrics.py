"""On a machine with an NVIDIA GPU: the real server's GPU metrics match what NVML says."""

from __future__ import annotations

import importlib
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from appliance.ops.gpu import NvmlSource

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def nvml() -> Iterator[Any]:
    try:
        module: Any = importlib.import_module("pynvml")
        module.nvmlInit()
    except Exception:
        pytest.skip("no NVIDIA GPU (NVML)")
    try:
        if module.nvmlDeviceGetCount() == 0:
            pytest.skip("no NVIDIA GPU (NVML)")
        yield module
    finally:
        module.nvmlShutdown()


def nvml_value(call: Any, handle: Any) -> Any:
    """The value, or None where the device does not support the call (as the server does)."""
    nvml = importlib.import_module("pynvml")
    try:
        return call(handle)
    except nvml.NVMLError_NotSupported:
        return None


def test_server_reports_every_gpu_with_nvml_values(start_server, tmp_path: Path, nvml: Any) -> None:  # type: ignore[no-untyped-def]
    proc = start_server(tmp_path, "--allow-gpu-metrics=true", "--metrics-interval-ms=0")
    with urllib.request.urlopen(f"http://127.0.0.1:{proc.metrics_port}/metrics") as resp:
        text = resp.read().decode()
    samples = {
        (sample.name, sample.labels.get("gpu_uuid")): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
    assert " INFO appliance.ops.gpu: GPU metrics from NVML, " in proc.log()
    uuids = set()
    for index in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        uuid = nvml.nvmlDeviceGetUUID(handle)
        uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
        uuids.add(uuid)
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        assert samples[("nv_gpu_memory_total_bytes", uuid)] == memory.total
        assert 0 < samples[("nv_gpu_memory_used_bytes", uuid)] <= memory.total
        assert 0.0 <= samples[("nv_gpu_utilization", uuid)] <= 1.0
        power_mw = nvml_value(nvml.nvmlDeviceGetPowerUsage, handle)
        if power_mw is None:
            assert ("nv_gpu_power_usage", uuid) not in samples
        else:
            assert samples[("nv_gpu_power_usage", uuid)] > 0
        limit_mw = nvml_value(nvml.nvmlDeviceGetEnforcedPowerLimit, handle)
        if limit_mw is None:
            assert ("nv_gpu_power_limit", uuid) not in samples
        else:
            assert samples[("nv_gpu_power_limit", uuid)] == limit_mw / 1000
        if nvml_value(nvml.nvmlDeviceGetTotalEnergyConsumption, handle) is not None:
            assert samples[("nv_energy_consumption", uuid)] >= 0
    reported = {uuid for name, uuid in samples if name.startswith("nv_gpu_")}
    assert reported == uuids


def test_one_nvml_read_of_every_gpu(nvml: Any) -> None:
    """Prints how long one uncached read takes (the cost a scrape pays once per interval)."""
    source = NvmlSource(nvml, interval_s=0)
    source.read()
    started = time.perf_counter()
    readings = source.read()
    elapsed_ms = (time.perf_counter() - started) * 1000
    print(f"NVML read of {len(readings)} GPU(s): {elapsed_ms:.2f} ms")  # noqa: T201
    assert all(reading.values for reading in readings)
