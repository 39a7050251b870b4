"""`edge-appliance version`: build information that never fails, whatever is missing."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path
from typing import Any

import pytest

import appliance.ops
from appliance import __version__
from appliance.face import cli
from appliance.ops import buildinfo
from appliance.tools import build_check


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
    built = types.ModuleType("appliance.ops._build")
    built.COMMIT = "abc1234-dirty"  # type: ignore[attr-defined]
    built.BUILT = "2026-01-02T03:04:05Z"  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "appliance.ops._build", built)
    # `from appliance.ops import _build` reads the package attribute first (set by an earlier
    # import when build/build.sh has written the real file).
    monkeypatch.setattr(appliance.ops, "_build", built, raising=False)
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


# -- version --verify: the build's signed record --------------------------------------------


def _signed_build(tmp_path: Path) -> tuple[Path, Any]:
    """A one-folder build as build/build.sh leaves it: files, the SBOM, SHA256SUMS signed."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from appliance.repository.manifest import write_manifest

    folder = tmp_path / "edge-appliance"
    (folder / "_internal").mkdir(parents=True)
    (folder / "edge-appliance").write_bytes(b"\x7fELF binary")
    (folder / "_internal" / "libpython3.11.so").write_bytes(b"library")
    bom = {"bomFormat": "CycloneDX", "specVersion": "1.6", "components": [{"name": "numpy"}]}
    (folder / build_check.SBOM).write_text(json.dumps(bom))
    key = Ed25519PrivateKey.generate()
    write_manifest(folder, key)
    return folder, key


def _public_pem(tmp_path: Path, key: Any) -> Path:
    from cryptography.hazmat.primitives import serialization

    path = tmp_path / "build.pub"
    path.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return path


def _verify(folder: Path, *extra: str) -> int:
    return cli.version(["--verify", "--build-dir", str(folder), *extra])


def test_verify_passes_on_a_signed_build_with_the_embedded_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import base64

    from cryptography.hazmat.primitives import serialization

    folder, key = _signed_build(tmp_path)
    raw = key.public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )
    monkeypatch.setattr(
        buildinfo, "_build_module", lambda: {"public_key": base64.b64encode(raw).decode()}
    )
    assert _verify(folder) == 0
    out = capsys.readouterr().out
    assert out.startswith("PASS: ")
    assert "signed by the embedded build key" in out
    assert "CycloneDX 1.6, 1 components" in out


def test_verify_fails_on_a_tampered_sbom_file_or_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    folder, key = _signed_build(tmp_path)
    public = str(_public_pem(tmp_path, key))
    assert _verify(folder, "--public-key", public) == 0
    capsys.readouterr()
    sbom = folder / build_check.SBOM
    original = sbom.read_bytes()
    sbom.write_bytes(original.replace(b"numpy", b"numpz"))  # a component hidden
    assert _verify(folder, "--public-key", public) == 1
    assert "FAIL: " in capsys.readouterr().out
    sbom.write_bytes(original)
    library = folder / "_internal" / "libpython3.11.so"
    library.write_bytes(b"librarz")  # a bundled file changed
    assert _verify(folder, "--public-key", public) == 1
    assert "'_internal/libpython3.11.so' does not match" in capsys.readouterr().out
    library.write_bytes(b"library")
    (folder / "_internal" / "extra.so").write_bytes(b"planted")  # a file added
    assert _verify(folder, "--public-key", public) == 1
    assert "files not in the signed SHA256SUMS: _internal/extra.so" in capsys.readouterr().out
    (folder / "_internal" / "extra.so").unlink()
    other = str(_public_pem(tmp_path / "..", Ed25519PrivateKey.generate()))
    assert _verify(folder, "--public-key", other) == 1  # signed by another key
    assert "does not verify" in capsys.readouterr().out


def test_verify_outside_a_build_fails_and_says_why(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.version(["--verify"]) == 1
    assert "not a one-folder build" in capsys.readouterr().out
