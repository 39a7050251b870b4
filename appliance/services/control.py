"""Everything but inference, transport-neutral: health, metadata, config, statistics, repository,
trace and log settings, shared memory regions.

Answers are typed values (services/results.py); each front end converts them to its wire form
with one converter of its own, so both protocols say the same thing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import logging
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from google.protobuf import json_format

from appliance import __version__
from appliance.common.errors import (
    ApplianceError,
    ClientShmDisabled,
    ConfigError,
    InvalidInput,
    NoVersionAvailable,
)
from appliance.common.protocol import model_config_pb2 as mc
from appliance.common.protojson import parse_lenient
from appliance.ops import buildinfo
from appliance.ops.buildinfo import JETSON_RELEASE
from appliance.ops.logs import LogSettings, LogState
from appliance.ops.trace import Tracer
from appliance.repository.local import check_model_name, plain_name
from appliance.runtime.models import ModelRuntime
from appliance.runtime.registry import READY, ServedVersion
from appliance.services.load_requests import check_loaded, pin_parameters, write_overrides
from appliance.services.results import (
    CudaSharedMemoryRegion,
    IndexRow,
    ModelMetadata,
    ModelStatistics,
    Readiness,
    ServerMetadata,
    SystemSharedMemoryRegion,
    TensorMetadata,
    TraceSettings,
)
from appliance.services.rows import index_rows, model_statistics
from appliance.services.shared_memory import SharedMemoryRegistry


class SourceHealth(Protocol):
    """A remote repository's last sync, as readiness reports it (repository/s3.py's S3Source)."""

    @property
    def url(self) -> str: ...
    @property
    def reachable(self) -> bool | None: ...  # None until the first sync
    @property
    def last_error(self) -> str: ...
    @property
    def frozen_since_s(self) -> float: ...  # TUF mode's freeze (0: not frozen)


def shown_url(url: str) -> str:
    """A repository URL without any user or password in it."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    host, slash, path = rest.partition("/")
    return f"{scheme}://{host.rpartition('@')[2]}{slash}{path}"


