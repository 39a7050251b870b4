"""Appliance: builds the parts and owns their start / stop order."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
import stat
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
from aiohttp import web

from appliance import buildinfo
from appliance.access import GRPC_HEADER_PREFIX, Restriction, Restrictions
from appliance.cache import ResponseCache
from appliance.errors import ApplianceError
from appliance.frontends.grpc.server import InferenceServicer
from appliance.frontends.http.connections import GuardedAppRunner
from appliance.frontends.http.server import HttpFrontend
from appliance.gpu_metrics import find_gpu_source
from appliance.logs import LogSettings
from appliance.metrics import build_registry, metrics_app
from appliance.notify import (
    Notifier,
    Supervisor,
    bootloader_pid,
    status_text,
    watchdog_interval_s,
)
from appliance.protocol import service_pb2_grpc
from appliance.repository.manifest import ManifestError, ManifestPolicy, load_public_key
from appliance.repository.poller import RepositoryPoller
from appliance.repository.sources import RemoteSources
from appliance.runtime.models import ModelRuntime, RuntimeSettings
from appliance.services.control import ControlService, ServerState
from appliance.services.inference import InferenceService
from appliance.settings import HttpConnectionLimits, ServerSettings, TlsSettings
from appliance.trace import Tracer

log = logging.getLogger(__name__)


class StartupError(Exception):
    """The server cannot start (a port in use, a bad repository with --exit-on-error)."""


class Appliance:
    """The whole server: model manager, core, HTTP and gRPC listeners."""

    def __init__(
        self,
        settings: ServerSettings,
        notifier: Notifier | None = None,
        logs: LogSettings | None = None,
    ) -> None:
        self.settings = settings
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
            raise StartupError(str(exc)) from exc
        manifest = ManifestPolicy(settings.require_manifest, public_key)
        self.remote = RemoteSources(
            settings.remote_repositories,
            settings.model_store_dir or Path("model-store"),
            settings.model_store_reserve_bytes,
            manifest,
            settings.download_rate_bytes_s,
        )
        self.manager = ModelRuntime(
            RuntimeSettings(
                repositories=settings.model_repositories + self.remote.roots,
                strict_model_config=settings.strict_model_config,
                drain_timeout_s=settings.exit_timeout_secs,
                latency_histograms=settings.latency_histograms,
                manifest=manifest,
                rollback_error_rate=settings.rollback_error_rate,
                rollback_window=settings.rollback_window,
                scheduling=settings.scheduling,
                cache_dir=settings.model_store_dir,
            )
        )
        self.cache = (
            ResponseCache(settings.response_cache_bytes) if settings.response_cache_bytes else None
        )
        self.tracer = Tracer(
            settings.trace_file, settings.trace_level, settings.trace_rate, settings.trace_count
        )
        self.core = InferenceService(self.manager, self.cache, self.tracer, settings.request_limits)
        self.control = ControlService(
            self.manager,
            self.state,
            settings.model_control_mode,
            settings.strict_readiness,
            self.tracer,
            logs,
        )
        self.http_port: int | None = None
        self.grpc_port: int | None = None
        self.metrics_port: int | None = None
        self.poller: RepositoryPoller | None = None

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Appliance]:
        """Start everything; on exit (or a failed start) stop in reverse order."""
        async with contextlib.AsyncExitStack() as stack:
            # First in, last out: the watchdog is fed while models load and while they drain.
            await stack.enter_async_context(self.supervisor.running())
            stack.push_async_callback(asyncio.to_thread, self.tracer.close)
            stack.push_async_callback(self._stop_models)
            await stack.enter_async_context(self.remote.opened())
            log.info("backends available: %s", buildinfo.backends_line())
            await self._load_models()
            if self.settings.allow_grpc:
                await stack.enter_async_context(self._grpc())
            if self.settings.allow_http:
                await stack.enter_async_context(self._http())
            if self.settings.model_control_mode == "poll":
                self.poller = RepositoryPoller(
                    self.manager, self.settings.repository_poll_secs, self.remote
                )
                await stack.enter_async_context(self.poller.running())
            if self.settings.allow_metrics:
                await stack.enter_async_context(self._metrics())
            self.state.loading_done = True
            stack.callback(self._not_ready)
            log.info("server is ready")
            self.supervisor.ready()
            yield self

    def status(self) -> str:
        """The one-line summary systemd shows (STATUS=)."""
        entries = self.manager.index()
        ready = {e["name"] for e in entries if e["state"] == "READY"}
        served = sum(v.stats.success.count for v in self.manager.ready_versions())
        listeners = [("HTTP", self.http_port), ("gRPC", self.grpc_port)]
        return status_text(len({e["name"] for e in entries}), len(ready), served, listeners)

    def _health_problems(self, stuck_ns: int) -> list[str]:
        """Versions whose instances cannot make progress (the watchdog's check)."""
        now = time.monotonic_ns()
        problems = (v.scheduler.health(now, stuck_ns) for v in self.manager.ready_versions())
        return [p for p in problems if p]

    def _not_ready(self) -> None:
        self.state.shutting_down = True
        self.core.accepting = False

    async def _load_models(self) -> None:
        settings = self.settings
        self.manager.host = self.core.blocking_host(asyncio.get_running_loop())
        if settings.model_control_mode == "explicit":
            names = list(settings.load_models) if settings.load_models else []
        else:
            names = None
        if self.remote.sources:
            # Offline first: an unreachable bucket leaves the store as it is; serve from it.
            await self.remote.sync(None if names is None or "*" in names else set(names))
            self.manager.pending = self.remote.pending
        try:
            await self.manager.load_all(names)
        except ApplianceError as exc:
            raise StartupError(exc.message) from exc
        if self.remote.sources and settings.model_control_mode == "explicit":
            self.manager.fetch = lambda name: self.remote.sync({name})
        if self.cache is None:
            for served in self.manager.ready_versions():
                if served.cache_enabled:
                    log.warning(
                        "model '%s' enables response_cache but the server has no cache; "
                        "start it with --cache-config local,size=BYTES",
                        served.name,
                    )
        if settings.exit_on_error and not self.manager.all_ready():
            failed = [e for e in self.manager.index() if e["state"] != "READY"]
            raise StartupError(f"failed to load all models (--exit-on-error): {failed}")

    async def _stop_models(self) -> None:
        await self.manager.stop()

    @contextlib.asynccontextmanager
    async def _http(self) -> AsyncIterator[None]:
        frontend = HttpFrontend(
            self.core,
            self.control,
            self.settings.max_request_bytes,
            _restrictions(self.settings.http_restricted),
        )
        settings = self.settings
        address, port = settings.http_address, settings.http_port
        async with _listening(
            frontend.build(),
            address,
            port,
            "HTTP",
            settings.exit_timeout_secs,
            settings.http_unix_socket,
            settings.unix_socket_mode,
            _http_ssl_context(settings.tls),
            settings.http_connections,
        ) as bound:
            self.http_port = bound
            if bound is not None:
                log.info("Started HTTPService at %s:%s", address, bound)
            if settings.http_unix_socket:
                log.info("Started HTTPService at unix:%s", settings.http_unix_socket)
            yield

    @contextlib.asynccontextmanager
    async def _metrics(self) -> AsyncIterator[None]:
        settings = self.settings
        gpu = (
            # NVML initialises the driver: seconds on some machines, so off the loop.
            await asyncio.to_thread(find_gpu_source, settings.metrics_interval_ms / 1000)
            if settings.allow_gpu_metrics
            else None
        )
        registry = build_registry(
            self.manager.ready_versions,
            self.settings.allow_cpu_metrics,
            self.cache,
            self.manager,
            self.poller,
            self.remote,
            gpu,
        )
        address, port = self.settings.metrics_address, self.settings.metrics_port
        app = metrics_app(registry, gpu.read if gpu is not None else None)
        async with _listening(app, address, port, "metrics") as bound:
            assert bound is not None
            self.metrics_port = bound
            log.info("Started Metrics Service at %s:%s", address, bound)
            yield

    @contextlib.asynccontextmanager
    async def _grpc(self) -> AsyncIterator[None]:
        size = self.settings.grpc_max_message_bytes
        server = grpc.aio.server(
            options=[
                ("grpc.max_send_message_length", size),
                ("grpc.max_receive_message_length", size),
                ("grpc.so_reuseport", 0),
                # One connection cannot open unbounded concurrent calls (each holds a task).
                ("grpc.max_concurrent_streams", 256),
            ]
        )
        servicer = InferenceServicer(
            self.core,
            self.control,
            _restrictions(self.settings.grpc_restricted, GRPC_HEADER_PREFIX),
        ).guarded()
        service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)
        addresses = []
        if self.settings.grpc_port >= 0:
            addresses.append(f"{self.settings.grpc_address}:{self.settings.grpc_port}")
        unix_path = self.settings.grpc_unix_socket
        if unix_path:
            _clear_stale_socket(unix_path, "gRPC")
            addresses.append(f"unix:{unix_path}")
        credentials = _grpc_credentials(self.settings.tls)
        ports = []
        for address in addresses:
            try:
                if credentials is not None and not address.startswith("unix:"):
                    port = server.add_secure_port(address, credentials)
                else:
                    port = server.add_insecure_port(address)
            except RuntimeError as exc:
                raise StartupError(f"cannot listen for gRPC on {address}: {exc}") from exc
            if port == 0 and not address.startswith("unix:"):
                raise StartupError(f"cannot listen for gRPC on {address}: address in use?")
            ports.append(port)
        await server.start()
        if unix_path:
            os.chmod(unix_path, self.settings.unix_socket_mode)
            log.info("Started GRPCInferenceService at unix:%s", unix_path)
        if self.settings.grpc_port >= 0:
            self.grpc_port = ports[0]
            log.info("Started GRPCInferenceService at %s:%s", self.settings.grpc_address, ports[0])
        try:
            yield
        finally:
            await server.stop(grace=self.settings.exit_timeout_secs)
            if unix_path:
                with contextlib.suppress(OSError):
                    os.unlink(unix_path)


