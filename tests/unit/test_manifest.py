"""SHA256SUMS manifests decide when a version folder is complete."""

from __future__ import annotations

import hashlib
from pathlib import Path

from appliance.repository.manifest import MANIFEST, check_version


def _version(tmp_path: Path, content: bytes = b"model bytes") -> Path:
    folder = tmp_path / "3"
    folder.mkdir()
    (folder / "model.onnx").write_bytes(content)
    return folder


def _manifest(folder: Path, digest: str, name: str = "model.onnx") -> None:
    (folder / MANIFEST).write_text(f"{digest}  {name}\n")


def test_matching_manifest_is_complete(tmp_path: Path) -> None:
    folder = _version(tmp_path)
    _manifest(folder, hashlib.sha256(b"model bytes").hexdigest())
    assert check_version(folder, required=True) == ""


def test_no_manifest_is_fine_unless_required(tmp_path: Path) -> None:
    folder = _version(tmp_path)
    assert check_version(folder, required=False) == ""
    assert "--require-manifest" in check_version(folder, required=True)


def test_mismatch_and_missing_files_are_incomplete(tmp_path: Path) -> None:
    folder = _version(tmp_path, b"half of the mod")
    _manifest(folder, hashlib.sha256(b"model bytes").hexdigest())
    assert "'model.onnx' does not match its sha256" in check_version(folder, required=False)
    _manifest(folder, hashlib.sha256(b"x").hexdigest(), "weights.bin")
    assert "'weights.bin' listed in SHA256SUMS is missing" in check_version(folder, False)


def test_malformed_and_escaping_lines_are_refused(tmp_path: Path) -> None:
    folder = _version(tmp_path)
    (folder / MANIFEST).write_text("not a line\n")
    assert "line 1 is not" in check_version(folder, False)
    _manifest(folder, "0" * 64, "../elsewhere")
    assert "outside the version folder" in check_version(folder, False)
