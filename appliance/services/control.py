"""Everything but inference, transport-neutral: health, metadata, config, statistics, repository,
trace and log settings, shared memory regions.

Answers are typed values (services/results.py); each front end converts them to its wire form
with one converter of its own, so both protocols say the same thing.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import importlib.util
import logging
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from google.protobuf import json_format

from appliance import __version__, buildinfo
from appliance.buildinfo import JETSON_RELEASE
from appliance.errors import ApplianceError, ConfigError, InvalidInput, ModelNotFound
from appliance.logs import LogSettings, LogState
from appliance.protocol import model_config_pb2 as mc
from appliance.repository.local import check_model_name
from appliance.runtime.models import ModelRuntime
from appliance.runtime.registry import READY, UNAVAILABLE, ModelRecord, ServedVersion
from appliance.scheduling.stats import Duration
from appliance.services.results import (
    BatchStatistics,
    CudaSharedMemoryRegion,
    IndexRow,
    InferStatistics,
    ModelMetadata,
    ModelStatistics,
    Readiness,
    ServerMetadata,
    StatisticDuration,
    SystemSharedMemoryRegion,
    TensorMetadata,
    TraceSettings,
)
from appliance.services.shared_memory import SharedMemoryRegistry
from appliance.trace import Tracer

# tritonserver's list, in its order, with what is implemented here (generate too).
EXTENSIONS = (
    "classification",
    "sequence",
    "model_repository",
    "model_repository(unload_dependents)",
    "schedule_policy",
    "model_configuration",
    "system_shared_memory",
    "binary_tensor_data",
    "parameters",
    "statistics",
    "trace",
    "logging",
    "generate",
)


def extensions() -> tuple[str, ...]:
    """The server metadata's extensions: `cuda_shared_memory` too where a CUDA library is
    installed (pycuda or cuda-python) and the device has CUDA IPC (not a Jetson)."""
    cuda = not JETSON_RELEASE.exists() and any(
        importlib.util.find_spec(module) is not None for module in ("pycuda", "cuda")
    )
    if not cuda:
        return EXTENSIONS
    at = EXTENSIONS.index("system_shared_memory") + 1
    return (*EXTENSIONS[:at], "cuda_shared_memory", *EXTENSIONS[at:])

log = logging.getLogger(__name__)


@dataclass
class ServerState:
    """Server-wide flags the health endpoints report."""

    live: bool = True
    loading_done: bool = False
    shutting_down: bool = False


class ControlService:
    """Everything but inference, for both front ends; answers are typed results."""

    def __init__(
        self,
        manager: ModelRuntime,
        state: ServerState,
        control_mode: str,
        strict_readiness: bool,
        tracer: Tracer | None = None,
        logs: LogSettings | None = None,
        shared_memory: SharedMemoryRegistry | None = None,
    ) -> None:
        self.tracer = tracer or Tracer()
        self.logs = logs or LogSettings()
        # The registered regions. The front ends' codecs read tensors from the same registry;
        # the composition root hands it to them (they do not reach for it through here).
        self.shared_memory = shared_memory or SharedMemoryRegistry()
        self._build = buildinfo.summary()
        self._extensions = extensions()
        self.manager = manager
        self.state = state
        self.control_mode = control_mode
        self.strict_readiness = strict_readiness

    # ---- health ------------------------------------------------------------------------------

    def server_live(self) -> bool:
        return self.state.live

    def server_ready(self) -> bool:
        """Ready once start-up loading is done (and, with --strict-readiness, all models are)."""
        return self.readiness().ready

    def readiness(self) -> Readiness:
        """Readiness with its reasons: each model with no version serving and why (not fetched
        for lack of disk, with the numbers; failed), and notes on what serves (a pin). With
        --strict-readiness any such model, one still to be fetched too, means not ready."""
        records = self.manager.registry.records()
        rows = index_rows(records, self.manager.pending())
        serving = {row.name for row in rows if row.state == READY}
        problems = tuple(
            f"model '{row.name}'{'' if row.version is None else f' version {row.version}'}: "
            f"{row.reason or row.state}"
            for row in rows
            if row.name not in serving
        )
        notes = tuple(f"model '{r.name}': {note}" for r in records for note in r.notes)
        if self.state.shutting_down:
            return Readiness(False, ("server is shutting down", *problems), notes)
        if not self.state.loading_done:
            return Readiness(False, ("starting: loading models", *problems), notes)
        return Readiness(not (self.strict_readiness and problems), problems, notes)

    def model_ready(self, name: str, version: str = "") -> bool:
        return self.manager.is_ready(name, version)

    # ---- metadata ----------------------------------------------------------------------------

    def server_metadata(self) -> ServerMetadata:
        # "triton": Triton's own clients and examples check the name; the version is ours.
        return ServerMetadata("triton", __version__, self._extensions, self._build)

    def model_metadata(self, name: str, version: str = "") -> ModelMetadata:
        served = self.manager.get(name, version)
        record = self.manager.record(name)
        lead = (-1,) if served.max_batch_size > 0 else ()
        return ModelMetadata(
            name=name,
            versions=tuple(sorted(record.versions)),
            platform=served.config.platform or served.config.backend,
            inputs=tuple(
                TensorMetadata(r.name, r.datatype, (*lead, *r.dims))
                for r in served.inputs.values()
            ),
            outputs=tuple(
                TensorMetadata(r.name, r.datatype, (*lead, *r.dims))
                for r in served.outputs.values()
            ),
        )

    def model_config(self, name: str, version: str = "") -> mc.ModelConfig:
        config: mc.ModelConfig = self.manager.get(name, version).config
        return config

    # ---- statistics --------------------------------------------------------------------------

    def statistics(self, name: str = "", version: str = "") -> list[ModelStatistics]:
        """One model version's, a model's ready versions', or every ready version's counters."""
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
        return [model_statistics(served) for served in chosen]

    # ---- trace -----------------------------------------------------------------------------

    def trace_settings(
        self, model: str = "", changes: dict[str, Any] | None = None
    ) -> TraceSettings:
        """Read or update trace settings (global, or one model's overrides)."""
        if model:
            self.manager.record(model)  # an unknown model is an error, as in Triton
        settings = self.tracer.update(model, changes) if changes else self.tracer.settings(model)
        return TraceSettings(
            trace_file=settings["trace_file"],
            trace_level=tuple(settings["trace_level"]),
            trace_rate=settings["trace_rate"],
            trace_count=settings["trace_count"],
            log_frequency=settings["log_frequency"],
            trace_mode=settings["trace_mode"],
        )

    # ---- logging -----------------------------------------------------------------------------

    def log_settings(self, changes: dict[str, Any] | None = None) -> LogState:
        """Read or update the log settings (Triton's logging extension); all of them back."""
        if changes:
            self.logs.update(changes)
        return self.logs.state

    # ---- system and CUDA shared memory -------------------------------------------------------

    def register_system_shared_memory(
        self, name: str, key: str, offset: int, byte_size: int
    ) -> None:
        """Map a window of the POSIX shared memory object `key` under `name`."""
        if "\0" in key:  # the file system would refuse it with ValueError
            raise InvalidInput(
                f"shared memory region '{name}': key {key!r} contains a NUL character, which "
                "no shared memory object's name can hold"
            )
        self.shared_memory.register(name, key, offset, byte_size)

    def unregister_system_shared_memory(self, name: str = "") -> None:
        """Forget one system region ('': all of them)."""
        self.shared_memory.unregister(name)

    def system_shared_memory_status(self, name: str = "") -> list[SystemSharedMemoryRegion]:
        """The registered system regions by name ('': all; an unknown name: NOT_FOUND)."""
        return [
            SystemSharedMemoryRegion(r["name"], r["key"], r["offset"], r["byte_size"])
            for r in self.shared_memory.status(name)
        ]

    async def register_cuda_shared_memory(
        self, name: str, raw_handle: bytes, device_id: int, byte_size: int
    ) -> None:
        """Open a client's CUDA IPC handle under `name` (UNSUPPORTED where there is no CUDA
        IPC). Opening a device and a handle blocks, so it runs on a thread."""
        await asyncio.to_thread(
            self.shared_memory.register_cuda, name, raw_handle, device_id, byte_size
        )

    def unregister_cuda_shared_memory(self, name: str = "") -> None:
        """Close one CUDA region ('': all of them)."""
        self.shared_memory.unregister_cuda(name)

    def cuda_shared_memory_status(self, name: str = "") -> list[CudaSharedMemoryRegion]:
        """The registered CUDA regions by name ('': all; an unknown name: NOT_FOUND)."""
        return [
            CudaSharedMemoryRegion(r["name"], r["device_id"], r["byte_size"])
            for r in self.shared_memory.cuda_status(name)
        ]

    # ---- repository --------------------------------------------------------------------------

    def repository_index(self, ready_only: bool = False) -> list[IndexRow]:
        """Triton's repository index: a row per model version (per model when none loaded)."""
        on_disk: Iterable[str] = ()
        if not ready_only:  # models on disk that were never loaded are listed too, as in Triton
            try:
                on_disk = self.manager.model_names()
            except ApplianceError:
                on_disk = ()
        records = self.manager.registry.records()
        return index_rows(records, self.manager.pending(), on_disk, ready_only)

    async def load_model(self, name: str, parameters: dict[str, Any]) -> None:
        """Load (or reload) a model; fails with the reason when no version came into service
        or a version of it failed (as tritonserver answers 400), even though the runtime keeps
        serving what it served before. `pin_version` / `unpin` pin or unpin it instead."""
        if "pin_version" in parameters or "unpin" in parameters:
            check_model_name(name)
            await self.manager.pin(name, _pin_parameters(name, parameters))
            return
        self.manager.require_explicit(self.control_mode)
        check_model_name(name)
        override = None
        config_json = parameters.get("config")
        if config_json:
            override = mc.ModelConfig()
            try:
                json_format.Parse(str(config_json), override)
            except json_format.ParseError as exc:
                # tritonserver's words: client scripts look for "failed to load"; the log says
                # what was wrong with the override.
                log.warning("model '%s': Invalid config override: %s", name, exc)
                raise ConfigError(
                    f"failed to load '{name}', failed to poll from model repository: "
                    f"Invalid config override: {exc}"
                ) from exc
        files = {str(k)[5:]: v for k, v in parameters.items() if str(k).startswith("file:")}
        source = None
        if files:
            if override is None:
                raise ConfigError(
                    f"model '{name}': file overrides need the 'config' parameter too (as in Triton)"
                )
            source = await _write_overrides(name, files)
        before = self.manager.registry.find(name)
        served_before = dict(before.versions) if before else {}
        failed_before = dict(before.failed) if before else {}
        try:
            await self.manager.load(name, override, source)
            _check_loaded(self.manager.record(name), served_before, failed_before)
        except BaseException:
            if source is not None:
                await self._discard_override(name, source)
            raise

    async def _discard_override(self, name: str, source: Path) -> None:
        """Remove a refused load's override folder unless the runtime serves from it."""
        record = self.manager.registry.find(name)
        if record is None or record.owned_dir != source.parent:
            await asyncio.to_thread(shutil.rmtree, source.parent, True)

    async def unload_model(self, name: str, unload_dependents: bool = False) -> None:
        self.manager.require_explicit(self.control_mode)
        if unload_dependents:
            await self.manager.unload_with_dependents(name)
        else:
            await self.manager.unload(name)


def _pin_parameters(name: str, parameters: dict[str, Any]) -> int | None:
    """The version a pin request asks for (None: unpin). A load request with
    `{"pin_version": N}` serves version N alone from now on, across polls and restarts, in
    every control mode; `{"unpin": true}` goes back to the version policy."""
    others = sorted(str(k) for k in parameters if k not in ("pin_version", "unpin"))
    if others or len(parameters) != 1:
        raise InvalidInput(
            f"model '{name}': 'pin_version' or 'unpin' comes alone in a load request "
            f"(also given: {', '.join(others) or 'both'})"
        )
    if "unpin" in parameters:
        if parameters["unpin"] is not True:
            raise InvalidInput(f"model '{name}': 'unpin' must be true")
        return None
    value = parameters["pin_version"]
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidInput(f"model '{name}': 'pin_version' must be a version number, got {value!r}")
    return value


def _check_loaded(
    record: ModelRecord, served_before: dict[int, Any], failed_before: dict[int, str]
) -> None:
    """ConfigError with each version's reason when a load brought no version into service, or
    a version failed in it (a version still rolled back since before does not count)."""
    new = [v for v, served in record.versions.items() if served_before.get(v) is not served]
    failed_now = {v: why for v, why in record.failed.items() if failed_before.get(v) != why}
    failures = failed_now or ({} if new else dict(record.failed))
    if not failures and (new or record.versions):
        return
    reasons = "; ".join(
        f"version {v} is at UNAVAILABLE state: {why}" for v, why in sorted(failures.items())
    ) or (record.reason or "no version loaded")
    if new:
        serving = f"; version(s) {sorted(new)} loaded and serve"
    elif record.versions:
        serving = f"; the versions loaded before keep serving: {sorted(record.versions)}"
    else:
        serving = ""
    raise ConfigError(f"load failed for model '{record.name}': {reasons}{serving}")


async def _write_overrides(name: str, files: dict[str, Any]) -> Path:
    """`_override_folder` off the loop (up to the request size of files to decode and write).
    A request cancelled meanwhile (its client went away) still removes what the thread wrote."""
    write = asyncio.ensure_future(asyncio.to_thread(_override_folder, name, files))
    try:
        return await asyncio.shield(write)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):  # a refusal: the thread removed it already
            folder = await write
            await asyncio.to_thread(shutil.rmtree, folder.parent, True)
        raise


