"""`edge-appliance version --verify`: a one-folder build checked against its signed record.

build/build.sh writes the binary's CycloneDX SBOM and a SHA256SUMS of every file of the build,
signed with Ed25519 in the model manifests' format; this checks them with that code
(repository/manifest.py), so it lives with the tools, above the repository layer.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import json
from pathlib import Path
from typing import Any

from appliance.ops import buildinfo
from appliance.repository.manifest import (
    MANIFEST,
    ManifestError,
    ManifestPolicy,
    check_version,
    load_public_key,
)

SBOM = "sbom.cdx.json"  # CycloneDX JSON of what the binary bundles (build/sbom.py)


def verify_build(folder: Path, public_key: Any) -> list[str]:
    """What is wrong with a build folder: its SHA256SUMS must carry a good Ed25519 signature by
    `public_key`, list every file in the folder (the SBOM among them) and match each; the SBOM
    must be CycloneDX. An empty list: the build is what was signed."""
    problem = check_version(folder, ManifestPolicy(public_key=public_key))
    if problem:
        return [problem]
    listed = (folder / MANIFEST).read_text(encoding="utf-8").split()
    if SBOM not in listed:
        return [f"no {SBOM} in the signed {MANIFEST}"]
    try:
        bom = json.loads((folder / SBOM).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return [f"{SBOM} cannot be read: {exc}"]
    if not isinstance(bom, dict) or bom.get("bomFormat") != "CycloneDX":
        return [f"{SBOM} is not a CycloneDX document"]
    return []


def sbom_summary(folder: Path) -> str:
    """'CycloneDX 1.6, 42 components' for the build's SBOM."""
    bom = json.loads((folder / SBOM).read_text(encoding="utf-8"))
    return f"CycloneDX {bom.get('specVersion', '?')}, {len(bom.get('components', []))} components"


def verify_command(args: argparse.Namespace) -> int:
    """`version --verify`: PASS or FAIL with the reason, and the exit code."""

    def say(line: str) -> None:
        print(line)  # noqa: T201

    folder = args.build_dir or buildinfo.build_folder()
    if folder is None:
        say("FAIL: not a one-folder build of edge-appliance: nothing signed to check")
        return 1
    try:
        if args.public_key is not None:
            key, whose = load_public_key(args.public_key), f"the key in {args.public_key}"
        else:
            from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

            raw = base64.b64decode(buildinfo.embedded_public_key(), validate=True)
            key, whose = Ed25519PublicKey.from_public_bytes(raw), "the embedded build key"
    except (ManifestError, ValueError, binascii.Error, ImportError) as exc:
        say(f"FAIL: no key to check the build with: {exc}")
        return 1
    problems = verify_build(folder, key)
    if problems:
        say(f"FAIL: {folder}: {'; '.join(problems)}")
        return 1
    say(
        f"PASS: {folder}: every file matches SHA256SUMS, signed by {whose}; "
        f"SBOM {SBOM} ({sbom_summary(folder)})"
    )
    return 0
