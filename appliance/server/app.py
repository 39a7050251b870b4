"""Appliance: builds the parts, owns their start / stop order and the one shutdown deadline."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc

from appliance import __version__
from appliance.common.access import GRPC_HEADER_PREFIX, Restriction, Restrictions
from appliance.common.errors import ApplianceError
from appliance.common.header_forward import HeaderForward
from appliance.common.settings import GrpcConnectionSettings, ServerSettings
from appliance.frontends.grpc.server import InferenceServicer, pool_threads
from appliance.frontends.http.origins import RequestOrigins
from appliance.frontends.http.server import HttpFrontend
from appliance.frontends.metrics import metrics_app
from appliance.ops import buildinfo
from appliance.ops.gpu import GpuSource, find_gpu_source
from appliance.ops.logs import LogSettings
from appliance.ops.memory import HeapTrimmer
from appliance.ops.notify import (
    Notifier,
    Supervisor,
    bootloader_pid,
    status_text,
    watchdog_interval_s,
)
from appliance.ops.trace import Tracer
from appliance.repository.ledger import ModelLedger
from appliance.repository.manifest import ManifestError, ManifestPolicy, load_public_key
from appliance.repository.model_signature import parse_policy
from appliance.repository.poller import RepositoryPoller
from appliance.repository.rollout import DeviceIdentity, RolloutError, device_id_from
from appliance.repository.sources import RemoteSources
from appliance.runtime.models import ModelRuntime
from appliance.runtime.registry import READY
from appliance.runtime.rollout_view import serving_view
from appliance.runtime.settings import RuntimeSettings
from appliance.server.listeners import (
    ConfigurationError,
    Listener,
    StartupError,
    serve_grpc,
    serve_http,
)
from appliance.server.preflight import Prepared, preflight, prepare_listeners
from appliance.server.shutdown import Deadline, kill_model_processes, shutdown_summary
from appliance.services.cache import ResponseCache
from appliance.services.control import ControlService, ServerState, shown_url
from appliance.services.inference import InferenceService
from appliance.services.metrics import build_registry
from appliance.services.results import IndexRow
from appliance.services.rows import index_rows
from appliance.services.shared_memory import SharedMemoryRegistry, region_cap
from appliance.services.status import StatusService

__all__ = [
    "Appliance",
    "ConfigurationError",
    "StartupError",
    "ready_summary",
    "serve_forever",
    "start_line",
]

log = logging.getLogger(__name__)


def _tuf_root(path: Path | None) -> bytes | None:
    """--model-repository-tuf-root's bytes, checked to be signed TUF root metadata."""
    if path is None:
        return None
    from appliance.repository.tuf_source import TufError, check_root

    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigurationError(
            f"--model-repository-tuf-root: cannot read '{path}': {exc.strerror}"
        ) from exc
    try:
        check_root(data, str(path))
    except TufError as exc:
        raise ConfigurationError(f"--model-repository-tuf-root: {exc}") from exc
    return data