def _override_folder(name: str, files: dict[str, Any]) -> Path:
    """Write a load request's `file:` overrides into a model folder of their own (blocking).

    Returns the model folder; its parent is the server's to remove. On any refusal nothing is
    left behind (a refused request must not fill the disk)."""
    folder = Path(tempfile.mkdtemp(prefix="edge-appliance-override-"))
    try:
        root = folder / name
        for relative in sorted(files):  # the same answer whatever order the client used
            _write_override(name, root, relative, files[relative])
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return root


def _write_override(name: str, root: Path, relative: str, content: Any) -> None:
    where = f"model '{name}': file override {relative!r}"  # repr: the client's characters
    if isinstance(content, str):  # HTTP sends base64 text, gRPC raw bytes
        try:
            content = base64.b64decode(content, validate=True)
        except (binascii.Error, ValueError):
            raise ConfigError(f"{where} is not valid base64") from None
    elif not isinstance(content, bytes):  # bytes(an integer) would allocate that many
        raise ConfigError(
            f"{where} must be base64 text (HTTP) or bytes (gRPC), got {type(content).__name__}"
        )
    if "\0" in relative:
        raise ConfigError(f"{where}: a path cannot contain a NUL character")
    path = (root / relative).resolve()
    if root.resolve() not in path.parents or not relative:
        raise ConfigError(f"model '{name}': file override path {relative!r} is not allowed")
    # A file the file system refuses fails the load as tritonserver's poll fails it: INTERNAL,
    # "failed to poll from model repository" (Triton's model-control example checks both).
    failed = f"failed to load '{name}', failed to poll from model repository: {where}"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    except (FileExistsError, NotADirectoryError, IsADirectoryError) as exc:
        raise ApplianceError(
            f"{failed} cannot be written: {exc.strerror}; the overrides name a path as both "
            "a file and a folder"
        ) from None
    except OSError as exc:  # e.g. a name longer than the file system allows
        raise ApplianceError(f"{failed} cannot be written: {exc.strerror}") from None


