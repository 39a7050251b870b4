"""SHA256SUMS manifests decide when a version folder is complete."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from appliance.repository.manifest import (
    MANIFEST,
    SIGNATURE,
    ManifestError,
    ManifestPolicy,
    check_model_level,
    check_version,
    load_public_key,
    model_level_files,
    write_manifest,
    write_model_manifest,
)


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
    assert check_version(folder, ManifestPolicy(required=True)) == ""


def test_no_manifest_is_fine_unless_required(tmp_path: Path) -> None:
    folder = _version(tmp_path)
    assert check_version(folder, ManifestPolicy()) == ""
    assert "--require-manifest" in check_version(folder, ManifestPolicy(required=True))


def test_mismatch_and_missing_files_are_incomplete(tmp_path: Path) -> None:
    folder = _version(tmp_path, b"half of the mod")
    _manifest(folder, hashlib.sha256(b"model bytes").hexdigest())
    assert "'model.onnx' does not match its sha256" in check_version(folder, ManifestPolicy())
    _manifest(folder, hashlib.sha256(b"x").hexdigest(), "weights.bin")
    assert "'weights.bin' listed in SHA256SUMS is missing" in check_version(
        folder, ManifestPolicy()
    )


def test_malformed_and_escaping_lines_are_refused(tmp_path: Path) -> None:
    folder = _version(tmp_path)
    (folder / MANIFEST).write_text("not a line\n")
    assert "line 1 is not" in check_version(folder, ManifestPolicy())
    _manifest(folder, "0" * 64, "../elsewhere")
    assert "outside the version folder" in check_version(folder, ManifestPolicy())


# ---- signed manifests ---------------------------------------------------------------------


def _keys(tmp_path: Path):  # type: ignore[no-untyped-def]
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    pem = tmp_path / "release.pub"
    pem.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return key, pem


def test_signed_manifest_written_by_the_tool_verifies(tmp_path: Path) -> None:
    key, pem = _keys(tmp_path)
    folder = _version(tmp_path)
    write_manifest(folder, key)
    policy = ManifestPolicy(public_key=load_public_key(pem))
    assert check_version(folder, policy) == ""
    # The same check with a different key fails, naming the reason.
    (tmp_path / "other").mkdir()
    _, other_pem = _keys(tmp_path / "other")
    refused = check_version(folder, ManifestPolicy(public_key=load_public_key(other_pem)))
    assert "does not verify" in refused


def test_signature_must_cover_every_file_and_the_exact_manifest(tmp_path: Path) -> None:
    key, pem = _keys(tmp_path)
    policy = ManifestPolicy(public_key=load_public_key(pem))
    folder = _version(tmp_path)
    write_manifest(folder, key)
    (folder / "model.py").write_text("import os\n")  # smuggled in beside the signed files
    assert "files not in the signed SHA256SUMS: model.py" in check_version(folder, policy)
    (folder / "model.py").unlink()
    (folder / MANIFEST).write_text((folder / MANIFEST).read_text() + "\n")  # one byte changed
    assert "does not verify" in check_version(folder, policy)
    (folder / SIGNATURE).unlink()
    assert f"no {SIGNATURE}" in check_version(folder, policy)


def test_unsigned_version_refused_when_a_key_is_given(tmp_path: Path) -> None:
    _, pem = _keys(tmp_path)
    folder = _version(tmp_path)
    write_manifest(folder)
    refused = check_version(folder, ManifestPolicy(public_key=load_public_key(pem)))
    assert "--manifest-public-key" in refused


def test_public_key_formats(tmp_path: Path) -> None:
    import base64

    from cryptography.hazmat.primitives import serialization

    key, pem = _keys(tmp_path)
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    (tmp_path / "raw.key").write_bytes(raw)
    (tmp_path / "b64.key").write_text(base64.b64encode(raw).decode() + "\n")
    folder = _version(tmp_path)
    write_manifest(folder, key)
    for path in (pem, tmp_path / "raw.key", tmp_path / "b64.key"):
        assert check_version(folder, ManifestPolicy(public_key=load_public_key(path))) == ""
    (tmp_path / "bad.key").write_text("hello")
    with pytest.raises(ManifestError, match="neither PEM nor 32 raw"):
        load_public_key(tmp_path / "bad.key")


def _signed_model(tmp_path: Path) -> tuple[Path, ManifestPolicy]:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    model = tmp_path / "m"
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.onnx").write_bytes(b"weights")
    (model / "config.pbtxt").write_text('name: "m"\n')
    (model / "warmup").mkdir()
    (model / "warmup" / "x.bin").write_bytes(b"\0" * 16)
    (model / "rollout.json").write_text("{}")  # signed on its own: never a model file
    write_model_manifest(model, key)
    write_manifest(model / "1", key)
    return model, ManifestPolicy(public_key=key.public_key())


def test_model_level_files_are_covered_by_a_signed_model_manifest(tmp_path: Path) -> None:
    model, policy = _signed_model(tmp_path)
    listed = (model / MANIFEST).read_text()
    assert "config.pbtxt" in listed
    assert "warmup/x.bin" in listed
    assert "model.onnx" not in listed
    assert "rollout.json" not in listed
    assert check_model_level(model_level_files(model), policy) == ""
    assert check_model_level({}, ManifestPolicy()) == ""  # nothing asked without a key


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda m: (m / "labels.txt").write_text("cat"), "not in the signed SHA256SUMS: labels"),
        (lambda m: (m / "config.pbtxt").write_text("x"), "'config.pbtxt' does not match"),
        (lambda m: (m / SIGNATURE).unlink(), "no model-level SHA256SUMS.sig"),
        (lambda m: (m / MANIFEST).write_text(""), "does not verify"),
    ],
)
def test_an_unsigned_or_changed_model_level_file_is_refused(
    tmp_path: Path, change: Any, expected: str
) -> None:
    model, policy = _signed_model(tmp_path)
    change(model)
    assert expected in check_model_level(model_level_files(model), policy)
