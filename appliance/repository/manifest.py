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

Model-level files (config.pbtxt, labels, `configs/`, `warmup/`: everything beside the version
folders) decide what runs as much as the weights do. With a key they are covered by a manifest
of their own, `<model>/SHA256SUMS` and `<model>/SHA256SUMS.sig`, written the same way in the
model folder (`edge-appliance manifest --sign-key key.pem MODEL_DIR` writes it and each
version's); a model whose model-level files are not all listed in a good signed manifest is
refused, in a local repository as in the store.
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
# Beside the version folders but never a model file: a rollout document is signed on its own
# (repository/rollout.py) and never loaded.
_ROLLOUT_FILES = frozenset({"rollout.json", "rollout.json.sig"})
_CHUNK = 1 << 20


class ManifestError(ValueError):
    """A manifest or its signature is malformed or does not verify."""


@dataclass(frozen=True)
class ManifestPolicy:
    required: bool = False  # --require-manifest
    public_key: Any = None  # an Ed25519PublicKey: manifests must be signed by it
    # OpenSSF model signatures (model.sig in a version folder), verified before a load
    model_signature: ModelSignaturePolicy | None = None

    @property
    def signed(self) -> bool:
        return self.public_key is not None


@dataclass(frozen=True)
class ModelSignaturePolicy:
    """--model-signature: how OpenSSF model signatures are verified (model_signature.py)."""

    method: str = ""  # "": off; "key", "certificate", "sigstore"
    args: tuple[str, ...] = ()  # the key, the certificate chain, or identity, issuer, trust
    required: bool = False  # --require-model-signature


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


def check_version(
    version_dir: Path, policy: ManifestPolicy, hashed: dict[str, str] | None = None
) -> str:
    """'' when the version is complete (and trusted), else why not. `hashed`: files whose
    sha256 was just checked (the store's record): not hashed again when the manifest says
    the same."""
    try:
        files = read_checked(version_dir, policy)
    except ManifestError as exc:
        return str(exc)
    for name, expected in (files or {}).items():
        path = version_dir / name
        try:  # OSError: found by fuzzing (a listed name longer than a file name can be)
            if not path.is_file():
                return f"incomplete: '{name}' listed in {MANIFEST} is missing"
            if (hashed or {}).get(name) == expected:
                continue
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


def _is_version_folder(entry: Path) -> bool:
    return entry.is_dir() and entry.name.isdigit() and str(int(entry.name)) == entry.name


def model_level_files(model_dir: Path) -> dict[str, Path]:
    """Every file of a model folder outside its version folders (its manifest and signature
    too; the sync's record and rollout documents not), by relative POSIX path (blocking)."""
    found: dict[str, Path] = {}
    for entry in sorted(model_dir.iterdir()):
        if _is_version_folder(entry):
            continue
        if entry.is_dir():
            for rel in files_in(entry):
                found[f"{entry.name}/{rel}"] = entry / rel
        elif entry.name not in _ROLLOUT_FILES and entry.name != SYNC_RECORD:
            found[entry.name] = entry
    return found


def check_model_level(files: dict[str, Path], policy: ManifestPolicy) -> str:
    """'' when the model-level files (`model_level_files`, or the same from a sync's staging)
    are all covered by the model's signed manifest and match it, else why not. Without a key
    nothing is asked (blocking: hashes them)."""
    if not policy.signed:
        return ""
    manifest, signature = files.get(MANIFEST), files.get(SIGNATURE)
    if manifest is None or signature is None:
        missing = MANIFEST if manifest is None else SIGNATURE
        return (
            f"no model-level {missing} beside the version folders and --manifest-public-key is "
            "set: config.pbtxt and every other model-level file must be signed"
        )
    try:
        raw = manifest.read_bytes()
        verify_signature(policy.public_key, raw, signature.read_bytes())
        listed = parse_manifest(raw.decode("utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        return f"cannot read the model-level {MANIFEST}: {exc}"
    except ManifestError as exc:
        return f"model-level {exc}"
    unlisted = sorted(rel for rel in files if rel not in listed and rel not in BOOKKEEPING)
    if unlisted:
        return f"model-level files not in the signed {MANIFEST}: {', '.join(unlisted)}"
    for rel, expected in sorted(listed.items()):
        path = files.get(rel)
        if path is None:
            return f"'{rel}' listed in the model-level {MANIFEST} is missing"
        if sha256_of(path) != expected:
            return f"'{rel}' does not match its sha256 in the model-level {MANIFEST}"
    return ""


def write_model_manifest(model_dir: Path, private_key: Any = None) -> Path:
    """Write the model-level SHA256SUMS (and its signature) of a model folder: every file
    beside the version folders."""
    names = sorted(r for r in model_level_files(model_dir) if r not in BOOKKEEPING)
    if not names:
        raise ManifestError(f"'{model_dir}' has no model-level files to list")
    text = "".join(f"{sha256_of(model_dir / n)}  {n}\n" for n in names)
    manifest = model_dir / MANIFEST
    manifest.write_text(text, encoding="utf-8")
    if private_key is not None:
        (model_dir / SIGNATURE).write_bytes(private_key.sign(text.encode("utf-8")))
    return manifest
