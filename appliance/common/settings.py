"""Server settings as a frozen dataclass, built by cli.py from tritonserver-style flags."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from appliance.common.host_policy import HostPolicy
from appliance.common.limits import RequestLimits

MiB = 1024 * 1024
# Triton's auto-complete max_batch_size for a model whose first dimension is dynamic, and the
# one source of it: the runtime passes it (or --backend-config's) to every backend.
DEFAULT_MAX_BATCH_SIZE = 4
# Triton's max_sequence_idle_microseconds where a config gives none (its served config says so).
SEQUENCE_IDLE_DEFAULT_US = 1_000_000


# Triton's default latency summary quantiles, (quantile, allowed error) each.
SUMMARY_QUANTILES = ((0.5, 0.05), (0.9, 0.01), (0.95, 0.001), (0.99, 0.001), (0.999, 0.001))


@dataclass(frozen=True)
class TlsSettings:
    """Certificates for TLS listeners (PEM file paths); empty: plain TCP."""

    grpc: bool = False
    grpc_mutual: bool = False
    grpc_cert: str = ""
    grpc_key: str = ""
    grpc_root: str = ""
    http_cert: str = ""
    http_key: str = ""
    http_root: str = ""  # set: HTTP clients must present a certificate signed by it

    def problem(self) -> str:
        """'' when consistent, else what is missing (the files are checked when used:
        appliance/server/tls.py)."""
        grpc_files = [
            flag
            for flag, path in (
                ("--grpc-server-cert", self.grpc_cert),
                ("--grpc-server-key", self.grpc_key),
                ("--grpc-root-cert", self.grpc_root),
            )
            if path
        ]
        if grpc_files and not self.grpc:
            # tritonserver serves plain gRPC then: a TLS setup that silently is not one.
            return (
                f"{' and '.join(grpc_files)} without --grpc-use-ssl (or --grpc-use-ssl-mutual) "
                "would serve plain gRPC; add --grpc-use-ssl=true, or leave them out"
            )
        if self.grpc and not (self.grpc_cert and self.grpc_key):
            return "--grpc-use-ssl needs --grpc-server-cert and --grpc-server-key"
        if self.grpc_mutual and not self.grpc_root:
            return "--grpc-use-ssl-mutual needs --grpc-root-cert"
        if bool(self.http_cert) != bool(self.http_key):
            return "--http-ssl-cert and --http-ssl-key go together"
        if self.http_root and not self.http_cert:
            return "--http-ssl-root-cert needs --http-ssl-cert and --http-ssl-key"
        return ""


@dataclass(frozen=True)
class HttpConnectionLimits:
    """What one HTTP connection may hold and how slow it may be (0 disables a timeout)."""

    max_header_bytes: int = 16 * 1024  # the request line and each header field
    max_headers: int = 100
    header_timeout_secs: float = 20.0  # from a request's first byte to its last header byte
    body_timeout_secs: float = 30.0  # longest silence while a request body is read
    keepalive_timeout_secs: float = 60.0  # idle between requests
    max_connections: int = 1000  # open connections per listener; more are answered 503


@dataclass(frozen=True)
class GrpcConnectionSettings:
    """tritonserver's gRPC keepalive and connection-age flags, with its defaults and units
    (milliseconds; server repository, src/grpc/grpc_server.h `KeepAliveOptions`): each is the
    gRPC core channel argument of the same name on the server (app.py). Keepalive is what
    notices a client that vanished without closing its connection (power loss, a NAT that
    forgot it): until then its ModelStreamInfer streams hold their handler threads."""

    keepalive_time_ms: int = 7_200_000  # a ping after this long (2 h) ...
    keepalive_timeout_ms: int = 20_000  # ... unanswered this long closes the connection
    keepalive_permit_without_calls: bool = False  # ping connections with no call open too
    http2_max_pings_without_data: int = 2  # pings sent with no data between them (0: any)
    # A client's pings closer than this with no data between them are "strikes"; more than
    # max_ping_strikes (0: any number) and the connection is closed with GOAWAY.
    http2_min_recv_ping_interval_without_data_ms: int = 300_000
    http2_max_ping_strikes: int = 2
    # A connection is sent GOAWAY after this long and closed after the grace; 0: not set, as
    # tritonserver (gRPC's default: no age; no grace, so streams open then run on).
    max_connection_age_ms: int = 0
    max_connection_age_grace_ms: int = 0
    # ModelInfer and ModelStreamInfer responses: none | low | medium | high.
    infer_compression_level: str = "none"


@dataclass(frozen=True)
class SchedulingSettings:
    """Server-wide scheduling rules every model version gets; a config's own values win."""

    max_queue_size: int = 4096  # per version, when the config sets none
    # Refuse a request when the work queued ahead of it would take longer (0: no limit)...
    max_queue_wait_ms: int = 1_000
    # ... or, by default, longer than this many of the model's measured executions, where
    # that is longer (policy.queue_wait_bound_ns; 0: max_queue_wait_ms alone, as when
    # --max-queue-wait-ms is given).
    max_queue_wait_executions: int = 16
    inline_budget_us: int = 100  # see scheduling/batcher.py; 0 turns inline execution off
    rate_limit: bool = False  # --rate-limit=execution_count
    rate_limit_resources: tuple[tuple[str, int], ...] = ()  # --rate-limit-resource name:count
    # Instances of one model version, all groups and GPUs together; one thread (a Python
    # model: one process) each. A config or load override asking more is refused.
    max_instances_per_model: int = 64