class Appliance:
    """The whole server: the model runtime, the inference service, HTTP and gRPC listeners."""

    def __init__(
        self,
        settings: ServerSettings,
        notifier: Notifier | None = None,
        logs: LogSettings | None = None,
    ) -> None:
        self.settings = settings
        state_dir = settings.model_store_dir or Path("model-store")
        # Before anything is built or loaded: a wrong setting fails in a fraction of a second.
        self.prepared: Prepared = preflight(settings, state_dir, bool(settings.remote_repositories))
        self.state = ServerState()
        self.notifier = notifier or Notifier.from_env()
        self.supervisor = Supervisor(
            self.notifier,
            watchdog_interval_s(os.environ, os.getpid(), bootloader_pid()),
            self._health_problems,
            self.status,
        )
        try:
            public_key = (
                load_public_key(settings.manifest_public_key)
                if settings.manifest_public_key
                else None
            )
        except ManifestError as exc:
            raise ConfigurationError(str(exc)) from exc
        try:
            model_signature = parse_policy(
                settings.model_signature, settings.require_model_signature
            )
        except ValueError as exc:
            raise ConfigurationError(str(exc)) from exc
        manifest = ManifestPolicy(settings.require_manifest, public_key, model_signature)
        tuf_root = _tuf_root(settings.model_repository_tuf_root)
        # What failed, the last good versions and pins: kept across restarts.
        ledger = ModelLedger(state_dir)
        self.remote = RemoteSources(
            settings.remote_repositories,
            state_dir,
            settings.model_store_reserve_bytes,
            manifest,
            settings.download_rate_bytes_s,
            ledger,
            settings.repository_timeout_secs,
            tuf_root,
        )
        self.runtime = ModelRuntime(
            RuntimeSettings.from_server(
                settings, settings.model_repositories + self.remote.roots, manifest
            ),
            ledger,
        )
        if self.remote.sources:
            self._follow_rollouts()
        self.cache = (
            ResponseCache(settings.response_cache_bytes) if settings.response_cache_bytes else None
        )
        self.tracer = Tracer(
            settings.trace_file,
            settings.trace_level,
            settings.trace_rate,
            settings.trace_count,
            settings.trace_log_frequency,
        )
        self.inference = InferenceService(
            self.runtime,
            self.cache,
            self.tracer,
            settings.request_limits,
            settings.max_waiting_responses,
        )
        self.control = ControlService(
            self.runtime,
            self.state,
            settings.model_control_mode,
            settings.strict_readiness,
            self.tracer,
            logs,
            server_id=settings.server_id,
            allow_client_shm=settings.allow_client_shm,
            shared_memory=SharedMemoryRegistry(max_regions=_shm_region_cap(settings)),
            sources=self.remote.sources,
        )
        # The status page's data (GET /status.json); its sampler runs while HTTP serves.
        self.status_service = StatusService(
            self.control,
            store_path=state_dir,
            local_repositories=settings.model_repositories,
            sources=self.remote.sources,
            poller=lambda: self.poller,
            poll_interval_s=(
                settings.repository_poll_secs if settings.model_control_mode == "poll" else None
            ),
            gpu=self._gpu_source if settings.allow_gpu_metrics else None,
        )
        self._gpu: asyncio.Future[GpuSource | None] | None = None
        self.http_port: int | None = None
        self.grpc_port: int | None = None
        self.metrics_port: int | None = None
        self.poller: RepositoryPoller | None = None
        self._listeners: list[Listener] = []
        self._deadline: Deadline | None = None

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Appliance]:
        """Start everything; on exit (or a failed start) shut down under one deadline."""
        async with contextlib.AsyncExitStack() as stack:
            # First in, last out: the watchdog is fed while models load and while they drain.
            await stack.enter_async_context(self.supervisor.running())
            stack.push_async_callback(asyncio.to_thread, self.tracer.close)
            # Request bodies and messages, the tensors decoded from them and the responses are
            # the largest transient allocations, over HTTP as over gRPC: without a trim, a
            # burst leaves its memory with glibc (appliance/ops/memory.py). Stops after the
            # listeners (last in, first out).
            trimmer = HeapTrimmer()
            trimmer.start()
            stack.push_async_callback(trimmer.stop)
            if self.settings.allow_http:  # the status page's sampler
                await stack.enter_async_context(self.status_service.running())
            await stack.enter_async_context(self.remote.opened())
            # Listeners and models stop together, under one deadline (after the poller).
            stack.push_async_callback(self._shutdown)
            log.info("backends available: %s", buildinfo.backends_line())
            # Offline first: what the local folders and the model store hold serves before
            # the network is asked anything; remote repositories sync once the listeners
            # are open, and what they bring switches in as it arrives.
            await self._load_models()
            if self.settings.allow_grpc:
                self._listeners.append(await self._grpc())
            if self.settings.allow_http:
                self._listeners.append(await self._http())
            syncing = self._syncing()
            if syncing is not None:
                await stack.enter_async_context(syncing.running())
                await self._first_sync(syncing)
            if self.settings.allow_metrics:
                self._listeners.append(await self._metrics())
            self.state.loading_done = True
            rows = index_rows(self.runtime.registry.records(), self.runtime.pending())
            log.info("server is ready: %s", ready_summary(rows))
            self.supervisor.ready()
            yield self

    def _follow_rollouts(self) -> None:
        """Fleet rollouts from the remote repositories: this device's identity, its reports,
        and the runtime's side (the rollout's probation thresholds, probation's verdicts)."""
        settings = self.settings
        try:
            device_id = settings.device_id or device_id_from(_machine_id(), socket.gethostname())
        except RolloutError as exc:
            raise ConfigurationError(f"{exc}; give the device an id with --device-id") from exc
        identity = DeviceIdentity(device_id, dict(settings.device_labels))
        self.remote.enable_fleet(
            identity,
            settings.fleet_report_interval_secs,
            report_always=settings.device_id is not None,
            serving=functools.partial(serving_view, self.runtime),
            flag_probation=settings.rollback_error_rate > 0 or settings.rollback_latency_ratio > 0,
            shadow_view=self.runtime.shadow_numbers,
        )
        self.runtime.probation_rule = self.remote.probation_rule
        self.runtime.shadow_rule = self.remote.shadow_rule
        self.runtime.on_verdict = self.remote.verdict

    async def add_listener(self, kind: str, settings: ServerSettings) -> Listener:
        """Open one more listener ("http", "grpc" or "metrics") on the running server, from
        `settings`' fields for it (the embedding API's front ends, appliance/embed/): the same
        services, shared memory registry, tracer and restrictions as the command line's. It
        stops with the rest at shutdown, or alone with `stop_listener`."""
        opened = {"http": self._http, "grpc": self._grpc, "metrics": self._metrics}[kind]
        listener = await opened(settings)
        self._listeners.append(listener)
        return listener

    async def stop_listener(self, listener: Listener, deadline: Deadline) -> None:
        """Stop one listener `add_listener` opened (draining it under `deadline`)."""
        if listener in self._listeners:
            self._listeners.remove(listener)
            await listener.stop(deadline)

    def begin_shutdown(self, deadline: Deadline) -> None:
        """Report not-ready and refuse new requests now; `running()`'s exit drains under
        `deadline`."""
        self._deadline = deadline
        self._not_ready()

    def status(self) -> str:
        """The one-line summary systemd shows (STATUS=)."""
        rows = index_rows(self.runtime.registry.records(), self.runtime.pending())
        ready = {row.name for row in rows if row.state == READY}
        served = sum(v.stats.success.count for v in self.runtime.ready_versions())
        listeners = [("HTTP", self.http_port), ("gRPC", self.grpc_port)]
        return status_text(len({row.name for row in rows}), len(ready), served, listeners)

    def _health_problems(self, stuck_ns: int) -> list[str]:
        """Versions whose instances cannot make progress (the watchdog's check)."""
        now = time.monotonic_ns()
        problems = (v.scheduler.health(now, stuck_ns) for v in self.runtime.ready_versions())
        return [p for p in problems if p]

    def _not_ready(self) -> None:
        self.state.shutting_down = True
        self.inference.accepting = False

    def _start_names(self) -> list[str] | None:
        """The models start-up loads: every one, or in explicit mode those --load-model names."""
        if self.settings.model_control_mode != "explicit":
            return None
        return list(self.settings.load_models)

    def _syncing(self) -> RepositoryPoller | None:
        """Poll mode: the poller, its first poll at once. Else, with remote repositories: the
        start-up catch-up, until every remote repository has been synced once."""
        interval_s = self.settings.repository_poll_secs
        if self.settings.model_control_mode == "poll":
            self.poller = RepositoryPoller(self.runtime, interval_s, self.remote)
            return self.poller
        if not self.remote.sources:
            return None
        names = self._start_names()
        only = None if names is None or "*" in names else set(names)
        return RepositoryPoller(self.runtime, interval_s, self.remote, until_synced=True, only=only)

    async def _first_sync(self, syncing: RepositoryPoller) -> None:
        """With --repository-sync-wait-secs: readiness waits for the first successful sync
        of every remote repository and the loads it brought, at most that long."""
        wait_s = self.settings.repository_sync_wait_secs
        if wait_s <= 0 or not self.remote.sources:
            return
        started = time.monotonic()
        try:
            await asyncio.wait_for(syncing.synced.wait(), wait_s)
        except asyncio.TimeoutError:
            log.warning(
                "the remote repositories were not synced within %g s "
                "(--repository-sync-wait-secs); ready with what the model store holds, the "
                "sync goes on",
                wait_s,
            )
            return
        log.info("remote repositories synced in %.1f s", time.monotonic() - started)

    async def _load_models(self) -> None:
        """Load what the local folders and the model store hold now (no network)."""
        settings = self.settings
        self.runtime.host = self.inference.blocking_host(asyncio.get_running_loop(), self.control)
        names = self._start_names()
        if self.remote.sources:
            self.runtime.pending = self.remote.pending
        try:
            await self.runtime.load_all(names)
        except ApplianceError as exc:
            raise StartupError(exc.message) from exc
        if self.remote.sources and settings.model_control_mode == "explicit":
            self.runtime.fetch = self.remote.fetch
        if self.cache is None:
            for served in self.runtime.ready_versions():
                if served.cache_enabled:
                    log.warning(
                        "model '%s' enables response_cache but the server has no cache; "
                        "start it with --cache-config local,size=BYTES",
                        served.name,
                    )
        if settings.exit_on_error and not self.runtime.all_ready():
            rows = index_rows(self.runtime.registry.records(), self.runtime.pending())
            failed = "; ".join(
                f"'{row.name}'{f' version {row.version}' if row.version else ''}: {row.reason}"
                for row in rows
                if row.state != READY
            )
            raise StartupError(f"failed to load all models (--exit-on-error): {failed}")

    async def _shutdown(self) -> None:
        """Stop listening, drain HTTP, gRPC and every model version at once under the one
        deadline, cancel what is left, and log it."""
        deadline = self._deadline or Deadline.starting(self.settings.exit_timeout_secs)
        self._not_ready()
        log.info(
            "shutting down: not ready, refusing new requests, draining in-flight ones "
            "(deadline %.1f s from now)",
            deadline.remaining_s(time.monotonic()),
        )
        parts = [listener.stop(deadline) for listener in self._listeners]
        outcomes = await asyncio.gather(*parts, self._stop_models(deadline), return_exceptions=True)
        cancelled: list[str] = []
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                log.error("shutdown: stopping a part failed", exc_info=outcome)
            else:
                cancelled += outcome
        # Model processes are the runtime's to stop; one still alive here would outlive us.
        killed = await asyncio.to_thread(kill_model_processes)
        level, line = shutdown_summary(deadline, time.monotonic(), cancelled, killed)
        log.log(level, "%s", line)

    async def _stop_models(self, deadline: Deadline) -> list[str]:
        return await self.runtime.stop(deadline.remaining_s(time.monotonic()))

    def _prepared_for(self, settings: ServerSettings) -> Prepared:
        """The checked TLS contexts and patterns of a listener: the start's own for the
        server's settings, made anew for a listener an embedding application adds."""
        return self.prepared if settings is self.settings else prepare_listeners(settings)

    async def _http(self, settings: ServerSettings | None = None) -> Listener:
        settings = settings or self.settings
        prepared = self._prepared_for(settings)
        frontend = HttpFrontend(
            self.inference,
            self.control,
            settings.max_request_bytes,
            _restrictions(settings.http_restricted),
            shared_memory=self.control.shared_memory,
            limits=settings.request_limits,
            status=self.status_service,
            header_forward=prepared.http_forward,
            origins=RequestOrigins(
                settings.http_allowed_hosts,
                settings.http_address,
                bool(settings.tls.http_cert),
            ),
        )
        address, port = settings.http_address, settings.http_port
        listener = await serve_http(
            frontend.build(),
            address,
            port,
            "HTTP",
            settings.exit_timeout_secs,
            settings.http_unix_socket,
            settings.unix_socket_mode,
            prepared.http_ssl,
            settings.http_connections,
            infer_route=frontend,
            reuse_port=settings.reuse_http_port,
        )
        self.http_port = listener.port
        _log_forwarding("HTTP headers", frontend.header_forward)
        if listener.port is not None:
            log.info("Started HTTPService at %s:%s", address, listener.port)
        if settings.http_unix_socket:
            log.info("Started HTTPService at unix:%s", settings.http_unix_socket)
        return listener

    async def _gpu_source(self) -> GpuSource | None:
        """The GPU readings the metrics and the status page share: looked for once (NVML
        initialises the driver, seconds on some machines: off the loop), and said once."""
        if self._gpu is None:
            interval_s = self.settings.metrics_interval_ms / 1000
            self._gpu = asyncio.ensure_future(asyncio.to_thread(find_gpu_source, interval_s))
        return await asyncio.shield(self._gpu)

    async def _metrics(self, settings: ServerSettings | None = None) -> Listener:
        settings = settings or self.settings
        gpu = await self._gpu_source() if settings.allow_gpu_metrics else None
        registry = build_registry(
            self.runtime.ready_versions,
            settings.allow_cpu_metrics,
            self.cache,
            self.runtime,
            self.poller,
            self.remote,
            gpu,
        )
        address, port = settings.metrics_address, settings.metrics_port
        app = metrics_app(registry, gpu.read if gpu is not None else None)
        listener = await serve_http(app, address, port, "metrics", settings.exit_timeout_secs)
        self.metrics_port = listener.port
        log.info("Started Metrics Service at %s:%s", address, listener.port)
        return listener

    async def _grpc(self, settings: ServerSettings | None = None) -> Listener:
        settings = settings or self.settings
        prepared = self._prepared_for(settings)
        size = settings.grpc_max_message_bytes
        calls = settings.grpc_max_concurrent_rpcs
        # The synchronous server: ModelInfer runs on its handler thread (frontends/grpc/server.py).
        pool = ThreadPoolExecutor(max_workers=pool_threads(calls), thread_name_prefix="grpc")
        server = grpc.server(
            pool,
            options=[
                ("grpc.max_send_message_length", size),
                ("grpc.max_receive_message_length", size),
                # Off unless --reuse-grpc-port: a second server on the port is an error.
                ("grpc.so_reuseport", int(settings.reuse_grpc_port)),
                # One connection cannot open unbounded concurrent calls (each holds a handler
                # thread while it runs; past the pool's threads, calls wait for one).
                ("grpc.max_concurrent_streams", 256),
                *_connection_options(settings.grpc_connections),
            ],
        )
        servicer = InferenceServicer(
            self.inference,
            self.control,
            _restrictions(settings.grpc_restricted, GRPC_HEADER_PREFIX),
            shared_memory=self.control.shared_memory,
            limits=settings.request_limits,
            max_concurrent_rpcs=calls,
            header_forward=prepared.grpc_forward,
            compression_level=settings.grpc_connections.infer_compression_level,
        )
        servicer.add_to_server(server, asyncio.get_running_loop())
        _log_forwarding("gRPC metadata keys", servicer.header_forward)
        unix_path = settings.grpc_unix_socket
        listener, self.grpc_port = await serve_grpc(
            server,
            settings.grpc_address,
            settings.grpc_port,
            unix_path,
            settings.unix_socket_mode,
            prepared.grpc_credentials,
            pool,
        )
        if unix_path:
            log.info("Started GRPCInferenceService at unix:%s", unix_path)
        if self.grpc_port is not None:
            log.info("Started GRPCInferenceService at %s:%s", settings.grpc_address, self.grpc_port)
        return listener


