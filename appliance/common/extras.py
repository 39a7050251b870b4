"""The optional dependencies (pyproject.toml's extras) and how to get one that is missing:
`pip install 'edge-appliance[s3]'` in a Python install; in the one-file binary, which
packages what it packages, whether this build has it (build/edge-appliance.spec)."""

from __future__ import annotations

import importlib.util
import sys

# module -> the extra that installs it
EXTRA_OF = {
    "aiobotocore": "s3",
    "botocore": "s3",
    "cryptography": "signing",
    "tuf": "signing",
    "model_signing": "modelsigning",
    "openvino": "openvino",
    "torch": "torch",
    "tensorrt": "gpu",
}
# What build/edge-appliance.spec packages into the binary (it excludes torch and openvino).
IN_BINARY = frozenset({"aiobotocore", "botocore", "cryptography", "tuf"})


def frozen() -> bool:
    """A PyInstaller build (the one-file binary)."""
    return bool(getattr(sys, "frozen", False))


def installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def how_to_get(module: str) -> str:
    """`pip install 'edge-appliance[s3]'`, or what a binary without the module can do."""
    extra = EXTRA_OF.get(module)
    if frozen():
        return (
            f"this binary does not include {module}; a Python install has it "
            f"(pip install 'edge-appliance[{extra}]')"
            if extra
            else f"this binary does not include {module}"
        )
    return f"pip install 'edge-appliance[{extra}]'" if extra else f"pip install {module}"


def missing(module: str, needed_by: str) -> str | None:
    """None when `module` is importable, else one line: what needs it and how to get it,
    e.g. `--model-repository s3://...: needs aiobotocore, not installed: pip install ...`."""
    if installed(module):
        return None
    return f"{needed_by} needs {module}, which is not installed: {how_to_get(module)}"
