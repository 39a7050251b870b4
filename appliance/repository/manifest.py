"""Version manifests: a version folder is complete when its files match `SHA256SUMS`.

The manifest is the output of `sha256sum` run inside the version folder, one line per file:

    3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855  model.onnx

Every listed file must exist and match; a version whose manifest is missing (when required
with --require-manifest), names a missing file or does not match is reported incomplete and
is not loaded, so a half-uploaded version never serves. The poller retries it when its
content changes.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

MANIFEST = "SHA256SUMS"
_CHUNK = 1 << 20


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def check_version(version_dir: Path, required: bool) -> str:
    """'' when the version is complete, else why not."""
    manifest = version_dir / MANIFEST
    if not manifest.is_file():
        return f"no {MANIFEST} manifest and --require-manifest is set" if required else ""
    try:
        lines = manifest.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        return f"cannot read {MANIFEST}: {exc}"
    listed = 0
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        expected, _, name = line.strip().partition(" ")
        name = name.strip().lstrip("*")  # sha256sum marks binary mode with '*'
        if len(expected) != 64 or not name:
            return f"{MANIFEST} line {number} is not '<sha256>  <file>'"
        path = (version_dir / name).resolve()
        if version_dir.resolve() not in path.parents:
            return f"{MANIFEST} line {number} names a file outside the version folder"
        if not path.is_file():
            return f"incomplete: '{name}' listed in {MANIFEST} is missing"
        if sha256_of(path) != expected.lower():
            return f"incomplete: '{name}' does not match its sha256 in {MANIFEST}"
        listed += 1
    if not listed:
        return f"{MANIFEST} lists no files"
    return ""