def _connection_options(c: GrpcConnectionSettings) -> list[tuple[str, int]]:
    """tritonserver's keepalive and connection-age channel arguments, set as its gRPC server
    sets them (server repository, src/grpc/grpc_server.cc): the keepalive ones always (their
    defaults are gRPC core's own), the connection age and its grace only when not 0."""
    options = [
        ("grpc.keepalive_time_ms", c.keepalive_time_ms),
        ("grpc.keepalive_timeout_ms", c.keepalive_timeout_ms),
        # gRPC core (grpcio 1.85) closes a connection whose ping goes unanswered only after
        # its ping timeout, a minute by default, whatever the keepalive timeout: measured with
        # a frozen proxy and keepalive 1 s / 1 s, the dead connection went after 61 s, and
        # after 2 s with this. The keepalive timeout is then what tritonserver's flag says.
        ("grpc.http2.ping_timeout_ms", c.keepalive_timeout_ms),
        ("grpc.keepalive_permit_without_calls", int(c.keepalive_permit_without_calls)),
        ("grpc.http2.max_pings_without_data", c.http2_max_pings_without_data),
        (
            "grpc.http2.min_ping_interval_without_data_ms",
            c.http2_min_recv_ping_interval_without_data_ms,
        ),
        ("grpc.http2.max_ping_strikes", c.http2_max_ping_strikes),
    ]
    if c.max_connection_age_ms:
        options.append(("grpc.max_connection_age_ms", c.max_connection_age_ms))
    if c.max_connection_age_grace_ms:
        options.append(("grpc.max_connection_age_grace_ms", c.max_connection_age_grace_ms))
    return options


