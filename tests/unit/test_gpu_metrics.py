"""GPU metrics: fake Jetson sysfs trees, a fake NVML module, and no GPU at all."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from appliance.face import cli
from appliance.ops.gpu import (
    GpuCollector,
    GpuSource,
    JetsonSource,
    NvmlSource,
    find_gpu_source,
)
from appliance.services.metrics import build_registry

MEMINFO = "MemTotal:       32000000 kB\nMemFree:         1000000 kB\nMemAvailable:   24000000 kB\n"


def scrape(source: GpuSource) -> tuple[str, dict[tuple[str, str], float]]:
    """The exposition text, and {(sample name, gpu_uuid): value} parsed back from it."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(GpuCollector(source))
    text = generate_latest(registry).decode()
    samples = {
        (sample.name, sample.labels["gpu_uuid"]): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
    return text, samples


def write(root: Path, relative: str, text: str) -> Path:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def hwmon_rail(chip: Path, channel: int, label: str, millivolts: int, milliamps: int) -> None:
    folder = chip / "hwmon" / "hwmon3"
    write(folder, f"in{channel}_label", label + "\n")
    write(folder, f"in{channel}_input", f"{millivolts}\n")
    write(folder, f"curr{channel}_input", f"{milliamps}\n")


def orin_tree(root: Path, load_at: str) -> None:
    """An AGX Orin (JetPack 5 / 6): two INA3221 chips under hwmon, the model in /proc."""
    if load_at == "devfreq":
        # Only reachable the way jetson-stats finds it: a devfreq device whose of_node is a GPU.
        node = root / "sys/devices/platform/bus@0/17000000.gpu-x"
        write(node, "load", "523\n")
        write(node, "of_node/name", "ga10b\x00")
        write(node, "of_node/compatible", "nvidia,ga10b\x00")
        devfreq = root / "sys/class/devfreq/17000000.gpu"
        devfreq.mkdir(parents=True)
        (devfreq / "device").symlink_to(node)
        # Another devfreq device (the memory controller) that must not be taken for the GPU.
        emc = root / "sys/devices/platform/emc"
        write(emc, "load", "999\n")
        write(emc, "of_node/name", "external-memory-controller\x00")
        write(emc, "of_node/compatible", "nvidia,tegra234-emc\x00")
        (root / "sys/class/devfreq/emc").mkdir(parents=True)
        (root / "sys/class/devfreq/emc/device").symlink_to(emc)
    else:
        write(root, load_at, "523\n")
    write(root, "proc/meminfo", MEMINFO)
    write(root, "proc/device-tree/model", "NVIDIA Jetson AGX Orin Developer Kit\x00")
    first = root / "sys/bus/i2c/drivers/ina3221/1-0040"
    hwmon_rail(first, 1, "VDD_GPU_SOC", 5072, 1200)
    hwmon_rail(first, 2, "VDD_CPU_CV", 5072, 400)
    hwmon_rail(first, 3, "VIN_SYS_5V0", 5000, 900)
    hwmon_rail(first, 7, "sum of shunt voltages", 1, 1)
    second = root / "sys/bus/i2c/drivers/ina3221/1-0041"
    hwmon_rail(second, 1, "NC", 0, 0)
    hwmon_rail(second, 2, "VDDQ_VDD2_1V8AO", 5000, 100)
    write(root, "sys/bus/i2c/drivers/ina3221/bind", "")  # driver files beside the devices


@pytest.mark.parametrize(
    "load_at",
    [
        "sys/devices/platform/bus@0/17000000.gpu/load",  # JetPack 6
        "sys/devices/17000000.ga10b/load",  # JetPack 5
        "devfreq",
    ],
)
def test_orin_tree_gives_load_shared_memory_and_the_gpu_rail(tmp_path: Path, load_at: str) -> None:
    orin_tree(tmp_path, load_at)
    source = JetsonSource.find(tmp_path)
    assert source is not None
    assert "power rail VDD_GPU_SOC" in source.description
    text, samples = scrape(source)
    uuid = "jetson-nvidia-jetson-agx-orin-developer-kit"
    assert samples == {
        ("nv_gpu_utilization", uuid): pytest.approx(0.523),
        ("nv_gpu_memory_total_bytes", uuid): 32000000 * 1024,
        ("nv_gpu_memory_used_bytes", uuid): (32000000 - 24000000) * 1024,
        ("nv_gpu_power_usage", uuid): pytest.approx(5.072 * 1.2),
    }
    assert "# HELP nv_gpu_utilization GPU utilization rate [0.0 - 1.0)" in text
    assert "# TYPE nv_gpu_memory_used_bytes gauge" in text
    assert "# HELP nv_gpu_power_usage GPU power usage in watts" in text


def test_nano_tree_reads_jetpack4_iio_power_in_milliwatts(tmp_path: Path) -> None:
    write(tmp_path, "sys/devices/gpu.0/load", "250\n")
    write(tmp_path, "proc/meminfo", MEMINFO)
    write(tmp_path, "sys/firmware/devicetree/base/model", "NVIDIA Jetson Nano Developer Kit\x00")
    iio = tmp_path / "sys/bus/i2c/drivers/ina3221x/6-0040/iio:device0"
    for channel, (rail, milliwatts) in enumerate(
        [("POM_5V_IN", 2368), ("POM_5V_GPU", 81), ("POM_5V_CPU", 405)]
    ):
        write(iio, f"rail_name_{channel}", rail + "\n")
        write(iio, f"in_power{channel}_input", f"{milliwatts}\n")
    source = find_gpu_source(root=tmp_path, nvml=failing_nvml())
    assert isinstance(source, JetsonSource)
    _, samples = scrape(source)
    uuid = "jetson-nvidia-jetson-nano-developer-kit"
    assert samples[("nv_gpu_utilization", uuid)] == pytest.approx(0.25)
    assert samples[("nv_gpu_power_usage", uuid)] == pytest.approx(0.081)
    assert samples[("nv_gpu_memory_total_bytes", uuid)] == 32000000 * 1024
    assert {name for name, _ in samples} == {
        "nv_gpu_utilization",
        "nv_gpu_memory_total_bytes",
        "nv_gpu_memory_used_bytes",
        "nv_gpu_power_usage",
    }


def test_orin_nano_uses_the_shared_cpu_gpu_rail_and_no_model_still_labels(tmp_path: Path) -> None:
    write(tmp_path, "sys/devices/platform/17000000.gpu/load", "1000\n")
    chip = tmp_path / "sys/bus/i2c/drivers/ina3221/1-0040"
    hwmon_rail(chip, 1, "VDD_IN", 5000, 1000)
    hwmon_rail(chip, 2, "VDD_CPU_GPU_CV", 5000, 300)
    hwmon_rail(chip, 3, "VDD_SOC", 5000, 200)
    source = JetsonSource.find(tmp_path)
    assert source is not None
    _, samples = scrape(source)
    # No /proc/meminfo in this tree: memory is left out, the rest is reported.
    assert samples == {
        ("nv_gpu_utilization", "jetson-igpu"): 1.0,
        ("nv_gpu_power_usage", "jetson-igpu"): pytest.approx(1.5),
    }


def test_another_socs_gpu_is_not_taken_for_a_jetson(tmp_path: Path) -> None:
    mali = tmp_path / "sys/devices/platform/fb000000.gpu"
    write(mali, "load", "500\n")
    write(mali, "of_node/name", "gpu\x00")
    write(mali, "of_node/compatible", "rockchip,rk3588-mali\x00arm,mali-valhall-csf\x00")
    (tmp_path / "sys/class/devfreq/fb000000.gpu").mkdir(parents=True)
    (tmp_path / "sys/class/devfreq/fb000000.gpu/device").symlink_to(mali)
    assert JetsonSource.find(tmp_path) is None


def test_jetson_without_power_monitor_and_with_vanished_files(tmp_path: Path) -> None:
    load = write(tmp_path, "sys/devices/gpu.0/load", "10\n")
    source = JetsonSource.find(tmp_path)
    assert source is not None
    assert "no GPU power rail" in source.description
    assert scrape(source)[1] == {("nv_gpu_utilization", "jetson-igpu"): pytest.approx(0.01)}
    load.unlink()
    text, samples = scrape(source)
    assert samples == {}
    assert "nv_gpu" not in text


class FakeNvml:
    """Enough of pynvml for NvmlSource: per-device values, some calls not supported."""

    class NVMLError(Exception):
        pass

    class NVMLError_NotSupported(NVMLError):  # pynvml's names
        pass

    def __init__(self, devices: list[dict[str, Any]]) -> None:
        self.devices = devices
        self.calls = 0
        self.initialised = 0

    def nvmlInit(self) -> None:
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        self.initialised -= 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> dict[str, Any]:
        return self.devices[index]

    def _get(self, handle: dict[str, Any], key: str) -> Any:
        self.calls += 1
        value = handle.get(key)
        if value is None:
            raise self.NVMLError_NotSupported("Not Supported")
        if isinstance(value, Exception):
            raise value
        return value

    def nvmlDeviceGetUUID(self, handle: dict[str, Any]) -> Any:
        return handle["uuid"]

    def nvmlDeviceGetUtilizationRates(self, handle: dict[str, Any]) -> Any:
        return SimpleNamespace(gpu=self._get(handle, "util"), memory=0)

    def nvmlDeviceGetMemoryInfo(self, handle: dict[str, Any]) -> Any:
        total, used = self._get(handle, "memory")
        return SimpleNamespace(total=total, used=used, free=total - used)

    def nvmlDeviceGetPowerUsage(self, handle: dict[str, Any]) -> int:
        return int(self._get(handle, "power_mw"))

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: dict[str, Any]) -> int:
        return int(self._get(handle, "limit_mw"))

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: dict[str, Any]) -> int:
        return int(self._get(handle, "energy_mj"))


