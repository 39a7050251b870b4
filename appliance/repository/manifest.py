"""Version manifests: a version folder is complete when its files match `SHA256SUMS`.

The manifest is the output of `sha256sum` run inside the version folder, one line per file:

    3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855  model.onnx

Every listed file must exist and match; a version whose manifest is missing (when required
with --require-manifest), names a missing file or does not match is reported incomplete and
is not loaded, so a half-uploaded version never serves. The poller retries it when its
content changes.

Signed manifests (--manifest-public-key): `SHA256SUMS.sig` beside the manifest holds the raw
64-byte Ed25519 signature of the manifest's exact bytes, which is what
`openssl pkeyutl -sign -rawin -inkey key.pem -in SHA256SUMS -out SHA256SUMS.sig` writes (or
`edge-appliance manifest --sign-key key.pem DIR`). With a key, every version needs a manifest
with a good signature, and a version folder may hold no file the manifest does not list: an
unlisted file would be unverified code or weights.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MANIFEST = "SHA256SUMS"
SIGNATURE = "SHA256SUMS.sig"
# Files the sync writes beside a version's own; never part of a manifest.
SYNC_RECORD = ".edge-sync.json"  # what a remote sync fetched for this folder (s3.py)
BOOKKEEPING = frozenset({MANIFEST, SIGNATURE, SYNC_RECORD})
_CHUNK = 1 << 20


class ManifestError(ValueError):
    """A manifest or its signature is malformed or does not verify."""


@dataclass(frozen=True)
class ManifestPolicy:
    required: bool = False  # --require-manifest
    public_key: Any = None  # an Ed25519PublicKey: manifests must be signed by it

    @property
    def signed(self) -> bool:
        return self.public_key is not None


NO_MANIFEST_RULES = ManifestPolicy()


def load_public_key(path: Path) -> Any:
    """An Ed25519 public key from a PEM file, or a file of its 32 raw (or base64) bytes."""
    try:
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
        from cryptography.hazmat.primitives.serialization import load_pem_public_key
    except ImportError as exc:
        raise ManifestError(
            "--manifest-public-key needs the 'cryptography' package "
            "(pip install 'edge-appliance[signing]')"
        ) from exc
    import base64
    import binascii

    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ManifestError(f"cannot read public key '{path}': {exc.strerror}") from exc
    if b"-----BEGIN" in data:
        try:
            key = load_pem_public_key(data)
        except ValueError as exc:
            raise ManifestError(f"public key '{path}' is not a PEM public key: {exc}") from exc
        if not isinstance(key, Ed25519PublicKey):
            raise ManifestError(f"public key '{path}' is not an Ed25519 key")
        return key
    raw = data
    if len(raw) != 32:
        try:
            raw = base64.b64decode(data.strip(), validate=True)
        except binascii.Error:
            raw = b""
    if len(raw) != 32:
        raise ManifestError(
            f"public key '{path}' is neither PEM nor 32 raw or base64 bytes of an Ed25519 key"
        )
    return Ed25519PublicKey.from_public_bytes(raw)


def load_private_key(path: Path) -> Any:
    """An Ed25519 private key from a PEM file (`openssl genpkey -algorithm ed25519`)."""
    try:
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
        from cryptography.hazmat.primitives.serialization import load_pem_private_key
    except ImportError as exc:
        raise ManifestError("signing needs the 'cryptography' package") from exc
    try:
        key = load_pem_private_key(path.read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as exc:
        raise ManifestError(f"cannot read private key '{path}': {exc}") from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise ManifestError(f"private key '{path}' is not an Ed25519 key")
    return key


def verify_signature(public_key: Any, manifest: bytes, signature: bytes) -> None:
    from cryptography.exceptions import InvalidSignature

    if len(signature) != 64:
        raise ManifestError(
            f"{SIGNATURE} is {len(signature)} bytes, not a 64-byte Ed25519 signature"
        )
    try:
        public_key.verify(signature, manifest)
    except InvalidSignature:
        raise ManifestError(
            f"{SIGNATURE} does not verify with the --manifest-public-key key: "
            "the manifest was changed or signed by another key"
        ) from None


def parse_manifest(text: str) -> dict[str, str]:
    """File name (relative to the version folder) -> expected sha256; raises ManifestError."""
    files: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        expected, _, name = line.strip().partition(" ")
        name = name.strip().lstrip("*")  # sha256sum marks binary mode with '*'
        if len(expected) != 64 or not name:
            raise ManifestError(f"{MANIFEST} line {number} is not '<sha256>  <file>'")
        parts = Path(name).parts
        if Path(name).is_absolute() or ".." in parts:
            raise ManifestError(f"{MANIFEST} line {number} names a file outside the version folder")
        files[Path(name).as_posix()] = expected.lower()
    if not files:
        raise ManifestError(f"{MANIFEST} lists no files")
    return files


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def files_in(version_dir: Path) -> list[str]:
    """Every file under a version folder, as a relative POSIX path."""
    found = []
    for root, dirs, names in os.walk(version_dir):
        dirs.sort()
        for name in sorted(names):
            found.append((Path(root) / name).relative_to(version_dir).as_posix())
    return found


def read_checked(version_dir: Path, policy: ManifestPolicy) -> dict[str, str] | None:
    """The version's verified manifest (None when it has none and none is required).

    Raises ManifestError saying why the version is not complete or not trusted.
    """
    manifest = version_dir / MANIFEST
    if not manifest.is_file():
        if policy.signed:
            raise ManifestError(f"no {MANIFEST} manifest and --manifest-public-key is set")
        if policy.required:
            raise ManifestError(f"no {MANIFEST} manifest and --require-manifest is set")
        return None
    try:
        raw = manifest.read_bytes()
        files = parse_manifest(raw.decode("utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ManifestError(f"cannot read {MANIFEST}: {exc}") from exc
    if policy.signed:
        try:
            signature = (version_dir / SIGNATURE).read_bytes()
        except OSError:
            raise ManifestError(
                f"no {SIGNATURE} signature and --manifest-public-key is set"
            ) from None
        verify_signature(policy.public_key, raw, signature)
        unlisted = [f for f in files_in(version_dir) if f not in files and f not in BOOKKEEPING]
        if unlisted:
            raise ManifestError(f"files not in the signed {MANIFEST}: {', '.join(unlisted)}")
    return files


def check_version(version_dir: Path, policy: ManifestPolicy) -> str:
    """'' when the version is complete (and trusted), else why not."""
    try:
        files = read_checked(version_dir, policy)
    except ManifestError as exc:
        return str(exc)
    for name, expected in (files or {}).items():
        path = version_dir / name
        try:  # OSError: found by fuzzing (a listed name longer than a file name can be)
            if not path.is_file():
                return f"incomplete: '{name}' listed in {MANIFEST} is missing"
            if sha256_of(path) != expected:
                return f"incomplete: '{name}' does not match its sha256 in {MANIFEST}"
        except OSError as exc:
            return f"incomplete: '{name}' listed in {MANIFEST} cannot be read: {exc.strerror}"
    return ""


def write_manifest(version_dir: Path, private_key: Any = None) -> Path:
    """Write SHA256SUMS for every file of a version folder (and sign it with the key)."""
    names = [f for f in files_in(version_dir) if f not in BOOKKEEPING]
    if not names:
        raise ManifestError(f"'{version_dir}' has no files to list")
    text = "".join(f"{sha256_of(version_dir / n)}  {n}\n" for n in names)
    manifest = version_dir / MANIFEST
    manifest.write_text(text, encoding="utf-8")
    if private_key is not None:
        (version_dir / SIGNATURE).write_bytes(private_key.sign(text.encode("utf-8")))
    return manifest
