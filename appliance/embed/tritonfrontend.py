"""`KServeHttp`, `KServeGrpc`, `Metrics`: this server's front ends on an embedded `Server`
(Triton's `tritonfrontend`), with shared memory, tracing and restricted APIs as the command
line's (Triton's bindings have none of the three).

Each front end serves the `Server`'s own services: the models, statistics, shared memory
regions, tracer and log settings are the embedded server's. Options keep Triton's names and
defaults, but listen on 127.0.0.1 unless told otherwise (a device's default), and take this
server's flags for the rest (`server_args`, e.g. ``["--http-restricted-api",
"model-repository:admin-key=secret"]``).
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Any

from appliance.embed.errors import AlreadyExistsError, InvalidArgumentError, triton_error
from appliance.embed.options import parse_settings
from appliance.embed.server import Server, _Running
from appliance.server.listeners import Listener
from appliance.server.shutdown import Deadline

__all__ = ["KServeGrpc", "KServeHttp", "Metrics"]


def _bool(value: bool) -> str:
    return "true" if value else "false"


class _Frontend:
    """One listener on a started `Server`, opened by `start()`, closed by `stop()`."""

    kind = ""
    Options: type[Any]

    def __init__(self, server: Server, options: Any = None) -> None:
        if options is None:
            options = self.Options()
        if not isinstance(options, self.Options):
            raise InvalidArgumentError(
                "Incorrect type for options. options argument must be of type "
                f"{type(self).__name__}.Options"
            )
        self._server = server
        self.options = options
        self._listener: Listener | None = None
        self._running: _Running | None = None
        self._grpc_port: int | None = None

    def _flags(self) -> list[str]:
        raise NotImplementedError

    @property
    def port(self) -> int | None:
        """The TCP port it listens on (after `start()`; with port 0, the one picked)."""
        if self._listener is None:
            return None
        return self._grpc_port if self.kind == "grpc" else getattr(self._listener, "port", None)

    def start(self) -> None:
        if self._listener is not None:
            raise AlreadyExistsError(f"{type(self).__name__}: server is already running.")
        running = self._server._require()
        settings = parse_settings([*running.argv, *self._flags()])
        self._listener = running.call(running.appliance.add_listener(self.kind, settings))
        self._running = running
        if self.kind == "grpc":
            self._grpc_port = running.appliance.grpc_port

    def stop(self) -> None:
        """Stop listening; requests in flight finish within the server's exit timeout."""
        listener, running = self._listener, self._running
        self._listener = self._running = None
        if listener is None or running is None or running.loop is None or running.loop.is_closed():
            return  # never started, or the server stopped (and the listener with it)
        deadline = Deadline.starting(running.settings.exit_timeout_secs)
        try:
            running.call(running.appliance.stop_listener(listener, deadline))
        except RuntimeError as exc:
            raise triton_error(exc) from exc

    def __enter__(self) -> _Frontend:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class KServeHttp(_Frontend):
    """The KServe v2 HTTP front end (and the status page) on the server."""

    kind = "http"

    @dataclass
    class Options:
        address: str = "127.0.0.1"
        port: int = 8000
        reuse_port: bool = False
        thread_count: int = 8  # accepted: one event loop serves HTTP here
        header_forward_pattern: str = ""
        restricted_protocols: list[str] = field(default_factory=list)  # API-GROUPS:KEY=VALUE
        unix_socket: str = ""  # this server's: also (port -1: only) on this Unix socket
        server_args: list[str] = field(default_factory=list)

        def __post_init__(self) -> None:
            _check_types(self)
            _check_port(self.port, self.unix_socket)
            if self.thread_count <= 0:
                raise InvalidArgumentError("thread_count must be above 0")

    def _flags(self) -> list[str]:
        o = self.options
        flags = ["--allow-http=true", "--http-address", o.address, "--http-port", str(o.port),
                 f"--reuse-http-port={_bool(o.reuse_port)}"]  # fmt: skip
        if o.header_forward_pattern:
            flags += ["--http-header-forward-pattern", o.header_forward_pattern]
        if o.unix_socket:
            flags += ["--http-unix-socket", o.unix_socket]
        for spec in o.restricted_protocols:
            flags += ["--http-restricted-api", spec]
        return flags + list(o.server_args)


class GrpcCompressionLevel(enum.IntEnum):
    """Triton's gRPC response compression levels (gzip at every level but NONE here)."""

    NONE = 0
    LOW = 1
    MED = 2
    HIGH = 3


