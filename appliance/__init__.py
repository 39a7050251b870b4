"""edge-appliance: a Triton-compatible inference server for edge devices."""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# The embedding API under Triton's package names (appliance/embed/): `from appliance import
# tritonserver` ports an application with one line. Imported on first use only, so that the
# command line and the model processes do not load it.
_LAZY = {
    "tritonserver": "appliance.embed.tritonserver",
    "tritonfrontend": "appliance.embed.tritonfrontend",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return importlib.import_module(_LAZY[name])
    raise AttributeError(f"module 'appliance' has no attribute {name!r}")
