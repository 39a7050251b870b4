"""GPU metrics with Triton's names, labelled by `gpu_uuid`, from NVML or a Jetson's sysfs.

Sources, tried in this order once at start-up (`find_gpu_source`):

- NVML (`pynvml`, from the nvidia-ml-py package) on machines with an NVIDIA driver. A call that
  a device does not support (NVMLError_NotSupported) leaves out just that metric for that device.
  Readings are cached for `--metrics-interval-ms`, because NVML can take milliseconds per call and
  the scrape runs on the event loop.
- Jetson (NVML does not see the integrated GPU): the tegra sysfs files that jetson-stats reads.
  Load is in tenths of a percent; the GPU shares system RAM, so its memory total / used are
  MemTotal and MemTotal - MemAvailable from /proc/meminfo; power is the GPU rail of the INA3221
  monitors where the board has one. Reads are a few small files, done at scrape time.
- Neither: no source, no nv_gpu_* metric, and one INFO line saying why.

Every sysfs path is read under a root folder (default "/") so tests can build a fake tree.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

UTILIZATION = "nv_gpu_utilization"
MEMORY_TOTAL = "nv_gpu_memory_total_bytes"
MEMORY_USED = "nv_gpu_memory_used_bytes"
POWER_USAGE = "nv_gpu_power_usage"
POWER_LIMIT = "nv_gpu_power_limit"
ENERGY = "nv_energy_consumption"

# (name, Triton's help text, counter?) in Triton's order.
FAMILIES = (
    (UTILIZATION, "GPU utilization rate [0.0 - 1.0)", False),
    (MEMORY_TOTAL, "GPU total memory, in bytes", False),
    (MEMORY_USED, "GPU used memory, in bytes", False),
    (POWER_USAGE, "GPU power usage in watts", False),
    (POWER_LIMIT, "GPU power management limit in watts", False),
    (ENERGY, "GPU energy consumption in joules since the Triton Server started", True),
)


@dataclass(frozen=True)
class GpuReading:
    """One GPU's values at one moment; a metric the device cannot report is absent."""

    uuid: str
    values: dict[str, float] = field(default_factory=dict)


class GpuSource(Protocol):
    description: str

    def read(self) -> list[GpuReading]: ...


class GpuCollector(Collector):
    """Yields Triton's GPU families; a family no GPU reported is left out."""

    def __init__(self, source: GpuSource) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        readings = self._source.read()
        for name, text, counter in FAMILIES:
            family: GaugeMetricFamily | CounterMetricFamily = (
                CounterMetricFamily(name, text, labels=["gpu_uuid"])
                if counter
                else GaugeMetricFamily(name, text, labels=["gpu_uuid"])
            )
            for reading in readings:
                if name in reading.values:
                    family.add_metric([reading.uuid], reading.values[name])
            if family.samples:
                yield family