def _read(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError as exc:
        raise StartupError(f"cannot read {what} '{path}': {exc.strerror}") from exc


def _grpc_credentials(tls: TlsSettings) -> grpc.ServerCredentials | None:
    """TLS for the gRPC TCP listener (Unix sockets stay plain: the file mode guards them)."""
    if not tls.grpc:
        return None
    key = _read(tls.grpc_key, "--grpc-server-key")
    cert = _read(tls.grpc_cert, "--grpc-server-cert")
    root = _read(tls.grpc_root, "--grpc-root-cert") if tls.grpc_root else None
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=root, require_client_auth=tls.grpc_mutual
    )


def _http_ssl_context(tls: TlsSettings) -> ssl.SSLContext | None:
    if not tls.http_cert:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(tls.http_cert, tls.http_key)
        if tls.http_root:
            context.load_verify_locations(tls.http_root)
            context.verify_mode = ssl.CERT_REQUIRED
    except (OSError, ssl.SSLError) as exc:
        raise StartupError(f"cannot use the HTTP TLS certificate or key: {exc}") from exc
    return context


def _restrictions(groups: tuple[tuple[str, str, str], ...], prefix: str = "") -> Restrictions:
    return Restrictions({api: Restriction(key, value) for api, key, value in groups}, prefix)