@dataclass(frozen=True)
class MemorySettings:
    """Models on demand under a memory budget (docs/memory.md; appliance/runtime/on_demand.py)."""

    budget_bytes: int = 0  # --model-memory-budget BYTES; 0 with no percent: no budget
    budget_percent: float = 0.0  # --model-memory-budget N%: of memory.max, else MemAvailable
    load_on_demand: bool = False  # a request for a known, unloaded model loads it
    load_wait_ms: int = 30_000  # how long such a request waits for the load (or its timeout)
    idle_unload_secs: float = 0.0  # unload a model idle this long; 0: never
    resident: tuple[str, ...] = ()  # --model-resident: models never unloaded for the budget
    # An update that does not fit beside the loaded versions: unload them first (a short
    # unavailability) instead of refusing it.
    swap_unavailable: bool = False

    @property
    def active(self) -> bool:
        return bool(
            self.budget_bytes or self.budget_percent or self.load_on_demand or self.idle_unload_secs
        )


@dataclass(frozen=True)
class ServerSettings:
    model_repositories: tuple[Path, ...]
    http_address: str = "127.0.0.1"  # a device listens on loopback unless told otherwise
    http_port: int = 8000
    grpc_address: str = "127.0.0.1"
    grpc_port: int = 8001
    http_unix_socket: str = ""  # also (or, with http_port -1, only) listen on this socket
    grpc_unix_socket: str = ""
    unix_socket_mode: int = 0o660
    # API group -> (header key, value) from --http-restricted-api / --grpc-restricted-protocol
    tls: TlsSettings = field(default_factory=TlsSettings)
    http_restricted: tuple[tuple[str, str, str], ...] = ()
    grpc_restricted: tuple[tuple[str, str, str], ...] = ()
    # --http-header-forward-pattern / --grpc-header-forward-pattern: headers whose name matches
    # become request parameters (appliance/common/header_forward.py); None: the flag was not given.
    http_header_forward_pattern: str | None = None
    grpc_header_forward_pattern: str | None = None
    metrics_address: str = "127.0.0.1"
    metrics_port: int = 8002
    allow_http: bool = True
    # --allow-client-shm: clients may register shared memory regions (tritonserver's default
    # since 2026 is false too).
    allow_client_shm: bool = False
    # --max-shm-regions: regions registered at once (each system region holds a descriptor).
    max_shm_regions: int = 1024
    # --http-allowed-hosts: DNS names accepted in Host (and same-origin Origin); "*": any.
    http_allowed_hosts: tuple[str, ...] = ()
    # --reuse-http-port / --reuse-grpc-port: SO_REUSEPORT on the TCP listener.
    reuse_http_port: bool = False
    reuse_grpc_port: bool = False
    allow_grpc: bool = True
    allow_metrics: bool = True
    allow_cpu_metrics: bool = True
    allow_gpu_metrics: bool = True  # NVML, or a Jetson's sysfs; absent without a GPU
    metrics_interval_ms: int = 2000  # NVML readings are at most this old
    latency_histograms: bool = False  # --metrics-config histogram_latencies=true
    latency_summaries: bool = False  # --metrics-config summary_latencies=true
    # --metrics-config summary_quantiles=Q:E,...: Triton's default (quantile, error) pairs.
    summary_quantiles: tuple[tuple[float, float], ...] = SUMMARY_QUANTILES
    strict_model_config: bool = False
    model_config_name: str = ""  # --model-config-name: configs/<name>.pbtxt where it exists
    model_load_threads: int = 2  # --model-load-thread-count (tritonserver's default is 4)
    model_load_retries: int = 0  # --model-load-retry-count: a failed version's load retried
    model_namespacing: bool = False  # --model-namespacing: a name may be in two repositories
    # --host-policy: the cores and NUMA node of the instances under each policy name.
    host_policies: tuple[HostPolicy, ...] = ()
    # --backend-config [BACKEND,]default-max-batch-size=N: auto-complete's max_batch_size for
    # a model that can batch (0: auto-completed models do not batch), for every backend and
    # (backend, N) where one backend was given its own.
    default_max_batch_size: int = DEFAULT_MAX_BATCH_SIZE
    backend_max_batch_sizes: tuple[tuple[str, int], ...] = ()
    server_id: str = "triton"  # --id: the name server metadata reports
    strict_readiness: bool = False
    exit_on_error: bool = False
    log_verbose: int = 0
    log_info: bool = True
    log_warning: bool = True
    log_error: bool = True
    log_format: str = "default"  # default | ISO8601 | json
    log_file: str = ""  # empty: stderr
    model_control_mode: str = "none"  # none | poll | explicit
    load_models: tuple[str, ...] = ()
    repository_poll_secs: float = 15
    exit_timeout_secs: float = 30.0
    # Big enough for a 100 MB tensor plus its JSON header.
    max_request_bytes: int = 128 * MiB
    grpc_max_message_bytes: int = 128 * MiB
    # gRPC calls in flight, all connections together (a stream is one call while open); more
    # are answered UNAVAILABLE at once. Health calls are never refused. 0: no limit.
    grpc_max_concurrent_rpcs: int = 64
    # --grpc-max-response-pool-size: a decoupled request's responses waiting for its reader
    # before the model is held back (0: services/inference.py's DECOUPLED_MAX_RESPONSES).
    max_waiting_responses: int = 0
    grpc_connections: GrpcConnectionSettings = field(default_factory=GrpcConnectionSettings)
    request_limits: RequestLimits = field(default_factory=RequestLimits)
    http_connections: HttpConnectionLimits = field(default_factory=HttpConnectionLimits)
    scheduling: SchedulingSettings = field(default_factory=SchedulingSettings)
    memory: MemorySettings = field(default_factory=MemorySettings)
    require_manifest: bool = False
    manifest_public_key: Path | None = None  # manifests must carry an Ed25519 signature
    # TUF metadata mode for s3:// repositories: the trusted initial root.json
    model_repository_tuf_root: Path | None = None
    model_signature: str = ""  # --model-signature METHOD:ARGS (OpenSSF model signing)
    require_model_signature: bool = False
    remote_repositories: tuple[str, ...] = ()  # s3://... synced into the model store
    model_store_dir: Path | None = None  # where remote repositories are cached
    # Downloads stop before free space drops below; None: the smaller of 256 MiB and 10% of
    # the store's file system.
    model_store_reserve_bytes: int | None = None
    rollback_error_rate: float = 0.0  # 0: no automatic rollback
    rollback_window: int = 100
    rollback_latency_ratio: float = 0.0  # 0: latency does not roll a version back
    download_rate_bytes_s: float = 0.0  # cap on model download bandwidth; 0: none
    # Remote repositories sync after the cached models serve; readiness waits for the first
    # successful sync (and the loads it brings) at most this long. 0: ready on the cache.
    repository_sync_wait_secs: float = 0.0
    repository_timeout_secs: float = 10.0  # each connect and each read from a remote repository
    # Fleets (docs/fleet.md): this device's id (None: /etc/machine-id, else the host name) and
    # labels, and how often it writes its report to the bucket (0: never).
    device_id: str | None = None
    device_labels: tuple[tuple[str, str], ...] = ()
    fleet_report_interval_secs: float = 300.0
    trace_file: str = ""
    trace_level: str = "OFF"  # OFF, TIMESTAMPS, TENSORS or TIMESTAMPS,TENSORS
    trace_rate: int = 1000
    trace_count: int = -1
    trace_log_frequency: int = 0  # --trace-log-frequency: traces per <trace-file>.<n>; 0 one file
    response_cache_bytes: int = 0  # 0: no response cache (--cache-config local,size=N)
    ignored_flags: tuple[str, ...] = field(default=())
