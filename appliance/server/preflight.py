"""What can be checked before a model loads, checked first (issue 37): the TLS files, the TCP
ports and addresses (test-bound), the Unix socket paths, the header-forward patterns and the
state directory. A failure is one `StartupError` naming the flag and the fault, raised before
anything was loaded, so that a wrong setting costs a fraction of a second, not a full load,
and is not followed by shutdown lines.

Exit codes (face/cli.py): a configuration error (`ConfigurationError`) exits 78 (EX_CONFIG,
sysexits.h), which the systemd unit does not restart (`RestartPreventExitStatus=`): nothing
changes by retrying it. A port in use or an address not (yet) on this machine is the machine's
state, which may change by itself (the old instance still stopping, DHCP at boot): it exits 1
and systemd tries again, now without loading a model first.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import ssl
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

import grpc

from appliance.common.header_forward import HeaderForward
from appliance.common.settings import ServerSettings
from appliance.server.listeners import (
    ConfigurationError,
    StartupError,
    grpc_credentials,
    http_ssl_context,
)


@dataclass(frozen=True)
class Prepared:
    """What the checks built, used by the listeners as it is (not read a second time)."""

    http_ssl: ssl.SSLContext | None
    grpc_credentials: grpc.ServerCredentials | None
    http_forward: HeaderForward | None
    grpc_forward: HeaderForward | None


def preflight(settings: ServerSettings, state_dir: Path, needs_store: bool) -> Prepared:
    """Every check that needs no model, in the order a reader fixes them; `needs_store`: remote
    repositories are synced into `state_dir`, which must then be writable."""
    prepared = prepare_listeners(settings)
    for path, flag in _unix_sockets(settings):
        check_unix_socket(path, flag)
    check_ports(_tcp_listeners(settings))
    if needs_store:
        check_writable(state_dir, "--model-store-dir")
    return prepared


def prepare_listeners(settings: ServerSettings) -> Prepared:
    """The TLS contexts and header-forward patterns of `settings`' listeners, checked (also
    for a listener an embedding application adds later with settings of its own)."""
    return Prepared(
        http_ssl=http_ssl_context(settings.tls) if settings.allow_http else None,
        grpc_credentials=grpc_credentials(settings.tls) if settings.allow_grpc else None,
        http_forward=_forward(
            settings.http_header_forward_pattern, "--http-header-forward-pattern"
        ),
        grpc_forward=_forward(
            settings.grpc_header_forward_pattern, "--grpc-header-forward-pattern"
        ),
    )


def _forward(pattern: str | None, flag: str) -> HeaderForward | None:
    try:
        return HeaderForward.from_pattern(pattern, flag)
    except ValueError as exc:  # names the flag and the pattern
        raise ConfigurationError(str(exc)) from None


def _unix_sockets(settings: ServerSettings) -> list[tuple[str, str]]:
    found = []
    if settings.allow_http and settings.http_unix_socket:
        found.append((settings.http_unix_socket, "--http-unix-socket"))
    if settings.allow_grpc and settings.grpc_unix_socket:
        found.append((settings.grpc_unix_socket, "--grpc-unix-socket"))
    return found


def _tcp_listeners(settings: ServerSettings) -> list[tuple[str, str, int, bool]]:
    """(flag stem, address, port, SO_REUSEPORT) of each TCP listener on a fixed port."""
    listeners = [
        ("http", settings.http_address, settings.http_port, settings.reuse_http_port)
        if settings.allow_http
        else None,
        ("grpc", settings.grpc_address, settings.grpc_port, settings.reuse_grpc_port)
        if settings.allow_grpc
        else None,
        ("metrics", settings.metrics_address, settings.metrics_port, False)
        if settings.allow_metrics
        else None,
    ]
    # Port 0 picks a free one and -1 means no TCP listener: nothing to check.
    return [listener for listener in listeners if listener is not None and listener[2] > 0]


def check_ports(listeners: list[tuple[str, str, int, bool]]) -> None:
    """Bind and listen on each address:port at once, as the listeners will (SO_REUSEADDR, and
    SO_REUSEPORT where asked), then let go: a port another process holds, one given to two of
    our listeners, or an address that is not this machine's fails here, before any model loads."""
    with contextlib.ExitStack() as held:
        for stem, address, port, reuse_port in listeners:
            flags = f"--{stem}-port {port}"
            try:
                infos = socket.getaddrinfo(
                    address, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
                )
            except socket.gaierror as exc:
                raise ConfigurationError(
                    f"--{stem}-address '{address}': not an address of this machine ({exc.strerror})"
                ) from None
            family, kind, proto, _, where = infos[0]
            sock = held.enter_context(socket.socket(family, kind, proto))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if reuse_port and hasattr(socket, "SO_REUSEPORT"):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            try:
                sock.bind(where)
                sock.listen(1)
            except OSError as exc:
                raise _bind_error(exc, stem, address, port, flags) from None


def _bind_error(exc: OSError, stem: str, address: str, port: int, flags: str) -> StartupError:
    where = f"{address}:{port}"
    if exc.errno == errno.EADDRINUSE:
        return StartupError(
            f"{flags}: {where} is already in use (another server, or another of this server's "
            "listeners, holds it); free it or choose another port"
        )
    if exc.errno == errno.EADDRNOTAVAIL:
        return StartupError(f"--{stem}-address '{address}': not an address of this machine")
    if exc.errno == errno.EACCES:
        return ConfigurationError(
            f"{flags}: permission denied binding {where} (ports below 1024 need "
            "CAP_NET_BIND_SERVICE; choose a port above 1023)"
        )
    return ConfigurationError(f"{flags}: cannot listen on {where}: {exc.strerror}")


def check_unix_socket(path: str, flag: str) -> None:
    """The socket's folder exists and is writable; what is at the path, if anything, is an old
    socket (the listener replaces it), never a file the server would destroy."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ConfigurationError(f"{flag} '{path}': the folder '{folder}' does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigurationError(
            f"{flag} '{path}': cannot create a socket in '{folder}' (not writable)"
        )
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise ConfigurationError(
            f"{flag} '{path}': it exists and is no socket; remove it or choose another"
        )


def check_writable(folder: Path, flag: str) -> None:
    """`folder` exists (made if need be) and a file can be written in it."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        why = exc.strerror or str(exc)
        raise ConfigurationError(
            f"{flag} '{folder}': cannot write there ({why}); the remote repositories are "
            "synced into it (systemd: the unit's StateDirectory=)"
        ) from None
