"""OpenSSF model signatures (the model-signing package, v1.0 format) checked before a load:
a version signed with the key loads; a byte flipped after signing, an unsigned version (in
required mode) and a file the signature does not cover are refused, each with its reason on the
repository index and the status page, while the good version serves."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.integration.test_s3_repository import _added, _index, _model_bytes
from tests.serverproc import ROOT

model_signing = pytest.importorskip(
    "model_signing", reason="model-signing is not installed (pip install '.[modelsigning]')"
)

CONFIG = 'name: "m"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 4\nversion_policy: { all: {} }\n'


def _keys(folder: Path) -> tuple[Path, Path]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    private, public = folder / "signing.key", folder / "signing.pub"
    private.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    public.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return private, public


def _version(model: Path, version: int, value: int, key: Path | None) -> Path:
    folder = model / str(version)
    folder.mkdir(parents=True)
    (folder / "model.onnx").write_bytes(_model_bytes(value))
    if key is not None:
        signer = model_signing.signing.Config().use_elliptic_key_signer(private_key=key)
        signer.sign(folder, folder.parent / f".{version}.sig")
        (folder.parent / f".{version}.sig").rename(folder / "model.sig")
    return folder


def test_signed_versions_load_and_tampered_unsigned_or_uncovered_ones_are_refused(
    start_server, tmp_path: Path
) -> None:
    private, public = _keys(tmp_path)
    repo = tmp_path / "repo"
    model = repo / "m"
    model.mkdir(parents=True)
    (model / "config.pbtxt").write_text(CONFIG)
    _version(model, 1, 1, private)
    two = _version(model, 2, 2, private)
    data = bytearray((two / "model.onnx").read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit of the signed weights
    (two / "model.onnx").write_bytes(bytes(data))
    _version(model, 3, 3, None)  # not signed
    four = _version(model, 4, 4, private)
    (four / "extra.py").write_text("import os\n")  # beside signed files, itself unsigned
    proc = start_server(
        repo, f"--model-signature=key:{public}", "--require-model-signature", "--strict-readiness=0"
    )
    rows = {row["version"]: row for row in _index(proc.http_url) if row["name"] == "m"}
    assert rows["1"]["state"] == "READY"
    assert rows["2"]["state"] == "UNAVAILABLE"
    assert rows["2"].get("reason", "") == (
        "model.sig does not verify (key): 'model.onnx' does not match its signed digest"
    )
    assert rows["3"].get("reason", "") == (
        "no model.sig (OpenSSF model signature) and --require-model-signature is set"
    )
    assert rows["4"].get("reason", "") == "files not covered by model.sig: extra.py"
    # Version 4 is the newest; only version 1 verifies and serves.
    assert _added(proc.http_url) == 1.0
    with urllib.request.urlopen(f"http://{proc.http_url}/status.json", timeout=10) as resp:
        status = json.dumps(json.loads(resp.read()))
    assert "model.sig does not verify (key)" in status
    assert "files not covered by model.sig: extra.py" in status
    # `edge-appliance check` says the same offline, before a release is published.
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "appliance",
            "check",
            str(repo),
            "--json",
            f"--model-signature=key:{public}",
            "--require-model-signature",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    checked = {row["version"]: row for row in json.loads(done.stdout)["models"]}
    assert {v: (r["state"], r.get("reason", "")) for v, r in checked.items()} == {
        v: (r["state"], r.get("reason", "")) for v, r in rows.items()
    }


def test_a_certificate_chain_verifies_versions_signed_under_its_ca_only(
    start_server, tmp_path: Path
) -> None:
    from tests.pki import code_signing_chain

    ca, cert, key = code_signing_chain(tmp_path, "release")
    _, other_cert, other_key = code_signing_chain(tmp_path, "someone-else")
    repo = tmp_path / "repo"
    model = repo / "m"
    model.mkdir(parents=True)
    (model / "config.pbtxt").write_text(CONFIG)
    for version, (signing_cert, signing_key) in ((1, (cert, key)), (2, (other_cert, other_key))):
        folder = _version(model, version, version, None)
        signer = model_signing.signing.Config().use_certificate_signer(
            private_key=signing_key, signing_certificate=signing_cert, certificate_chain=[ca]
        )
        signer.sign(folder, tmp_path / "model.sig")
        (tmp_path / "model.sig").rename(folder / "model.sig")
    proc = start_server(repo, f"--model-signature=certificate:{ca}", "--strict-readiness=0")
    rows = {row["version"]: row for row in _index(proc.http_url) if row["name"] == "m"}
    assert rows["1"]["state"] == "READY"
    assert rows["2"].get("reason", "").startswith("model.sig does not verify (certificate): ")
    assert _added(proc.http_url) == 1.0


def test_a_bad_model_signature_flag_stops_the_start_in_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "appliance",
            "serve",
            f"--model-repository={tmp_path}",
            "--model-signature=key:/nonexistent.pem",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0
    assert "--model-signature: '/nonexistent.pem' is not a file" in done.stderr
