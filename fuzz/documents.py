"""Fuzz targets for the files the server and the fleet tools read: signed manifests, rollout
documents, the ledger, label files and device reports. Each input is a file's bytes (with, for
some, a few leading bytes that choose how it is used); the reader's documented error is the
only exception allowed out.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from appliance.common.errors import ApplianceError, ConfigError
from appliance.common.model_config import parse_config_text
from appliance.fleet import view
from appliance.repository import rollout
from appliance.repository.ledger import LedgerEntry, ModelLedger, held_back
from appliance.repository.manifest import (
    MANIFEST,
    SIGNATURE,
    ManifestError,
    ManifestPolicy,
    check_version,
    load_public_key,
    parse_manifest,
    verify_signature,
)
from appliance.runtime.loader import read_labels
from appliance.services.inference import classify

# One folder per process, reused by every run; removed at exit. libFuzzer's exit skips atexit:
# under atheris, fuzz.run names the folder (EDGE_FUZZ_SCRATCH) and removes it.
_SCRATCH = Path(os.environ.get("EDGE_FUZZ_SCRATCH") or tempfile.mkdtemp(prefix="edge-fuzz-"))
atexit.register(shutil.rmtree, _SCRATCH, True)


def _scratch(name: str) -> Path:
    folder = _SCRATCH / name
    folder.mkdir(parents=True, exist_ok=True)
    return folder


_KEY_SEED = bytes(range(32))


def _keys() -> tuple[object, object]:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    private = Ed25519PrivateKey.from_private_bytes(_KEY_SEED)
    return private, private.public_key()


def manifest(data: bytes) -> None:
    """SHA256SUMS and SHA256SUMS.sig: the first two bytes give the manifest's length; the
    rest is its signature. Parsed, verified against a fixed key, and checked against a
    version folder holding one file (as --require-manifest and as --manifest-public-key)."""
    private, public = _keys()
    split = int.from_bytes(data[:2].ljust(2, b"\0"), "little") % (len(data) + 1)
    text, signature = data[2 : 2 + split], data[2 + split :]
    with contextlib.suppress(ManifestError):
        parse_manifest(text.decode("utf-8", "replace"))
    with contextlib.suppress(ManifestError):
        verify_signature(public, text, signature)
    folder = _scratch("manifest")
    (folder / "model.onnx").write_bytes(b"weights")
    (folder / MANIFEST).write_bytes(text)
    (folder / SIGNATURE).write_bytes(signature)
    for policy in (ManifestPolicy(required=True), ManifestPolicy(public_key=public)):
        answer = check_version(folder, policy)
        if not isinstance(answer, str):
            raise AssertionError(f"check_version gave {answer!r}")
    # A manifest the right key signed: the check then rests on the file contents alone.
    (folder / SIGNATURE).write_bytes(private.sign(text))  # type: ignore[attr-defined]
    check_version(folder, ManifestPolicy(public_key=public))
    key_file = folder.parent / "key.pub"
    key_file.write_bytes(signature)
    with contextlib.suppress(ManifestError):
        load_public_key(key_file)


def rollout_document(data: bytes) -> None:
    """rollout.json as a device's agent and the operator's tools read it; a document that
    parses is used (stage membership, the halt rule, the version choice) and must survive its
    own serialisation."""
    try:
        document = rollout.RolloutDocument.parse(data, None)
    except rollout.RolloutError:
        return
    again = rollout.RolloutDocument.parse(document.to_json(), document.model)
    if again != document:
        raise AssertionError(f"rollout.json changed through to_json: {document} -> {again}")
    labels = {"site": "berlin", "hw": "orin"}
    for device in ("dev-1", "dev-2", "x" * 128):
        in_stage = rollout.membership(document, device, labels)
        halted = rollout.halted(document, 3, 1)
        for failed_here in (False, True):
            version = rollout.choose_version(document, in_stage, halted, failed_here, True)
            if version not in (document.target, document.baseline):
                raise AssertionError(f"chose version {version} of {document}")


def ledger(data: bytes) -> None:
    """A model's ledger file (<state>/ledger/<repo>/<model>.json) as the store reads it back
    at start-up: whatever is there, an entry comes back (a record it cannot read starts
    afresh, with a warning), and the entry survives its own serialisation."""
    state = _scratch("state")
    model_dir = _scratch("repo") / "m"
    records = ModelLedger(state)
    path = records._file(model_dir)
    assert path is not None
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    entry = records.entry(model_dir)
    if LedgerEntry.from_json(json.loads(json.dumps(entry.to_json()))) != entry:
        raise AssertionError(f"ledger entry changed through to_json: {entry}")
    held_back(entry, {v: f.content for v, f in entry.failed.items()})


_LABELS_CONFIG = parse_config_text(
    'name: "m"\nmax_batch_size: 4\n'
    'output [ { name: "PROB", data_type: TYPE_FP32, dims: [ 5 ], label_filename: "labels.txt" } ]'
    "\n",
    "config.pbtxt",
)


def labels(data: bytes) -> None:
    """A label file (an output's label_filename) read as the loader reads it, then used by
    the classification extension; the first byte is the request's class_count."""
    folder = _scratch("labels")
    (folder / "labels.txt").write_bytes(data[1:])
    try:
        found = read_labels(folder, _LABELS_CONFIG)
    except ConfigError:
        return
    names = found["PROB"]
    count = (data[0] if data else 1) % 8
    array = np.arange(10, dtype=np.float32).reshape(2, 5)
    with contextlib.suppress(ApplianceError):
        classify(array, count, names, batching=True)
    with contextlib.suppress(rollout.RolloutError):  # device labels, EDGE_DEVICE_LABELS
        rollout.parse_label_text(data.decode("utf-8", "replace"))


_FLEET_DOC = rollout.RolloutDocument.parse(
    b'{"format":1,"model":"m","revision":2,"target":2,"baseline":1,"stage":0,'
    b'"stages":[{"percent":50},{"labels":{"site":"berlin"}}],'
    b'"halt":{"max_failed_share":0.2,"min_verdicts":1}}'
)


def fleet_report(data: bytes) -> None:
    """A device report (.fleet/devices/<id>.json) as `edge-appliance fleet status` reads it:
    parsed (ValueError when it is not one), then summarised and printed with a rollout."""
    try:
        report = view.parse_report("r/.fleet/devices/d.json", 100.0, data)
    except (ValueError, UnicodeDecodeError):
        return
    other = view.DeviceReport("dev-2", {"site": "berlin"}, 0.0, {"m": {"serving": [1]}})
    snapshot = view.Snapshot(
        "s3://b/r",
        2000.0,
        reports=[report, other],
        rollouts={"m": _FLEET_DOC, **dict.fromkeys(list(report.models)[:4])},
        verdicts={"m": {2: {report.device: rollout.FAILED, "dev-2": rollout.PASSED}}},
    )
    for by in ("", "site"):
        summary = view.summarize(snapshot, by=by)
        view.render(summary)
        view.render_devices(summary)
        json.dumps(view.as_json(summary))