def failing_nvml() -> FakeNvml:
    fake = FakeNvml([])

    def init() -> None:
        raise FakeNvml.NVMLError("NVML Shared Library Not Found")

    fake.nvmlInit = init  # type: ignore[method-assign]
    return fake


def two_gpus() -> FakeNvml:
    return FakeNvml(
        [
            {
                "uuid": "GPU-aaaa",
                "util": 37,
                "memory": (80 << 30, 5 << 30),
                "power_mw": 123456,
                "limit_mw": 700000,
                "energy_mj": 5_000_000,
            },
            {  # a device without power readings: NotSupported for those calls
                "uuid": b"GPU-bbbb",
                "util": 0,
                "memory": (16 << 30, 1 << 20),
            },
        ]
    )


def test_nvml_values_labels_and_not_supported_metrics_left_out() -> None:
    fake = two_gpus()
    source = find_gpu_source(nvml=fake)
    assert isinstance(source, NvmlSource)
    fake.devices[0]["energy_mj"] = 5_250_500  # 250.5 J since the server started
    text, samples = scrape(source)
    assert samples == {
        ("nv_gpu_utilization", "GPU-aaaa"): 0.37,
        ("nv_gpu_utilization", "GPU-bbbb"): 0.0,
        ("nv_gpu_memory_total_bytes", "GPU-aaaa"): 80 << 30,
        ("nv_gpu_memory_total_bytes", "GPU-bbbb"): 16 << 30,
        ("nv_gpu_memory_used_bytes", "GPU-aaaa"): 5 << 30,
        ("nv_gpu_memory_used_bytes", "GPU-bbbb"): 1 << 20,
        ("nv_gpu_power_usage", "GPU-aaaa"): 123.456,
        ("nv_gpu_power_limit", "GPU-aaaa"): 700.0,
        ("nv_energy_consumption_total", "GPU-aaaa"): 250.5,
    }
    assert "# HELP nv_gpu_power_limit GPU power management limit in watts" in text
    # Like every counter here, the sample has prometheus_client's _total suffix.
    assert "# TYPE nv_energy_consumption_total counter" in text