def _duration(duration: Duration) -> StatisticDuration:
    return StatisticDuration(duration.count, duration.ns)


def model_statistics(served: ServedVersion) -> ModelStatistics:
    """A snapshot of a served version's counters."""
    stats = served.stats
    return ModelStatistics(
        name=served.name,
        version=served.version,
        last_inference_ms=stats.last_inference_ms,
        inference_count=stats.inference_count,
        execution_count=stats.execution_count,
        inference_stats=InferStatistics(
            success=_duration(stats.success),
            fail=_duration(stats.fail),
            queue=_duration(stats.queue),
            compute_input=_duration(stats.compute_input),
            compute_infer=_duration(stats.compute_infer),
            compute_output=_duration(stats.compute_output),
            cache_hit=_duration(stats.cache_hit),
            cache_miss=_duration(stats.cache_miss),
        ),
        batch_stats=tuple(
            BatchStatistics(
                batch_size=size,
                compute_input=_duration(per_size.compute_input),
                compute_infer=_duration(per_size.compute_infer),
                compute_output=_duration(per_size.compute_output),
            )
            for size, per_size in sorted(stats.by_batch_size.items())
        ),
    )


def _join(*parts: str) -> str:
    return "; ".join(part for part in parts if part)


def _model_rows(record: ModelRecord, pending: Mapping[int, str]) -> list[IndexRow]:
    """One model's rows; `pending`: its versions not fetched into the store yet, and why."""
    note = "; ".join(record.notes)
    rows: dict[int, tuple[str, str]] = {}
    for version in record.versions:
        if version in record.failed:  # new content failed; the loaded copy keeps serving
            rows[version] = (READY, _join(note, f"new content failed: {record.failed[version]}"))
        else:
            rows[version] = (READY, note)
    for version, why in record.failed.items():
        if version not in record.versions:
            rows[version] = (UNAVAILABLE, why)
    for version, why in pending.items():
        if version in record.versions:  # an older copy of this version still serves
            rows[version] = (READY, _join(note, f"new content not fetched: {why}"))
        else:
            rows[version] = (UNAVAILABLE, f"not fetched: {why}")
    if not rows:
        return [IndexRow(record.name, None, record.state, record.reason)]
    return [IndexRow(record.name, v, state, reason) for v, (state, reason) in rows.items()]


def index_rows(
    records: Iterable[ModelRecord],
    pending: Mapping[tuple[str, int], str],
    on_disk: Iterable[str] = (),
    ready_only: bool = False,
) -> list[IndexRow]:
    """The repository index from the runtime's records, the versions still to be fetched
    (model, version -> why) and the model folders on disk (listed, never loaded, unless
    `ready_only`). Sorted by name, then version, as Triton lists them."""
    by_name = {record.name: record for record in records}
    names = by_name.keys() | {model for model, _ in pending}
    rows: list[IndexRow] = []
    for name in names:
        record = by_name.get(name) or ModelRecord(name=name, path=None)
        rows += _model_rows(record, {v: why for (m, v), why in pending.items() if m == name})
    if ready_only:
        rows = [row for row in rows if row.state == READY]
    else:
        rows += [IndexRow(name, None, "", "") for name in on_disk if name not in names]
    rows.sort(key=lambda row: (row.name, -1 if row.version is None else row.version))
    return rows
