"""The server's listeners: aiohttp apps and the gRPC server on TCP and Unix sockets, each
stopped under the one shutdown deadline (appliance/server/shutdown.py).

Only the frameworks' public APIs: aiohttp's `BaseRunner.addresses`, `BaseRunner.cleanup()`
(stop listening, close idle connections, wait for requests in flight, clean the app up) and
`web.Server.connections`; grpc's `server.stop(grace)`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
import stat
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

import grpc
from aiohttp import web

from appliance.common.settings import HttpConnectionLimits, TlsSettings
from appliance.frontends.http.connections import GuardedAppRunner, GuardedServer
from appliance.frontends.http.fastpath import InferRoute
from appliance.server.shutdown import FORCE_AFTER_S, Deadline
from appliance.server.tls import TlsFileError, certificates, key_pair

log = logging.getLogger(__name__)


class StartupError(Exception):
    """The server cannot start (a port in use, a bad repository with --exit-on-error)."""

    exit_code = 1  # systemd restarts it: the cause may go away by itself


class ConfigurationError(StartupError):
    """A setting that cannot work as given (a TLS file, a socket path, the state directory):
    retrying changes nothing, so the process exits 78 (EX_CONFIG), which the systemd unit does
    not restart (RestartPreventExitStatus=)."""

    exit_code = 78


class Listener(Protocol):
    what: str

    async def stop(self, deadline: Deadline) -> list[str]:
        """Stop accepting, let work in flight finish until the deadline, then cut it off;
        one line per kind of work cut off."""
        ...


class HttpListener:
    """An aiohttp app served on TCP and / or a Unix socket."""

    def __init__(self, what: str, runner: GuardedAppRunner) -> None:
        self.what = what
        self.port: int | None = None  # the bound TCP port
        self.unix_path = ""  # ours once listening: removed on stop
        self._runner = runner

    async def stop(self, deadline: Deadline) -> list[str]:
        """Stop listening and let requests in flight finish; at the deadline's cut-off (after
        the answers to requests cancelled at the deadline went out) close what is left."""
        server = self._runner.server
        cleanup = asyncio.ensure_future(self._runner.cleanup())
        lines = []
        try:
            done, _ = await asyncio.wait({cleanup}, timeout=deadline.until_cut_s(time.monotonic()))
            if not done and isinstance(server, GuardedServer):
                busy = server.busy_connections()
                for connection in busy:
                    connection.close_now()
                if busy:
                    lines.append(f"{self.what}: closed {len(busy)} connection(s) still busy")
            await cleanup  # never cancelled: see _runner_shutdown_timeout_s
        finally:
            if self.unix_path:
                with contextlib.suppress(OSError):
                    os.unlink(self.unix_path)
        return lines


def _runner_shutdown_timeout_s(exit_timeout_s: float) -> float:
    """aiohttp's own wait for requests in flight: never the one that ends them.

    `HttpListener.stop` closes busy connections at the deadline's cut-off and the backstop ends
    the process FORCE_AFTER_S past the deadline, both before this. Neither aiohttp's timeout
    nor a cancel may end its wait for a handler: when that wait is cancelled in the loop
    iteration in which the handler finishes, aiohttp 3.14 sets the result of the future it has
    just cancelled (`_handler_waiter`) and logs an InvalidStateError traceback (pinned by
    tests/unit/test_http_connections.py). asyncio.run cancelling every task after the old
    second-signal SystemExit did exactly that; now a second signal ends the process without
    unwinding, and nothing cancels `cleanup()`.
    """
    return exit_timeout_s + FORCE_AFTER_S + 5.0


async def serve_http(
    app: web.Application,
    address: str,
    port: int,
    what: str,
    exit_timeout_s: float,
    unix_path: str = "",
    unix_mode: int = 0o660,
    ssl_context: ssl.SSLContext | None = None,
    limits: HttpConnectionLimits | None = None,
    infer_route: InferRoute | None = None,
    reuse_port: bool = False,
) -> HttpListener:
    """Serve an aiohttp app on address:port (port -1: no TCP; 0 picks one) and on a Unix socket
    if given; with `infer_route`, its infer requests without aiohttp (frontends/http/fastpath.py);
    `reuse_port`: SO_REUSEPORT, beside other servers listening with it.
    """
    runner = GuardedAppRunner(
        app,
        limits or HttpConnectionLimits(),
        shutdown_timeout=_runner_shutdown_timeout_s(exit_timeout_s),
        infer_route=infer_route,
    )
    await runner.setup()
    listener = HttpListener(what, runner)
    try:
        if port >= 0:
            site = web.TCPSite(
                runner,
                address,
                port,
                reuse_address=True,
                reuse_port=reuse_port or None,
                ssl_context=ssl_context,
            )
            try:
                await site.start()
            except OSError as exc:
                raise StartupError(
                    f"cannot listen for {what} on {address}:{port}: {exc.strerror}"
                ) from exc
            # (host, port) for IPv4, (host, port, flowinfo, scope_id) for IPv6.
            listener.port = next(a[1] for a in runner.addresses if isinstance(a, tuple))
        if unix_path:
            clear_stale_socket(unix_path, what)
            try:
                await web.UnixSite(runner, unix_path).start()
            except OSError as exc:
                raise StartupError(
                    f"cannot listen for {what} on unix:{unix_path}: {exc.strerror}"
                ) from exc
            listener.unix_path = unix_path  # ours: never a file that was there before
            os.chmod(unix_path, unix_mode)
    except BaseException:
        await listener.stop(Deadline.starting(0.0))
        raise
    return listener


class GrpcListener:
    """A started synchronous gRPC server and its handler threads' pool."""

    what = "gRPC"

    def __init__(
        self, server: grpc.Server, pool: ThreadPoolExecutor | None = None, unix_path: str = ""
    ) -> None:
        self._server = server
        self._pool = pool
        self.unix_path = unix_path

    async def stop(self, deadline: Deadline) -> list[str]:
        """Refuse new calls at once; calls still running at the cut-off are cancelled (their
        work on the loop with them; a model running on a handler thread finishes, or is
        ended with its version at the deadline)."""
        grace = deadline.until_cut_s(time.monotonic())
        try:
            stopped = self._server.stop(grace=grace)
            # The event is set once the calls are done or cancelled: at most the grace.
            await asyncio.to_thread(stopped.wait, grace + FORCE_AFTER_S)
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=False)
            if self.unix_path:
                with contextlib.suppress(OSError):
                    os.unlink(self.unix_path)
        # gRPC does not say how many calls it cancelled; inference calls are counted by the
        # model versions they were cut off in.
        return []