class KServeGrpc(_Frontend):
    """The KServe v2 gRPC front end on the server."""

    kind = "grpc"
    Grpc_compression_level = GrpcCompressionLevel  # Triton's spelling

    @dataclass
    class Options:
        address: str = "127.0.0.1"
        port: int = 8001
        reuse_port: bool = False
        use_ssl: bool = False
        server_cert: str = ""
        server_key: str = ""
        root_cert: str = ""
        use_mutual_auth: bool = False
        keepalive_time_ms: int = 7_200_000
        keepalive_timeout_ms: int = 20_000
        keepalive_permit_without_calls: bool = False
        http2_max_pings_without_data: int = 2
        http2_min_recv_ping_interval_without_data_ms: int = 300_000
        http2_max_ping_strikes: int = 2
        max_connection_age_ms: int = 0
        max_connection_age_grace_ms: int = 0
        infer_compression_level: int | str = 0  # 0-3, or none / low / medium / high
        infer_thread_count: int = 2  # accepted: handler threads follow the call bound here
        infer_allocation_pool_size: int = 8  # accepted
        max_response_pool_size: int = 2_147_483_647  # accepted
        forward_header_pattern: str = ""
        restricted_protocols: list[str] = field(default_factory=list)  # API-GROUPS:KEY=VALUE
        unix_socket: str = ""
        server_args: list[str] = field(default_factory=list)

        def __post_init__(self) -> None:
            _check_types(self)
            _check_port(self.port, self.unix_socket)
            for f in dataclasses.fields(self):
                value = getattr(self, f.name)
                if f.name.endswith(("_ms", "_count", "_size", "_data", "_strikes")) and (
                    not isinstance(value, int) or value < 0
                ):
                    raise InvalidArgumentError(f"{f.name} must be a whole number >= 0")

    def _flags(self) -> list[str]:
        o = self.options
        level = o.infer_compression_level
        if isinstance(level, int):  # an IntEnum too
            level = ("none", "low", "medium", "high")[max(0, min(int(level), 3))]
        flags = [
            "--allow-grpc=true", "--grpc-address", o.address, "--grpc-port", str(o.port),
            f"--reuse-grpc-port={_bool(o.reuse_port)}",
            "--grpc-keepalive-time", str(o.keepalive_time_ms),
            "--grpc-keepalive-timeout", str(o.keepalive_timeout_ms),
            f"--grpc-keepalive-permit-without-calls={_bool(o.keepalive_permit_without_calls)}",
            "--grpc-http2-max-pings-without-data", str(o.http2_max_pings_without_data),
            "--grpc-http2-min-recv-ping-interval-without-data",
            str(o.http2_min_recv_ping_interval_without_data_ms),
            "--grpc-http2-max-ping-strikes", str(o.http2_max_ping_strikes),
            "--grpc-max-connection-age", str(o.max_connection_age_ms),
            "--grpc-max-connection-age-grace", str(o.max_connection_age_grace_ms),
            "--grpc-infer-response-compression-level", level,
        ]  # fmt: skip
        if o.use_ssl:
            flags += ["--grpc-use-ssl=true", "--grpc-server-cert", o.server_cert,
                      "--grpc-server-key", o.server_key]  # fmt: skip
            if o.root_cert:
                flags += ["--grpc-root-cert", o.root_cert]
            if o.use_mutual_auth:
                flags += ["--grpc-use-ssl-mutual=true"]
        if o.forward_header_pattern:
            flags += ["--grpc-header-forward-pattern", o.forward_header_pattern]
        if o.unix_socket:
            flags += ["--grpc-unix-socket", o.unix_socket]
        for spec in o.restricted_protocols:
            flags += ["--grpc-restricted-protocol", spec]
        return flags + list(o.server_args)


class Metrics(_Frontend):
    """Prometheus metrics (`GET /metrics`) of the server's models."""

    kind = "metrics"

    @dataclass
    class Options:
        address: str = "127.0.0.1"
        port: int = 8002
        thread_count: int = 1  # accepted

        def __post_init__(self) -> None:
            _check_types(self)
            _check_port(self.port, "")
            if self.thread_count <= 0:
                raise InvalidArgumentError("thread_count must be above 0")

    def _flags(self) -> list[str]:
        o = self.options
        return ["--allow-metrics=true", "--metrics-address", o.address,
                "--metrics-port", str(o.port)]  # fmt: skip


_TYPES: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "int": (int,),
    "bool": (bool,),
    "int | str": (int, str),
    "list[str]": (list,),
}


def _check_types(options: Any) -> None:
    """Each option of the type it is declared with (as Triton's pydantic dataclasses check)."""
    for f in dataclasses.fields(options):
        value = getattr(options, f.name)
        allowed = _TYPES.get(str(f.type), (object,))
        if not isinstance(value, allowed) or (bool not in allowed and isinstance(value, bool)):
            raise InvalidArgumentError(
                f"{type(options).__qualname__}.{f.name} must be {f.type}, got {value!r}"
            )


def _check_port(port: int, unix_socket: str) -> None:
    if not isinstance(port, int) or not (0 <= port <= 65535 or (port == -1 and unix_socket)):
        raise InvalidArgumentError(
            f"port must be 0-65535 (0: any free port; -1 with unix_socket: none), got {port!r}"
        )
