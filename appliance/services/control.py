"""Everything but inference, transport-neutral: health, metadata, config, statistics, repository.

Answers are plain dicts in the JSON shapes of Triton's HTTP API; the gRPC front end parses the
same dicts into its protobuf messages, so both protocols say the same thing.
"""

from __future__ import annotations

import base64
import binascii
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from google.protobuf import json_format

from appliance import __version__, buildinfo
from appliance.errors import ApplianceError, ConfigError, ModelNotFound
from appliance.logs import LogSettings
from appliance.protocol import model_config_pb2 as mc
from appliance.repository.local import check_model_name
from appliance.runtime.models import ModelRuntime, ServedVersion
from appliance.services.shared_memory import SharedMemoryRegistry
from appliance.trace import Tracer

EXTENSIONS = [
    "classification",
    "generate",
    "trace",
    "logging",
    "binary_tensor_data",
    "parameters",
    "model_configuration",
    "model_repository",
    "schedule_policy",
    "statistics",
    "system_shared_memory",
]


@dataclass
class ServerState:
    """Server-wide flags the health endpoints report."""

    live: bool = True
    loading_done: bool = False
    shutting_down: bool = False


class ControlService:
    def __init__(
        self,
        manager: ModelRuntime,
        state: ServerState,
        control_mode: str,
        strict_readiness: bool,
        tracer: Tracer | None = None,
        logs: LogSettings | None = None,
    ) -> None:
        self.tracer = tracer or Tracer()
        self.logs = logs or LogSettings()
        self.shared_memory = SharedMemoryRegistry()
        self._build = buildinfo.summary()
        self.manager = manager
        self.state = state
        self.control_mode = control_mode
        self.strict_readiness = strict_readiness

    # ---- health ------------------------------------------------------------------------------

    def server_live(self) -> bool:
        return self.state.live

    def server_ready(self) -> bool:
        """Ready once start-up loading is done (and, with --strict-readiness, all models are)."""
        if self.state.shutting_down or not self.state.loading_done:
            return False
        return self.manager.all_ready() if self.strict_readiness else True

    def model_ready(self, name: str, version: str = "") -> bool:
        return self.manager.is_ready(name, version)

    # ---- metadata ----------------------------------------------------------------------------

    def server_metadata(self) -> dict[str, Any]:
        """Triton's fields, plus "build" (commit, Python), which the HTTP JSON carries and
        tritonclient ignores; the gRPC message has no such field and drops it."""
        # "triton": Triton's own clients and examples check the name; the version is ours.
        return {
            "name": "triton",
            "version": __version__,
            "extensions": EXTENSIONS,
            "build": self._build,
        }

    def model_metadata(self, name: str, version: str = "") -> dict[str, Any]:
        served = self.manager.get(name, version)
        record = self.manager.record(name)
        lead = [-1] if served.max_batch_size > 0 else []
        return {
            "name": name,
            "versions": [str(v) for v in sorted(record.versions)],
            "platform": served.config.platform or served.config.backend,
            "inputs": [
                {"name": r.name, "datatype": r.datatype, "shape": [*lead, *r.dims]}
                for r in served.inputs.values()
            ],
            "outputs": [
                {"name": r.name, "datatype": r.datatype, "shape": [*lead, *r.dims]}
                for r in served.outputs.values()
            ],
        }

    def model_config(self, name: str, version: str = "") -> mc.ModelConfig:
        config: mc.ModelConfig = self.manager.get(name, version).config
        return config

    # ---- statistics --------------------------------------------------------------------------

    def statistics(self, name: str = "", version: str = "") -> dict[str, Any]:
        if name:
            if version:
                chosen: list[ServedVersion] = [self.manager.get(name, version)]
            else:
                record = self.manager.record(name)
                chosen = [record.versions[v] for v in sorted(record.versions)]
                if not chosen:
                    raise ModelNotFound(f"model '{name}' has no ready versions to report")
        else:
            chosen = self.manager.ready_versions()
        return {"model_stats": [s.stats.as_dict(s.name, str(s.version)) for s in chosen]}

    # ---- trace -----------------------------------------------------------------------------

    def trace_settings(
        self, model: str = "", changes: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Read or update trace settings (global, or one model's overrides)."""
        if model:
            self.manager.record(model)  # an unknown model is an error, as in Triton
        if changes:
            return self.tracer.update(model, changes)
        return self.tracer.settings(model)

    # ---- logging -----------------------------------------------------------------------------

    def log_settings(self, changes: dict[str, Any] | None = None) -> dict[str, Any]:
        """Read or update the log settings (Triton's logging extension); all of them back."""
        return self.logs.update(changes) if changes else self.logs.as_dict()

    # ---- repository --------------------------------------------------------------------------

    def repository_index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        # Models on disk that were never loaded are listed too, as Triton does.
        listed = self.manager.index(ready_only)
        if not ready_only:
            known = {e["name"] for e in listed}
            try:
                names = self.manager.model_names()
            except ApplianceError:
                names = {}
            listed += [{"name": n, "state": "", "reason": ""} for n in names if n not in known]
            listed.sort(key=lambda e: (e["name"], e.get("version", "")))
        return listed

    async def load_model(self, name: str, parameters: dict[str, Any]) -> None:
        self.manager.require_explicit(self.control_mode)
        check_model_name(name)
        override = None
        config_json = parameters.get("config")
        if config_json:
            override = mc.ModelConfig()
            try:
                json_format.Parse(str(config_json), override)
            except json_format.ParseError as exc:
                raise ConfigError(f"model '{name}': bad 'config' override: {exc}") from exc
        files = {str(k)[5:]: v for k, v in parameters.items() if str(k).startswith("file:")}
        source = None
        if files:
            if override is None:
                raise ConfigError(
                    f"model '{name}': file overrides need the 'config' parameter too (as in Triton)"
                )
            source = self._override_folder(name, files)
        await self.manager.load(name, override, source)

    def _override_folder(self, name: str, files: dict[str, Any]) -> Path:
        """Write a load request's `file:` overrides into a model folder of their own."""
        root = Path(tempfile.mkdtemp(prefix="edge-appliance-override-")) / name
        for relative, content in files.items():
            path = (root / relative).resolve()
            if root.resolve() not in path.parents or not relative:
                raise ConfigError(f"model '{name}': file override path '{relative}' is not allowed")
            if isinstance(content, str):  # HTTP sends base64 text, gRPC raw bytes
                try:
                    content = base64.b64decode(content, validate=True)
                except (binascii.Error, ValueError):
                    raise ConfigError(
                        f"model '{name}': file override '{relative}' is not valid base64"
                    ) from None
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(bytes(content))
        return root

    async def unload_model(self, name: str, unload_dependents: bool = False) -> None:
        self.manager.require_explicit(self.control_mode)
        if unload_dependents:
            await self.manager.unload_with_dependents(name)
        else:
            await self.manager.unload(name)