def test_nvml_readings_are_cached_for_the_interval() -> None:
    fake, now = two_gpus(), [100.0]
    source = NvmlSource(fake, interval_s=2.0, clock=lambda: now[0])
    assert source.read()[0].values["nv_gpu_utilization"] == 0.37
    calls = fake.calls
    fake.devices[0]["util"] = 90
    now[0] += 1.0
    assert source.read()[0].values["nv_gpu_utilization"] == 0.37
    assert fake.calls == calls
    now[0] += 1.0
    assert source.read()[0].values["nv_gpu_utilization"] == 0.9
    # Calls the device does not support are not made again: GPU-aaaa makes its five calls,
    # GPU-bbbb only utilization and memory (no power, limit or energy).
    before = fake.calls
    now[0] += 2.0
    source.read()
    assert fake.calls - before == 5 + 2


def test_nvml_failure_leaves_the_metric_out_once_warned(caplog: pytest.LogCaptureFixture) -> None:
    fake, now = two_gpus(), [0.0]
    source = NvmlSource(fake, interval_s=1.0, clock=lambda: now[0])
    fake.devices[0]["power_mw"] = FakeNvml.NVMLError("GPU is lost")
    with caplog.at_level(logging.WARNING, logger="appliance.ops.gpu"):
        assert "nv_gpu_power_usage" not in source.read()[0].values
        now[0] += 1.0
        assert "nv_gpu_power_usage" not in source.read()[0].values
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ["GPU GPU-aaaa: NVML could not read nv_gpu_power_usage: GPU is lost"]
    fake.devices[0]["power_mw"] = 50000
    now[0] += 1.0
    assert source.read()[0].values["nv_gpu_power_usage"] == 50.0