def _machine_id() -> bytes | None:
    """systemd's machine id (a fleet device's default id), if the system has one."""
    try:
        return Path("/etc/machine-id").read_bytes()
    except OSError:
        return None


def _restrictions(groups: tuple[tuple[str, str, str], ...], prefix: str = "") -> Restrictions:
    return Restrictions({api: Restriction(key, value) for api, key, value in groups}, prefix)


async def serve_forever(
    settings: ServerSettings,
    stop: Callable[[], Awaitable[Deadline]],
    notifier: Notifier | None = None,
    logs: LogSettings | None = None,
) -> None:
    """Serve until `stop()` returns the shutdown deadline, then shut down under it. A stop
    during start-up does not wait for every model to load: the start is cancelled where it
    is (the loads in progress with it) and what started shuts down under the deadline."""
    appliance = Appliance(settings, notifier, logs)
    stopping = asyncio.ensure_future(stop())

    async def serve() -> None:
        async with appliance.running():
            appliance.begin_shutdown(await asyncio.shield(stopping))

    serving = asyncio.ensure_future(serve())
    try:
        await asyncio.wait({serving, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if not serving.done() and not appliance.state.loading_done:
            appliance.begin_shutdown(stopping.result())
            log.info("stopping during start-up: the model loads in progress are cancelled")
            serving.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await serving
        if serving.cancelled() and not stopping.done():
            raise asyncio.CancelledError  # this call itself was cancelled
    finally:
        stopping.cancel()


def start_line(settings: ServerSettings) -> str:
    """The log's first line: what runs (version, commit) and where (listeners, repositories,
    control mode, state directory), so that a log read later says what it came from."""
    listeners = []
    for name, on, address, port in (
        ("HTTP", settings.allow_http, settings.http_address, settings.http_port),
        ("gRPC", settings.allow_grpc, settings.grpc_address, settings.grpc_port),
        ("metrics", settings.allow_metrics, settings.metrics_address, settings.metrics_port),
    ):
        if on and port >= 0:
            listeners.append(f"{name} {address}:{port}")
    for name, on, path in (
        ("HTTP", settings.allow_http, settings.http_unix_socket),
        ("gRPC", settings.allow_grpc, settings.grpc_unix_socket),
    ):
        if on and path:
            listeners.append(f"{name} unix:{path}")
    repositories = [str(p) for p in settings.model_repositories]
    repositories += [shown_url(url) for url in settings.remote_repositories]
    state_dir = settings.model_store_dir or Path("model-store")
    tls = " (TLS)" if settings.tls.http_cert or settings.tls.grpc else ""
    return (
        f"edge-appliance {__version__} (commit {buildinfo.commit()}) starting: "
        f"{', '.join(listeners) or 'no listener'}{tls}; "
        f"repositories {', '.join(repositories) or 'none'}; "
        f"model control mode {settings.model_control_mode}; state dir {state_dir}"
    )


def ready_summary(rows: list[IndexRow]) -> str:
    """'6 of 8 models ready, 2 not ready: a (reason), b (reason)': each model counted once, ready
    when a version of it serves; a model that does not, with its first reason."""
    names: dict[str, str | None] = {}  # name -> None when it serves, else why not
    for row in rows:
        if row.state == READY:
            names[row.name] = None
        elif row.name not in names:
            names[row.name] = row.reason or row.state or "not loaded"
    ready = sum(1 for why in names.values() if why is None)
    text = f"{ready} of {len(names)} model{'' if len(names) == 1 else 's'} ready"
    failed = [f"{name} ({why})" for name, why in sorted(names.items()) if why is not None]
    if failed:
        text += f", {len(failed)} not ready: {', '.join(failed)}"
    return text


def _log_forwarding(what: str, forward: HeaderForward | None) -> None:
    """Say once that a protocol forwards headers to the models (they see them as parameters)."""
    if forward is not None:
        log.info("Forwarding %s matching '%s' to models as parameters", what, forward.pattern)


def _shm_region_cap(settings: ServerSettings) -> int:
    """--max-shm-regions, lowered to half the open-file limit (cli.py raised it to the hard
    limit first) so that regions can never take the descriptors connections need."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    limit = soft if soft != resource.RLIM_INFINITY else 1 << 20
    cap = region_cap(settings.max_shm_regions, limit)
    if settings.allow_client_shm and cap < settings.max_shm_regions:
        log.warning(
            "at most %d shared memory regions (--max-shm-regions %d is more than half the "
            "open-file limit of %d; raise LimitNOFILE)",
            cap,
            settings.max_shm_regions,
            limit,
        )
    return cap
