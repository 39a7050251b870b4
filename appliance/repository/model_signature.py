"""OpenSSF Model Signing (the `model-signing` package, the v1.0 signature format): a version
folder signed as a whole, its signature in `model.sig` beside its files.

With `--model-signature METHOD:...` every version folder that holds a `model.sig` is verified
before a byte of it is loaded, and with `--require-model-signature` one without is refused:

    key:PUBLIC.pem                       a key pair's public key (model_signing sign key)
    certificate:CA.pem[,INTERMEDIATE...] a certificate chain the signing certificate ends in
    sigstore:IDENTITY,ISSUER,TRUST.json  a Sigstore bundle, verified offline against the trust
                                         configuration file (Fulcio roots, Rekor keys)

A version whose signature does not verify, or that holds a file the signature does not cover
(unsigned code or weights beside signed ones), is never loaded; the reason is the version's
on the repository index and the status page. The store's own record (`.edge-sync.json`) and
the signature are the only files a signature need not cover.
"""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from typing import Any

from appliance.common import extras
from appliance.repository.manifest import SYNC_RECORD, ModelSignaturePolicy, files_in

SIGNATURE_FILE = "model.sig"
MAX_SIGNATURE_BYTES = 16 << 20  # a bundle lists every file's digest: a few KB a hundred files
_UNSIGNED = frozenset({SIGNATURE_FILE, SYNC_RECORD})
METHODS = ("key", "certificate", "sigstore")


def parse_policy(value: str, required: bool) -> ModelSignaturePolicy:
    """`--model-signature` (and `--require-model-signature`) -> the policy; ValueError."""
    if not value:
        if required:
            raise ValueError("--require-model-signature needs --model-signature METHOD:...")
        return ModelSignaturePolicy()
    method, _, rest = value.partition(":")
    parts = tuple(p for p in rest.split(",") if p)
    if method not in METHODS or not parts:
        raise ValueError(
            f"--model-signature '{value}': expected key:PUBLIC.pem, "
            "certificate:CA.pem[,MORE.pem] or sigstore:IDENTITY,ISSUER,TRUST_CONFIG.json"
        )
    if method == "sigstore":
        if len(parts) != 3:
            raise ValueError(
                f"--model-signature '{value}': sigstore needs IDENTITY,ISSUER,TRUST_CONFIG.json "
                "(the trust configuration makes the verification offline)"
            )
        files: tuple[str, ...] = (parts[2],)
    else:
        files = parts
    for name in files:
        if not Path(name).is_file():
            raise ValueError(f"--model-signature: '{name}' is not a file")
    return ModelSignaturePolicy(method, parts, required)


def _verifier(policy: ModelSignaturePolicy) -> Any:
    from model_signing import verifying

    # model_signing's Config.__init__ carries no annotations
    config = verifying.Config().set_ignore_unsigned_files(True)  # type: ignore[no-untyped-call]
    if policy.method == "key":
        return config.use_elliptic_key_verifier(public_key=policy.args[0])
    if policy.method == "certificate":
        return config.use_certificate_verifier(certificate_chain=list(policy.args))
    identity, issuer, trust = policy.args
    return config.use_sigstore_verifier(
        identity=identity, oidc_issuer=issuer, trust_config=Path(trust)
    )


def _signed_files(signature: Path) -> set[str]:
    """The file names a (verified) v1.0 signature covers: its DSSE payload's resources."""
    bundle = json.loads(signature.read_bytes())
    payload = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))
    return {str(r["name"]) for r in payload["predicate"]["resources"]}


def _why(exc: Exception) -> str:
    """The library's reason in one short line: its manifest diff names files and prints
    digests as byte reprs; the names are what an operator needs."""
    text = str(exc)
    if "Signature mismatch" in text:
        changed = re.findall(r"Hash mismatch for \\?'([^'\\]+)", text)
        missing = re.search(r"Missing files in model '[^']*': ([^\]\"]+)", text)
        parts = [f"'{name}' does not match its signed digest" for name in changed[:10]]
        if missing:
            parts.append(f"signed files missing: {missing.group(1).strip(chr(39))}")
        if parts:
            return "; ".join(parts)
    return " ".join(text.split())[:300] or type(exc).__name__


def check_model_signature(version_dir: Path, policy: ModelSignaturePolicy) -> str:
    """'' when the version may load under the policy, else why not (blocking: hashes every
    file of the version)."""
    if not policy.method:
        return ""
    signature = version_dir / SIGNATURE_FILE
    if not signature.is_file():
        if policy.required:
            return (
                f"no {SIGNATURE_FILE} (OpenSSF model signature) and --require-model-signature "
                "is set"
            )
        return ""
    size = signature.stat().st_size
    if size > MAX_SIGNATURE_BYTES:
        return f"{SIGNATURE_FILE} is {size} bytes, more than the {MAX_SIGNATURE_BYTES} it may be"
    problem = extras.missing("model_signing", "--model-signature")
    if problem:
        return problem
    try:
        _verifier(policy).verify(version_dir, signature)
        signed = _signed_files(signature)
    except Exception as exc:  # the library raises ValueError and sigstore's own errors
        return f"{SIGNATURE_FILE} does not verify ({policy.method}): {_why(exc)}"
    unsigned = [f for f in files_in(version_dir) if f not in signed and f not in _UNSIGNED]
    if unsigned:
        return f"files not covered by {SIGNATURE_FILE}: {', '.join(unsigned[:10])}"
    return ""