class NvmlSource:
    """Discrete NVIDIA GPUs through NVML. `nvml` is the pynvml module (injected by tests)."""

    def __init__(
        self,
        nvml: Any,  # the pynvml module: untyped, and a fake one in tests
        interval_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._nvml = nvml
        self._interval_s = interval_s
        self._clock = clock
        nvml.nvmlInit()
        count = int(nvml.nvmlDeviceGetCount())
        self._devices = []
        for index in range(count):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            self._devices.append((handle, _text(nvml.nvmlDeviceGetUUID(handle))))
        self.description = f"NVML, {count} GPU(s)"
        self._skip: set[tuple[str, str]] = set()  # (uuid, metric) the device does not support
        self._warned: set[tuple[str, str]] = set()
        # Triton reports energy since the server started; NVML counts since the driver loaded.
        self._energy_start_mj = {
            uuid: self._call(uuid, ENERGY, nvml.nvmlDeviceGetTotalEnergyConsumption, handle)
            for handle, uuid in self._devices
        }
        self._cached: list[GpuReading] = []
        self._read_at: float | None = None

    @property
    def device_count(self) -> int:
        return len(self._devices)

    def read(self) -> list[GpuReading]:
        now = self._clock()
        if self._read_at is None or now - self._read_at >= self._interval_s:
            self._cached = [self._read_device(handle, uuid) for handle, uuid in self._devices]
            self._read_at = now
        return self._cached

    def _read_device(self, handle: Any, uuid: str) -> GpuReading:
        nvml, values = self._nvml, {}
        rates = self._call(uuid, UTILIZATION, nvml.nvmlDeviceGetUtilizationRates, handle)
        if rates is not None:
            values[UTILIZATION] = rates.gpu / 100.0
        memory = self._call(uuid, MEMORY_TOTAL, nvml.nvmlDeviceGetMemoryInfo, handle)
        if memory is not None:
            values[MEMORY_TOTAL] = float(memory.total)
            values[MEMORY_USED] = float(memory.used)
        power_mw = self._call(uuid, POWER_USAGE, nvml.nvmlDeviceGetPowerUsage, handle)
        if power_mw is not None:
            values[POWER_USAGE] = power_mw / 1000.0
        limit_mw = self._call(uuid, POWER_LIMIT, nvml.nvmlDeviceGetEnforcedPowerLimit, handle)
        if limit_mw is not None:
            values[POWER_LIMIT] = limit_mw / 1000.0
        start_mj = self._energy_start_mj.get(uuid)
        if start_mj is not None:
            energy_mj = self._call(uuid, ENERGY, nvml.nvmlDeviceGetTotalEnergyConsumption, handle)
            if energy_mj is not None:
                values[ENERGY] = max(0, energy_mj - start_mj) / 1000.0
        return GpuReading(uuid, values)

    def _call(self, uuid: str, metric: str, function: Callable[[Any], Any], handle: Any) -> Any:
        """The NVML value, or None when the device does not support it or the call failed."""
        key = (uuid, metric)
        if key in self._skip:
            return None
        try:
            return function(handle)
        except self._nvml.NVMLError_NotSupported:
            self._skip.add(key)
            log.debug("GPU %s: %s not supported by NVML; left out", uuid, metric)
        except self._nvml.NVMLError as exc:
            # Transient (or a lost GPU): left out this time, said once.
            if key not in self._warned:
                self._warned.add(key)
                log.warning("GPU %s: NVML could not read %s: %s", uuid, metric, exc)
        return None


# Where a Jetson's GPU load is (tenths of a percent), newest layouts first: Orin on JetPack 6
# and 5, Xavier, TX2, Nano / TX1. Other layouts are found through devfreq (see _find_load).
_LOAD_PATHS = (
    "sys/devices/platform/bus@0/17000000.gpu/load",
    "sys/devices/platform/17000000.gpu/load",
    "sys/devices/17000000.ga10b/load",
    "sys/devices/17000000.gv11b/load",
    "sys/devices/17000000.gp10b/load",
    "sys/devices/platform/gpu.0/load",
    "sys/devices/gpu.0/load",
)
# devfreq device-tree names of the integrated GPUs (Orin, Xavier, TX2, Nano / TX1, generic).
_IGPU_NAMES = {"ga10b", "gv11b", "gp10b", "gm20b", "gpu"}
# INA3221 rails that feed the GPU, most specific first: AGX Orin, Xavier (JetPack 5 / 4), Nano /
# TX2. Orin NX / Nano and Xavier NX have only VDD_CPU_GPU_CV (CPU, GPU and CV engines together).
_GPU_RAILS = ("VDD_GPU_SOC", "VDD_GPU", "GPU", "POM_5V_GPU", "VDD_CPU_GPU_CV")
_MODEL_PATHS = ("proc/device-tree/model", "sys/firmware/devicetree/base/model")


@dataclass(frozen=True)
class _Rail:
    """One INA3221 channel: watts = the product of its files' values x scale."""

    name: str
    files: tuple[Path, ...]  # (mV, mA) from hwmon, or (mW,) from JetPack 4's iio
    scale: float

    def watts(self) -> float | None:
        product = self.scale
        for path in self.files:
            value = _number(path)
            if value is None:
                return None
            product *= value
        return product


class JetsonSource:
    """A Jetson's integrated GPU, from the tegra sysfs files; `find` returns None elsewhere."""

    def __init__(self, root: Path, load: Path, rail: _Rail | None, uuid: str) -> None:
        self._root = root
        self._load = load
        self._rail = rail
        self.uuid = uuid
        self.description = f"Jetson sysfs ({load.relative_to(root)}" + (
            f", power rail {rail.name})" if rail else ", no GPU power rail)"
        )

    @classmethod
    def find(cls, root: Path = Path("/")) -> JetsonSource | None:
        load = _find_load(root)
        if load is None:
            return None
        return cls(root, load, _find_gpu_rail(root), _jetson_uuid(root))

    def read(self) -> list[GpuReading]:
        values: dict[str, float] = {}
        load = _number(self._load)
        if load is not None:
            values[UTILIZATION] = min(load, 1000.0) / 1000.0
        memory = _meminfo(self._root / "proc/meminfo")
        if memory is not None:
            values[MEMORY_TOTAL], values[MEMORY_USED] = memory
        if self._rail is not None:
            watts = self._rail.watts()
            if watts is not None:
                values[POWER_USAGE] = watts
        return [GpuReading(self.uuid, values)] if values else []


def _find_load(root: Path) -> Path | None:
    for relative in _LOAD_PATHS:
        if _number(root / relative) is not None:
            return root / relative
    # jetson-stats' way: a devfreq device whose device-tree node is a known integrated GPU;
    # NVIDIA's, because other SoCs (Mali, Adreno) name their GPU node "gpu" too.
    for entry in sorted((root / "sys/class/devfreq").glob("*")):
        node = entry / "device/of_node"
        if (
            _read(node / "name") in _IGPU_NAMES
            and "nvidia," in _read(node / "compatible")
            and _number(entry / "device/load") is not None
        ):
            return entry / "device/load"
    return None


def _find_gpu_rail(root: Path) -> _Rail | None:
    rails: dict[str, _Rail] = {}
    for chip in sorted((root / "sys/bus/i2c/drivers").glob("ina3221*/*")):
        # JetPack 5 and later: hwmon inN_label / inN_input (mV) / currN_input (mA).
        for label in sorted(chip.glob("hwmon/hwmon*/in*_label")):
            channel = label.name[2 : -len("_label")]
            name = _read(label)
            if name and channel != "7":  # in7 is the sum of the shunt voltages, not a rail
                folder = label.parent
                files = (folder / f"in{channel}_input", folder / f"curr{channel}_input")
                rails.setdefault(name, _Rail(name, files, 1e-6))
        # JetPack 4: iio rail_name_N / in_powerN_input (mW).
        for label in sorted(chip.glob("iio:device*/rail_name_*")):
            channel = label.name[len("rail_name_") :]
            name = _read(label)
            if name:
                power = label.parent / f"in_power{channel}_input"
                rails.setdefault(name, _Rail(name, (power,), 1e-3))
    for name in _GPU_RAILS:
        if name in rails:
            return rails[name]
    return next((rail for name, rail in sorted(rails.items()) if "GPU" in name), None)


def _jetson_uuid(root: Path) -> str:
    """A stable label: "jetson-" and the board model (Triton itself has no Jetson GPU metrics)."""
    for relative in _MODEL_PATHS:
        model = _read(root / relative)
        if model:
            return "jetson-" + re.sub(r"[^a-z0-9]+", "-", model.lower()).strip("-")
    return "jetson-igpu"


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip("\x00\n\t ")
    except OSError:
        return ""


def _number(path: Path) -> float | None:
    # Some drivers add a unit after the value ("32760 ma").
    text = _read(path).split(" ")[0]
    try:
        return float(text)
    except ValueError:
        return None


def _meminfo(path: Path) -> tuple[float, float] | None:
    try:
        with path.open(encoding="ascii") as meminfo:
            values = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in meminfo}
    except (OSError, ValueError, IndexError):
        return None
    total = values.get("MemTotal")
    if not total:
        return None
    return float(total), float(total - values.get("MemAvailable", values.get("MemFree", 0)))


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def find_gpu_source(
    interval_s: float = 2.0, root: Path = Path("/"), nvml: Any = None
) -> GpuSource | None:
    """NVML where it sees a GPU, else a Jetson's sysfs, else None; logs one INFO line.

    Blocking (NVML initialises the driver): call it off the event loop.
    """
    try:
        module = nvml if nvml is not None else importlib.import_module("pynvml")
    except ImportError:
        why = "pynvml not installed (pip install nvidia-ml-py)"
    else:
        try:
            source = NvmlSource(module, interval_s)
        except Exception as exc:  # NVMLError (no driver, no library) and anything odd
            why = f"NVML unavailable: {exc}"
        else:
            if source.device_count:
                log.info("GPU metrics from %s", source.description)
                return source
            why = "NVML found no GPU"
            with contextlib.suppress(Exception):
                module.nvmlShutdown()
    jetson = JetsonSource.find(root)
    if jetson is not None:
        log.info("GPU metrics from %s", jetson.description)
        return jetson
    log.info("GPU metrics off: %s, and no Jetson GPU load in sysfs", why)
    return None
