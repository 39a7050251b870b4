"""Which backends this build can serve with: listed without importing their libraries."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import subprocess
import sys
from typing import Any

import pytest

from appliance.ops import buildinfo
from tests.serverproc import ROOT


def test_listing_imports_neither_torch_nor_openvino() -> None:
    code = (
        "import sys\n"
        "from appliance.ops import buildinfo\n"
        "info = buildinfo.build_info()\n"
        "assert 'torch' not in sys.modules and 'openvino' not in sys.modules, 'imported'\n"
        "print(sorted(info['backends']))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "'openvino'" in done.stdout
    assert "'pytorch'" in done.stdout


@pytest.mark.parametrize(("backend", "dist"), [("openvino", "openvino"), ("pytorch", "torch")])
def test_installed_backends_report_their_library_version(backend: str, dist: str) -> None:
    if importlib.util.find_spec(dist) is None:
        pytest.skip(f"{dist} is not installed")
    version = importlib.metadata.version(dist)
    entry = buildinfo.backends()[backend]
    assert entry == {"available": True, "library": dist, "version": version}
    assert buildinfo.available_backends()[backend] == f"{dist} {version}"
    assert buildinfo.summary()["backends"][backend] == f"{dist} {version}"


def test_a_missing_library_makes_its_backend_unavailable_with_the_extra_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = importlib.util.find_spec

    def without_torch(name: str, *args: Any) -> Any:
        return None if name == "torch" else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", without_torch)
    assert buildinfo.backends()["pytorch"] == {
        "available": False,
        "error": "torch is not installed (pip install 'edge-appliance[torch]')",
    }
    assert "pytorch" not in buildinfo.available_backends()
    assert "onnxruntime (onnxruntime " in buildinfo.backends_line()
    text = buildinfo.render(buildinfo.build_info())
    assert "pytorch (unavailable: torch is not installed" in text
    assert "; python; " in text  # needs no library
