"""GPU metrics on a machine without a GPU: none served, nothing fails, one line says why."""

from __future__ import annotations

import urllib.request
from pathlib import Path

from tests.serverproc import ServerProcess


def metrics_text(server: ServerProcess) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics") as resp:
        return str(resp.read().decode())


def test_without_a_gpu_cpu_metrics_are_served_and_gpu_metrics_absent(
    start_server, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    proc = start_server(tmp_path, "--allow-gpu-metrics=true", "--metrics-interval-ms=500")
    text = metrics_text(proc)
    assert "nv_cpu_utilization " in text
    assert "nv_gpu_" not in text
    assert "nv_energy_consumption" not in text
    log = proc.log()
    said = [line for line in log.splitlines() if "GPU metrics" in line]
    assert len(said) == 1, log
    assert " INFO appliance.ops.gpu: GPU metrics off: " in said[0]
    assert said[0].endswith("and no Jetson GPU load in sysfs")
    assert " ERROR " not in log
    assert "Traceback" not in log
    assert "ignored" not in log  # the flags are real, not tritonserver flags accepted and ignored
    assert proc.stop() == 0


def test_gpu_metrics_can_be_turned_off(start_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    proc = start_server(tmp_path, "--allow-gpu-metrics=false")
    assert "nv_cpu_utilization " in metrics_text(proc)
    assert "GPU metrics" not in proc.log()