def source_problems(sources: Iterable[SourceHealth]) -> tuple[str, ...]:
    """One line per remote repository whose last sync failed, with the source's reason (a
    bucket that does not exist, a name that does not resolve, a 403)."""
    return tuple(
        f"model source {shown_url(s.url)} "
        f"{'refused' if s.frozen_since_s else 'unreachable'}: "
        f"{s.last_error or 'the last sync failed'} (serving what the model store holds)"
        for s in sources
        if s.reachable is False
    )


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
        runtime: ModelRuntime,
        state: ServerState,
        control_mode: str,
        strict_readiness: bool,
        tracer: Tracer | None = None,
        logs: LogSettings | None = None,
        shared_memory: SharedMemoryRegistry | None = None,
        server_id: str = "triton",
        allow_client_shm: bool = False,
        sources: Sequence[SourceHealth] = (),
    ) -> None:
        # The remote repositories: one whose last sync failed is a problem readiness names.
        self.sources = tuple(sources)
        self.tracer = tracer or Tracer()
        # "triton" unless --id says otherwise: Triton's own clients and examples check it.
        self.server_id = server_id
        # --allow-client-shm: clients may register and unregister shared memory regions (off by
        # default, as in tritonserver since 2026: a region maps any /dev/shm object the
        # service can open, other processes' included). Status stays open.
        self.allow_client_shm = allow_client_shm
        self.logs = logs or LogSettings()
        # The registered regions. The front ends' codecs read tensors from the same registry;
        # the composition root hands it to them (they do not reach for it through here).
        self.shared_memory = shared_memory or SharedMemoryRegistry()
        self._build = buildinfo.summary()
        self._extensions = extensions()
        self.runtime = runtime
        self.state = state
        self.control_mode = control_mode
        self.strict_readiness = strict_readiness
        # Model readiness checks that ask a model, going on, by (name, version): callers on
        # the loop share one (a thread each would let a slow is_ready() take the pool).
        self._ready_checks: dict[tuple[str, int], asyncio.Future[bool]] = {}

    # ---- health ------------------------------------------------------------------------------

    def server_live(self) -> bool:
        return self.state.live

    def server_ready(self) -> bool:
        """Ready once start-up loading is done (and, with --strict-readiness, all models are,
        their instances asked as for model readiness); blocking: for threads."""
        readiness = self.readiness()
        if not (readiness.ready and self.strict_readiness):
            return readiness.ready
        return all(served.instances_ready() for served in self.runtime.registry.ready_versions())

    async def asked_readiness(self) -> Readiness:
        """`readiness` for the event loop, with --strict-readiness asking every ready
        version's instances too (a Python model's is_ready()), as Triton's strict readiness
        does: a version whose check fails is a reason for not ready."""
        readiness = self.readiness()
        if not (readiness.ready and self.strict_readiness):
            return readiness
        failed = []
        for served in self.runtime.registry.ready_versions():
            if not await self.model_ready_async(served.name, str(served.version)):
                failed.append(f"{served.label}: not ready (its instances' readiness check failed)")
        if failed:
            return Readiness(False, (*readiness.problems, *failed), readiness.notes)
        return readiness

    def readiness(self) -> Readiness:
        """Readiness with its reasons: each model with no version serving and why (not fetched
        for lack of disk, with the numbers; failed), each remote repository whose last sync
        failed and why, and notes on what serves (a pin). With --strict-readiness any such
        model, one still to be fetched too, means not ready; a failing source never does."""
        records = self.runtime.registry.records()
        rows = index_rows(records, self.runtime.pending())
        serving = {row.name for row in rows if row.state == READY}
        problems = tuple(
            f"model '{row.name}'{'' if row.version is None else f' version {row.version}'}: "
            f"{row.reason or row.state}"
            for row in rows
            if row.name not in serving
        )
        notes = tuple(f"model '{r.name}': {note}" for r in records for note in r.notes)
        # A source that cannot be synced is named, never a reason for not-ready: an unattended
        # device keeps serving what its store holds (--strict-readiness is about models).
        sources = source_problems(self.sources)
        if self.state.shutting_down:
            return Readiness(False, ("server is shutting down", *problems, *sources), notes)
        if not self.state.loading_done:
            return Readiness(False, ("starting: loading models", *problems, *sources), notes)
        return Readiness(not (self.strict_readiness and problems), (*problems, *sources), notes)

    def model_ready(self, name: str, version: str = "") -> bool:
        """Served and every instance ready; blocking while a model's is_ready() is asked
        (bounded by its backend): for threads (gRPC, the embedding API, BLS)."""
        return self.runtime.is_ready(name, version)

    async def model_ready_async(self, name: str, version: str = "") -> bool:
        """`model_ready` for the event loop: a version whose instances answer at once is
        answered here; one whose model is asked (is_ready()) is asked on a thread, one check
        at a time per version, its answer shared by every caller waiting meanwhile."""
        try:
            served = self.runtime.get(name, version)
        except ApplianceError:
            return False
        if not served.asks_readiness:
            return served.instances_ready()
        key = (served.name, served.version)
        check = self._ready_checks.get(key)
        if check is None:
            check = asyncio.ensure_future(asyncio.to_thread(served.instances_ready))
            self._ready_checks[key] = check
            check.add_done_callback(lambda _: self._ready_checks.pop(key, None))
        # Shielded: a caller that goes away leaves the check to end (within its bound).
        return await asyncio.shield(check)

    # ---- metadata ----------------------------------------------------------------------------

    def server_metadata(self) -> ServerMetadata:
        # The name is --id's ("triton" by default), as tritonserver's; the version is ours.
        return ServerMetadata(self.server_id, __version__, self._extensions, self._build)

    def model_metadata(self, name: str, version: str = "") -> ModelMetadata:
        served = self.runtime.get(name, version)
        record = self.runtime.record(name)
        lead = (-1,) if served.max_batch_size > 0 else ()
        return ModelMetadata(
            name=name,
            versions=tuple(sorted(record.versions)),
            platform=served.config.platform or served.config.backend,
            inputs=tuple(
                TensorMetadata(r.name, r.datatype, (*lead, *r.dims)) for r in served.inputs.values()
            ),
            outputs=tuple(
                TensorMetadata(r.name, r.datatype, (*lead, *r.dims))
                for r in served.outputs.values()
            ),
        )

    def model_config(self, name: str, version: str = "") -> mc.ModelConfig:
        config: mc.ModelConfig = self.runtime.get(name, version).config
        return config

    # ---- statistics --------------------------------------------------------------------------

    def statistics(self, name: str = "", version: str = "") -> list[ModelStatistics]:
        """One model version's, a model's ready versions', or every ready version's counters."""
        if name:
            # tritonserver's checks and words (INVALID_ARG): a model without a READY version,
            # then a version that is not one of its READY ones
            record = self.runtime.registry.find(name)
            served_versions = record.versions if record is not None else {}
            if not served_versions:
                raise InvalidInput(f"requested model '{name}' is not available")
            chosen: list[ServedVersion] = [served_versions[v] for v in sorted(served_versions)]
            if version:
                digits = version.isascii() and version.isdigit()
                if not digits:
                    self.runtime.get(name, version)  # the version string's own refusal
                if not digits or int(version) not in served_versions:
                    raise InvalidInput(
                        f"requested model version is not available for model '{name}'"
                    )
                chosen = [served_versions[int(version)]]
        else:  # by name, then version, as tritonserver lists them (its models' ordered map)
            chosen = sorted(self.runtime.ready_versions(), key=lambda s: (s.name, s.version))
        return [model_statistics(served) for served in chosen]

    # ---- trace -----------------------------------------------------------------------------

    def trace_settings(
        self, model: str = "", changes: dict[str, Any] | None = None
    ) -> TraceSettings:
        """Read or update trace settings (global, or one model's overrides)."""
        if model and self.runtime.registry.find(model) is None:
            raise InvalidInput(f"Request for unknown model : {model}")  # tritonserver's words
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
        self._check_client_shm()
        if "\0" in key:  # the file system would refuse it with ValueError
            raise InvalidInput(
                f"shared memory region '{name}': key {key!r} contains a NUL character, which "
                "no shared memory object's name can hold"
            )
        self.shared_memory.register(name, key, offset, byte_size)

    def unregister_system_shared_memory(self, name: str = "") -> None:
        """Forget one system region ('': all of them)."""
        self._check_client_shm()
        self.shared_memory.unregister(name)

    def _check_client_shm(self) -> None:
        if not self.allow_client_shm:
            raise ClientShmDisabled()

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
        self._check_client_shm()
        await asyncio.to_thread(
            self.shared_memory.register_cuda, name, raw_handle, device_id, byte_size
        )

    def unregister_cuda_shared_memory(self, name: str = "") -> None:
        """Close one CUDA region ('': all of them)."""
        self._check_client_shm()
        self.shared_memory.unregister_cuda(name)

    def cuda_shared_memory_status(self, name: str = "") -> list[CudaSharedMemoryRegion]:
        """The registered CUDA regions by name ('': all; an unknown name: NOT_FOUND)."""
        return [
            CudaSharedMemoryRegion(r["name"], r["device_id"], r["byte_size"])
            for r in self.shared_memory.cuda_status(name)
        ]

    # ---- repository --------------------------------------------------------------------------

    def repository_index(self, ready_only: bool = False) -> list[IndexRow]:
        """Triton's repository index: a row per model version (per model when none loaded).
        As Triton's, it lists the model folders of the repositories: a model loaded only from
        a load request's file overrides (no folder of its own) is not listed, nor one whose
        folder is gone; versions still to be fetched from a remote source are."""
        records = list(self.runtime.registry.records())
        pending = self.runtime.pending()
        try:
            on_disk: Iterable[str] = self.runtime.model_names()
        except ApplianceError:  # the repository cannot be read: list what is loaded
            on_disk = ()
        else:
            listed = set(on_disk) | {model for model, _ in pending}
            records = [record for record in records if record.name in listed]
        # models on disk that were never loaded are listed too, as in Triton
        rows = index_rows(records, pending, on_disk, ready_only)
        if not self.runtime.namespacing:
            return rows
        # Each copy of a name that more than one repository holds is listed under the name,
        # as tritonserver lists them (the index has no namespace field).
        return sorted(
            (dataclasses.replace(row, name=plain_name(row.name)) for row in rows),
            key=lambda row: (row.name, -1 if row.version is None else row.version),
        )

    async def load_model(self, name: str, parameters: dict[str, Any]) -> None:
        """Load (or reload) a model; fails with the reason when no version came into service
        or a version of it failed (as tritonserver answers 400), even though the runtime keeps
        serving what it served before. `pin_version` / `unpin` pin or unpin it instead."""
        if "pin_version" in parameters or "unpin" in parameters:
            check_model_name(name)
            await self.runtime.pin(name, pin_parameters(name, parameters))
            return
        self.runtime.require_explicit(self.control_mode)
        check_model_name(name)
        # --model-namespacing: a load by a name that more than one repository holds loads
        # each copy, as tritonserver does.
        for key in self.runtime.copies_on_disk(name) or [name]:
            await self._load_one(key, parameters)

    async def _load_one(self, name: str, parameters: dict[str, Any]) -> None:
        override = None
        config_json = parameters.get("config")
        if config_json:
            override = mc.ModelConfig()
            try:
                parse_lenient(str(config_json), override)
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
                raise ConfigError(  # tritonserver's prefix, then the reason (its log's)
                    f"failed to load '{name}', failed to poll from model repository: file "
                    "overrides need the 'config' parameter too"
                )
            source = await write_overrides(name, files)
        before = self.runtime.registry.find(name)
        served_before = dict(before.versions) if before else {}
        failed_before = dict(before.failed) if before else {}
        try:
            try:
                # As in Triton, a load request tries again the versions that failed to load.
                await self.runtime.load(name, override, source, retry_failed=True)
            except NoVersionAvailable as exc:  # tritonserver's prefix and its closing newline
                raise ConfigError(f"load failed for model '{exc.model}': {exc.message}\n") from exc
            check_loaded(self.runtime.record(name), served_before, failed_before)
        except BaseException:
            if source is not None:
                await self._discard_override(name, source)
            raise

    async def _discard_override(self, name: str, source: Path) -> None:
        """Remove a refused load's override folder unless the runtime serves from it."""
        record = self.runtime.registry.find(name)
        if record is None or record.owned_dir != source.parent:
            await asyncio.to_thread(shutil.rmtree, source.parent, True)

    async def unload_model(self, name: str, unload_dependents: bool = False) -> None:
        self.runtime.require_explicit(self.control_mode)
        copies = self.runtime.registry.copies(name)
        if copies and self.runtime.registry.find_key(name) is None:
            for key in copies:  # --model-namespacing: each copy of a shared name, as Triton
                await self.unload_model(key, unload_dependents)
            return
        if self.runtime.registry.find(name) is None:
            return  # Triton answers an unload of a model it never loaded with success
        if unload_dependents:
            await self.runtime.unload_with_dependents(name)
        else:
            await self.runtime.unload(name)
            await self.runtime.unload_callers(name)