async def serve_grpc(
    server: grpc.Server,
    address: str,
    port: int,
    unix_path: str,
    unix_mode: int,
    credentials: grpc.ServerCredentials | None,
    pool: ThreadPoolExecutor | None = None,
) -> tuple[GrpcListener, int | None]:
    """Listen on address:port (port -1: no TCP) and a Unix socket if given, and start; the
    listener (which shuts `pool`, the server's handler threads, down with it) and the bound
    TCP port."""
    addresses = []
    if port >= 0:
        addresses.append(f"{address}:{port}")
    if unix_path:
        clear_stale_socket(unix_path, "gRPC")
        addresses.append(f"unix:{unix_path}")
    ports = []
    for where in addresses:
        try:
            if credentials is not None and not where.startswith("unix:"):
                bound = server.add_secure_port(where, credentials)
            else:
                bound = server.add_insecure_port(where)
        except RuntimeError as exc:
            # The TLS files passed appliance/server/tls.py's checks; gRPC's own log line says more.
            also = " or TLS refused by gRPC" if credentials is not None else ""
            raise StartupError(
                f"cannot listen for gRPC on {where} (address in use{also}?): {exc}"
            ) from exc
        if bound == 0 and not where.startswith("unix:"):
            raise StartupError(f"cannot listen for gRPC on {where}: address in use?")
        ports.append(bound)
    server.start()
    if unix_path:
        os.chmod(unix_path, unix_mode)
    return GrpcListener(server, pool, unix_path), ports[0] if port >= 0 else None


def grpc_credentials(tls: TlsSettings) -> grpc.ServerCredentials | None:
    """TLS for the gRPC TCP listener (Unix sockets stay plain: the file mode guards them)."""
    if not tls.grpc:
        return None
    try:
        cert, key = key_pair(tls.grpc_cert, "--grpc-server-cert", tls.grpc_key, "--grpc-server-key")
        root = certificates(tls.grpc_root, "--grpc-root-cert") if tls.grpc_root else None
    except TlsFileError as exc:
        raise ConfigurationError(str(exc)) from None
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=root, require_client_auth=tls.grpc_mutual
    )


def http_ssl_context(tls: TlsSettings) -> ssl.SSLContext | None:
    if not tls.http_cert:
        return None
    try:
        key_pair(tls.http_cert, "--http-ssl-cert", tls.http_key, "--http-ssl-key")
        if tls.http_root:
            certificates(tls.http_root, "--http-ssl-root-cert")
    except TlsFileError as exc:
        raise ConfigurationError(str(exc)) from None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(tls.http_cert, tls.http_key)
        if tls.http_root:
            context.load_verify_locations(tls.http_root)
            context.verify_mode = ssl.CERT_REQUIRED
    except (OSError, ssl.SSLError) as exc:  # passed the checks above: changed since?
        files = f"--http-ssl-cert '{tls.http_cert}', --http-ssl-key '{tls.http_key}'"
        if tls.http_root:
            files += f" or --http-ssl-root-cert '{tls.http_root}'"
        raise ConfigurationError(f"cannot use {files}: {exc}") from exc
    return context


def clear_stale_socket(path: str, what: str) -> None:
    """Remove a socket left by an earlier run; refuse to replace anything else."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise StartupError(f"cannot listen for {what} on unix:{path}: it exists and is no socket")
    os.unlink(path)
