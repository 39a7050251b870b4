"""`edge-appliance version`: build information that never fails, whatever is missing."""

from __future__ import annotations

import json
import sys
import types
from typing import Any

import pytest

import appliance
from appliance import __version__, buildinfo, cli


def test_build_info_reports_version_commit_python_backends_and_gpu() -> None:
    info = buildinfo.build_info()
    assert info["version"] == __version__
    assert info["commit"]  # a checkout: git's short hash; elsewhere "unknown"
    assert info["python"] == ".".join(map(str, sys.version_info[:3]))
    assert info["backends"]["onnxruntime"]["available"]
    assert "CPUExecutionProvider" in info["backends"]["onnxruntime"]["providers"]
    assert info["backends"]["python"] == {"available": True}
    assert set(info["libraries"]) == {"tensorrt", "pycuda", "pynvml"}
    assert isinstance(info["gpu"]["found"], bool)
    json.dumps(info)  # plain data


def test_commit_and_build_time_come_from_the_generated_module(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    built = types.ModuleType("appliance._build")
    built.COMMIT = "abc1234-dirty"  # type: ignore[attr-defined]
    built.BUILT = "2026-01-02T03:04:05Z"  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "appliance._build", built)
    # `from appliance import _build` reads the package attribute first (set by an earlier
    # import when build/build.sh has written the real file).
    monkeypatch.setattr(appliance, "_build", built, raising=False)
    summary = buildinfo.summary()
    assert summary["commit"] == "abc1234-dirty"
    assert summary["built"] == "2026-01-02T03:04:05Z"


def test_a_broken_nvml_falls_back_without_failing(monkeypatch: pytest.MonkeyPatch) -> None:
    broken = types.ModuleType("pynvml")

    def init() -> None:
        raise RuntimeError("NVML Shared Library Not Found")

    broken.nvmlInit = init  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pynvml", broken)
    found = buildinfo.gpu()
    assert isinstance(found["found"], bool)
    if not found["found"]:
        assert found["notes"] == ["nvml: NVML Shared Library Not Found"]


def test_nvml_devices_are_listed(monkeypatch: pytest.MonkeyPatch) -> None:
    fake: Any = types.ModuleType("pynvml")
    fake.nvmlInit = fake.nvmlShutdown = lambda: None
    fake.nvmlDeviceGetCount = lambda: 1
    fake.nvmlDeviceGetHandleByIndex = lambda i: i
    fake.nvmlDeviceGetName = lambda handle: b"NVIDIA H200"
    fake.nvmlSystemGetDriverVersion = lambda: "560.35"
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    assert buildinfo.gpu() == {
        "found": True,
        "via": "nvml",
        "devices": ["NVIDIA H200"],
        "driver": "560.35",
    }


def test_render_says_what_is_missing() -> None:
    info = {
        **buildinfo.summary(),
        "backends": {
            "onnxruntime": {"available": True, "version": "1.20", "providers": ["CPU"]},
            "python": {"available": False, "error": "no shared memory"},
        },
        "libraries": {"tensorrt": {"available": False, "error": "x"}},
        "gpu": {"found": False},
    }
    text = buildinfo.render(info)
    assert text.splitlines()[0] == f"edge-appliance {__version__} (commit {info['commit']})"
    assert "onnxruntime 1.20 [CPU]; python (unavailable: no shared memory)" in text
    assert "no tensorrt" in text
    assert "gpu:       none found" in text


def test_version_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["version"]) == 0
    assert capsys.readouterr().out.startswith(f"edge-appliance {__version__} (commit ")
    assert cli.main(["version", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["version"] == __version__
    assert {"commit", "python", "backends", "libraries", "gpu"} <= set(info)
