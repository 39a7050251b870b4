"""Triton's generated protocol modules (tritonclient.grpc's *_pb2), without the client.

`import tritonclient.grpc.service_pb2` first runs tritonclient/grpc/__init__.py, which imports
the whole client (ml_dtypes, rapidjson, ...): about 120 ms of start-up and 30 MB in the binary
for code the server never calls. The generated modules only need their package to exist, so
unless the client is loaded already, the package is registered bare (its __path__ only) while
they import, and unregistered after: a later `import tritonclient.grpc` (tests, tools) gets
the real client, which finds these modules already loaded.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType
from typing import Any

_PACKAGE = "tritonclient.grpc"


def _import_generated() -> tuple[ModuleType, ModuleType, ModuleType]:
    bare = None
    if _PACKAGE not in sys.modules:
        spec = importlib.util.find_spec(_PACKAGE)
        if spec is None:
            raise ImportError("tritonclient is not installed (pip install 'tritonclient[grpc]')")
        bare = importlib.util.module_from_spec(spec)  # not executed: no client imports
        sys.modules[_PACKAGE] = bare
    try:
        return (
            importlib.import_module(f"{_PACKAGE}.model_config_pb2"),
            importlib.import_module(f"{_PACKAGE}.service_pb2"),
            importlib.import_module(f"{_PACKAGE}.service_pb2_grpc"),
        )
    finally:
        if bare is not None and sys.modules.get(_PACKAGE) is bare:
            del sys.modules[_PACKAGE]


model_config_pb2: Any
service_pb2: Any
service_pb2_grpc: Any
model_config_pb2, service_pb2, service_pb2_grpc = _import_generated()
ModelConfig: Any = model_config_pb2.ModelConfig