def test_no_gpu_no_metrics_and_one_info_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="appliance.ops.gpu"):
        assert find_gpu_source(root=tmp_path, nvml=failing_nvml()) is None
    assert [r.getMessage() for r in caplog.records] == [
        "GPU metrics off: NVML unavailable: NVML Shared Library Not Found, "
        "and no Jetson GPU load in sysfs"
    ]
    registry = build_registry(lambda: [], True, gpu=None)
    text = generate_latest(registry).decode()
    assert "nv_cpu_utilization" in text
    assert "nv_gpu" not in text
    assert "nv_energy" not in text


def test_nvml_with_no_devices_is_shut_down_and_jetson_is_tried(tmp_path: Path) -> None:
    fake = FakeNvml([])
    write(tmp_path, "sys/devices/gpu.0/load", "0\n")
    assert isinstance(find_gpu_source(root=tmp_path, nvml=fake), JetsonSource)
    assert fake.initialised == 0


def test_without_pynvml_the_reason_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails as if not installed
    with caplog.at_level(logging.INFO, logger="appliance.ops.gpu"):
        assert find_gpu_source(root=tmp_path) is None
    assert "pynvml not installed (pip install nvidia-ml-py)" in caplog.text


def test_flags_are_real_not_ignored(tmp_path: Path) -> None:
    parser = cli.build_parser()
    default = cli.settings_from_args(parser.parse_args(["serve", "--model-repository", "m"]))
    assert default.allow_gpu_metrics
    assert default.metrics_interval_ms == 2000
    flags = ["--allow-gpu-metrics=false", "--metrics-interval-ms=500"]
    settings = cli.settings_from_args(
        parser.parse_args(["serve", "--model-repository", "m", *flags])
    )
    assert not settings.allow_gpu_metrics
    assert settings.metrics_interval_ms == 500
    assert settings.ignored_flags == ()
