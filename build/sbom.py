"""The binary's SBOM (CycloneDX JSON), written by build/build.sh after PyInstaller:

    python build/sbom.py BUNDLED_LIST OUT.cdx.json

cyclonedx-py (the `build` extra) describes the build venv (`environment` mode: every installed
distribution with its version, PURL and licence); the components are then cut down to the
distributions the binary bundles: those owning a top-level module or package in PyInstaller's
analysis (BUNDLED_LIST, one name a line, written by edge-appliance.spec). The build's own
tools (PyInstaller, pytest, mypy, cyclonedx itself) are installed but not bundled, so they are
not in it.
"""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path


def bundled_distributions(top_names: set[str]) -> set[str]:
    """Normalised names of the distributions that own any of `top_names`."""
    owners = importlib.metadata.packages_distributions()
    found = {"edge-appliance"}
    for name in top_names:
        for dist in owners.get(name, []):
            found.add(_normal(dist))
    return found


def _normal(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def main() -> int:
    listing, out = Path(sys.argv[1]), Path(sys.argv[2])
    tops = {line.strip() for line in listing.read_text().splitlines() if line.strip()}
    keep = bundled_distributions(tops)
    full = out.with_suffix(".all.json")
    subprocess.run(
        [
            str(Path(sys.executable).parent / "cyclonedx-py"),
            "environment",
            sys.executable,
            "--pyproject",
            "pyproject.toml",
            "--of",
            "JSON",
            "--output-reproducible",
            "-o",
            str(full),
        ],
        check=True,
    )
    bom = json.loads(full.read_text())
    full.unlink()
    components = [c for c in bom.get("components", []) if _normal(c.get("name", "")) in keep]
    refs = {c.get("bom-ref") for c in components}
    root = bom.get("metadata", {}).get("component", {}).get("bom-ref")
    bom["components"] = components
    bom["dependencies"] = [
        {**d, "dependsOn": [r for r in d.get("dependsOn", []) if r in refs]}
        for d in bom.get("dependencies", [])
        if d.get("ref") in refs or d.get("ref") == root
    ]
    out.write_text(json.dumps(bom, indent=1, sort_keys=True) + "\n")
    missing = sorted(keep - {_normal(c.get("name", "")) for c in components} - {"edge-appliance"})
    print(  # noqa: T201
        f"wrote {out}: {len(components)} bundled distributions"
        + (f" (not described by cyclonedx-py: {', '.join(missing)})" if missing else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