def _clear_stale_socket(path: str, what: str) -> None:
    """Remove a socket left by an earlier run; refuse to replace anything else."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise StartupError(f"cannot listen for {what} on unix:{path}: it exists and is no socket")
    os.unlink(path)


@contextlib.asynccontextmanager
async def _listening(
    app: web.Application,
    address: str,
    port: int,
    what: str,
    shutdown_timeout: float = 5.0,
    unix_path: str = "",
    unix_mode: int = 0o660,
    ssl_context: ssl.SSLContext | None = None,
    limits: HttpConnectionLimits | None = None,
) -> AsyncIterator[int | None]:
    """Serve an aiohttp app on address:port (port -1: no TCP) and on a Unix socket if given.

    Yields the bound TCP port (port 0 picks one), or None without TCP.
    """
    runner = GuardedAppRunner(
        app,
        limits or HttpConnectionLimits(),
        handler_cancellation=True,
        access_log=None,
        shutdown_timeout=shutdown_timeout,
    )
    await runner.setup()
    listening_on_unix = False
    try:
        bound: int | None = None
        if port >= 0:
            site = web.TCPSite(runner, address, port, reuse_address=True, ssl_context=ssl_context)
            try:
                await site.start()
            except OSError as exc:
                raise StartupError(
                    f"cannot listen for {what} on {address}:{port}: {exc.strerror}"
                ) from exc
            server = site._server  # aiohttp keeps the asyncio Server here
            sockets = getattr(server, "sockets", None) or []
            bound = sockets[0].getsockname()[1] if sockets else port
        if unix_path:
            _clear_stale_socket(unix_path, what)
            try:
                await web.UnixSite(runner, unix_path).start()
            except OSError as exc:
                raise StartupError(
                    f"cannot listen for {what} on unix:{unix_path}: {exc.strerror}"
                ) from exc
            listening_on_unix = True
            os.chmod(unix_path, unix_mode)
        yield bound
    finally:
        await runner.cleanup()
        if listening_on_unix:  # ours: never a file that was there before
            with contextlib.suppress(OSError):
                os.unlink(unix_path)


async def serve_forever(
    settings: ServerSettings,
    stop: asyncio.Event,
    notifier: Notifier | None = None,
    logs: LogSettings | None = None,
) -> None:
    """Run until `stop` is set."""
    appliance = Appliance(settings, notifier, logs)
    async with appliance.running():
        await stop.wait()
        log.info("shutting down: refusing new requests, draining in-flight ones")
