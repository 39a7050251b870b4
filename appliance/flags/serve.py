"""tritonserver's flags for `edge-appliance serve`, and the ServerSettings they make.

Every tritonserver flag is accepted in both spellings (`--flag value`, `--flag=value`), so
scripts and units written for Triton run unchanged: the ones that apply here are implemented,
the rest are accepted with a one-line warning.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from appliance.common import extras
from appliance.common.access import parse_groups
from appliance.common.header_forward import compile_pattern
from appliance.common.host_policy import HostPolicy, HostPolicyError, parse_host_policies
from appliance.common.limits import RequestLimits
from appliance.common.model_config import check_config_name
from appliance.common.settings import (
    HttpConnectionLimits,
    SchedulingSettings,
    ServerSettings,
    TlsSettings,
)
from appliance.flags.grpc_connection import add_grpc_connection_flags, grpc_connections
from appliance.flags.memory import add_memory_flags, memory_settings
from appliance.flags.values import (
    add_bool,
    integer,
    on,
    parse_backend_config,
    parse_bool,
    parse_cache_config,
    parse_metrics_config,
    parse_quantiles,
    parse_rate_limit_resources,
    parse_trace_config,
)
from appliance.ops import affinity, logs
from appliance.repository.model_signature import parse_policy
from appliance.repository.rollout import (
    RolloutError,
    check_device_id,
    parse_label_text,
    parse_labels,
)
from appliance.repository.sources import check_location, is_remote

# tritonserver flags that have no meaning here (yet); accepted and reported as ignored.
IGNORED_FLAGS = (
    "http-thread-count",
    "grpc-infer-allocation-pool-size",
    "allow-sagemaker",
    "sagemaker-port",
    "sagemaker-safe-port-range",
    "sagemaker-thread-count",
    "allow-vertex-ai",
    "vertex-ai-port",
    "vertex-ai-thread-count",
    "vertex-ai-default-model",
    "enable-peer-access",
    "pinned-memory-pool-byte-size",
    "cuda-memory-pool-byte-size",
    "cuda-virtual-address-size",
    "min-supported-compute-capability",
    "buffer-manager-thread-count",
    "model-load-gpu-limit",
    "backend-directory",
    "repoagent-directory",
    "cache-directory",
    "grpc-infer-thread-count",
)

# The ignored flags' values are checked as tritonserver checks them (bool: true/false/on/off/
# 1/0; integer; number): a value tritonserver refuses is refused here too. Others: any text.
_IGNORED_BOOL = (
    "allow-sagemaker",
    "allow-vertex-ai",
    "enable-peer-access",
)
_IGNORED_INT = (
    "http-thread-count",
    "grpc-infer-allocation-pool-size",
    "grpc-infer-thread-count",
    "sagemaker-port",
    "sagemaker-thread-count",
    "vertex-ai-port",
    "vertex-ai-thread-count",
    "pinned-memory-pool-byte-size",
    "buffer-manager-thread-count",
)
_IGNORED_NUMBER = ("min-supported-compute-capability",)

# Every default below comes from the settings dataclasses: one source for serve, check and tune.
_D = ServerSettings(model_repositories=())
_S = _D.scheduling
MiB = 1024 * 1024


def _positive_int(text: str) -> int:
    value = integer(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _non_negative_int(text: str) -> int:
    value = integer(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {value}")
    return value


def add_serve_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model-repository",
        "--model-store",
        action="append",
        default=[],
        metavar="DIR|URL",
        help="model repository: a folder or s3://[host:port/]bucket/prefix; repeat to merge",
    )
    p.add_argument(
        "--model-store-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="where remote repositories are cached (default: $STATE_DIRECTORY, else "
        "~/.local/state/edge-appliance)",
    )
    p.add_argument(
        "--model-store-reserve-mb",
        type=int,
        default=None,
        metavar="MB",
        help="free disk space that downloads never use (default: the smaller of 256 and 10%% "
        "of the store's file system)",
    )
    p.add_argument(
        "--model-download-limit-mbps",
        type=float,
        default=0.0,
        metavar="MBIT/S",
        help="cap on the bandwidth model downloads use, in megabits per second (default: none)",
    )
    p.add_argument(
        "--repository-sync-wait-secs",
        type=float,
        default=_D.repository_sync_wait_secs,
        metavar="SECONDS",
        help="remote repositories: report ready only once the first sync succeeded and loaded "
        "what it brought, or after this long (default 0: ready once the cached models are "
        "loaded; the sync goes on in the background)",
    )
    p.add_argument(
        "--repository-timeout-secs",
        type=float,
        default=_D.repository_timeout_secs,
        metavar="SECONDS",
        help="remote repositories: the longest wait for a connection or for each read "
        f"(default {_D.repository_timeout_secs:g})",
    )
    p.add_argument(
        "--model-rollback-error-rate",
        type=float,
        default=0.0,
        metavar="RATE",
        help="roll a newly switched-in version back when more than RATE (0-1) of its first "
        "requests fail in the model (default 0: off)",
    )
    p.add_argument(
        "--model-rollback-window",
        type=int,
        default=_D.rollback_window,
        metavar="N",
        help="how many first requests --model-rollback-error-rate watches "
        f"(default {_D.rollback_window})",
    )
    p.add_argument(
        "--model-rollback-latency-ratio",
        type=float,
        default=_D.rollback_latency_ratio,
        metavar="RATIO",
        help="also roll a newly switched-in version back when its median latency over those "
        "requests exceeds RATIO (at least 1) times the version it replaced (default 0: off)",
    )
    p.add_argument(
        "--manifest-public-key",
        type=Path,
        default=None,
        metavar="FILE",
        help="Ed25519 public key (PEM): every version needs a SHA256SUMS signed by it",
    )
    p.add_argument(
        "--model-repository-tuf-root",
        type=Path,
        default=None,
        metavar="FILE",
        help="TUF metadata mode for s3:// repositories: the trusted initial root.json "
        "(`edge-appliance fleet keys` writes it); every file taken is a target of the "
        "bucket's TUF metadata (docs/model-updates.md)",
    )
    p.add_argument(
        "--device-id",
        default=None,
        metavar="ID",
        help="this device's id in a fleet: rollout stages and its report (env EDGE_DEVICE_ID; "
        "default: /etc/machine-id, else the host name; A-Z a-z 0-9 . _ -, up to 128)",
    )
    p.add_argument(
        "--device-label",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a label for rollout stages that name device groups, e.g. site=berlin; repeatable "
        "(env EDGE_DEVICE_LABELS=site=berlin,hw=orin-nano)",
    )
    p.add_argument(
        "--fleet-report-interval",
        type=float,
        default=_D.fleet_report_interval_secs,
        metavar="SECONDS",
        help="how often the device writes its report to the bucket's .fleet/devices/ (and at "
        "once on a change), once the bucket holds a rollout or --device-id is given "
        f"(default {_D.fleet_report_interval_secs:g}, at least 30; 0: never)",
    )
    for protocol, what in (("http", "HTTP (KServe v2 REST)"), ("grpc", "gRPC")):
        p.add_argument(
            f"--{protocol}-address",
            default=getattr(_D, f"{protocol}_address"),
            metavar="ADDRESS",
            help=f"the address {what} listens on (0.0.0.0: every interface)",
        )
        p.add_argument(
            f"--{protocol}-port",
            type=int,
            default=getattr(_D, f"{protocol}_port"),
            metavar="PORT",
            help=f"the {what} port (0: any free one; -1: none, only the Unix socket)",
        )
    p.add_argument(
        "--http-unix-socket",
        default="",
        metavar="PATH",
        help="also serve HTTP on this Unix socket (with --http-port -1: only there)",
    )
    p.add_argument(
        "--grpc-unix-socket",
        default="",
        metavar="PATH",
        help="also serve gRPC on this Unix socket (with --grpc-port -1: only there)",
    )
    add_bool(
        p,
        "--grpc-use-ssl",
        "serve gRPC over TLS (--grpc-server-cert, --grpc-server-key; default false)",
    )
    add_bool(
        p,
        "--grpc-use-ssl-mutual",
        "TLS with client certificates signed by --grpc-root-cert (default false)",
    )
    p.add_argument(
        "--grpc-server-cert", default="", metavar="PEM", help="the gRPC server's certificate"
    )
    p.add_argument("--grpc-server-key", default="", metavar="PEM", help="its private key")
    p.add_argument(
        "--grpc-root-cert",
        default="",
        metavar="PEM",
        help="with --grpc-use-ssl-mutual: the CA client certificates must be signed by",
    )
    p.add_argument(
        "--http-ssl-cert",
        default="",
        metavar="PEM",
        help="serve HTTP over TLS with this certificate (and --http-ssl-key)",
    )
    p.add_argument("--http-ssl-key", default="", metavar="PEM", help="its private key")
    p.add_argument(
        "--http-ssl-root-cert",
        default="",
        metavar="PEM",
        help="require HTTP clients to present a certificate signed by this CA",
    )
    p.add_argument(
        "--http-restricted-api",
        action="append",
        default=[],
        metavar="API,...:KEY=VALUE",
        help="HTTP APIs (health, metadata, inference, shared-memory, model-config, "
        "model-repository, statistics, trace, logging) that need header KEY: VALUE; repeatable; "
        "more in $EDGE_APPLIANCE_HTTP_RESTRICTED_API (kept off the command line)",
    )
    p.add_argument(
        "--grpc-restricted-protocol",
        action="append",
        default=[],
        metavar="API,...:KEY=VALUE",
        help="the same for gRPC; the metadata key is triton-grpc-protocol-KEY; more in "
        "$EDGE_APPLIANCE_GRPC_RESTRICTED_PROTOCOL",
    )
    for protocol, names in (("http", "HTTP headers"), ("grpc", "gRPC metadata keys")):
        p.add_argument(
            f"--{protocol}-header-forward-pattern",
            default=None,
            metavar="REGEX",
            help=f"{names} of infer requests whose name this matches (a search, case-insensitive "
            "unless the pattern says (?-i)) reach the model as string request parameters "
            "(default: none)",
        )
    p.add_argument(
        "--unix-socket-mode",
        type=lambda text: int(text, 8),
        default=_D.unix_socket_mode,
        metavar="OCTAL",
        help="permissions of the Unix sockets (default 660: owner and group)",
    )
    p.add_argument(
        "--metrics-address",
        default=_D.metrics_address,
        metavar="ADDRESS",
        help="the address Prometheus metrics (/metrics) are served on",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        default=_D.metrics_port,
        metavar="PORT",
        help="the metrics port",
    )
    add_bool(
        p,
        "--allow-client-shm",
        "clients may register and unregister system and CUDA shared memory regions for their "
        "tensors (default false, as tritonserver's: a region maps any shared memory object "
        "the service can open)",
    )
    p.add_argument(
        "--max-shm-regions",
        type=int,
        default=_D.max_shm_regions,
        metavar="N",
        help="most shared memory regions registered at once (default %(default)s; never more "
        "than half the open-file limit, so that connections keep the rest)",
    )
    p.add_argument(
        "--http-allowed-hosts",
        default="",
        metavar="NAME,...",
        help="DNS names HTTP requests may give in Host besides localhost and this machine's "
        "own names (IP addresses are always accepted); '*': any Host and any Origin",
    )
    add_bool(p, "--allow-http", "serve HTTP (default true)")
    for protocol in ("http", "grpc"):
        add_bool(
            p,
            f"--reuse-{protocol}-port",
            f"listen on the {protocol.upper()} port beside other servers started with this flag "
            "(SO_REUSEPORT: the kernel spreads connections; a new server can take over the port "
            "before the old one stops; default false)",
        )
    add_bool(p, "--allow-grpc", "serve gRPC (default true)")
    add_bool(p, "--allow-metrics", "serve Prometheus metrics on /metrics (default true)")
    add_bool(p, "--allow-cpu-metrics", "include CPU utilisation and memory (default true)")
    add_bool(
        p,
        "--allow-gpu-metrics",
        "include GPU utilisation, memory and power from NVML or a Jetson's sysfs (default true)",
    )
    p.add_argument(
        "--metrics-interval-ms",
        type=float,  # tritonserver's is a float
        default=_D.metrics_interval_ms,
        help=f"how old GPU readings may be when scraped (default {_D.metrics_interval_ms})",
    )
    add_bool(
        p, "--strict-model-config", "refuse models without a complete config.pbtxt (default false)"
    )
    p.add_argument(
        "--id",
        default=_D.server_id,
        metavar="NAME",
        help=f"the server's name in its metadata (default {_D.server_id}, which Triton's "
        "clients and examples expect)",
    )
    p.add_argument(
        "--model-load-thread-count",
        type=_positive_int,
        default=_D.model_load_threads,
        metavar="N",
        help="models loading at once, at start and on repository changes (default "
        f"{_D.model_load_threads}: each load's peak memory adds up on a small device)",
    )
    p.add_argument(
        "--model-load-retry-count",
        type=_non_negative_int,
        default=_D.model_load_retries,
        metavar="N",
        help="a model version whose load fails is tried again up to N more times before it "
        f"counts as failed, as tritonserver's (default {_D.model_load_retries})",
    )
    p.add_argument(
        "--host-policy",
        action="append",
        default=[],
        metavar="NAME,SETTING=VALUE",
        help="tritonserver's host policy, one setting each (repeatable): cpu-cores=FIRST-LAST[,..] "
        "binds the threads (and Python model processes) of the instances under policy NAME to "
        "those cores, numa-node=N their memory to that NUMA node; an instance group names its "
        "policy with host_policy, else it is 'cpu' (KIND_CPU), 'gpu_<device>' or 'model'",
    )
    add_bool(
        p,
        "--model-namespacing",
        "a model name may be in more than one repository: each copy is its own model, an "
        "ensemble calls its own repository's first, a request by a shared name is refused "
        "(default false: a name in two repositories stops the start)",
    )
    p.add_argument(
        "--model-config-name",
        default=None,
        metavar="NAME",
        help="each model's configuration is configs/NAME.pbtxt in its folder where that file "
        "exists, config.pbtxt otherwise (one repository configured per kind of device)",
    )
    add_bool(
        p,
        "--disable-auto-complete-config",
        "tritonserver's spelling of --strict-model-config=true: configs are not completed "
        "(default false)",
    )
    add_bool(
        p,
        "--strict-readiness",
        "ready only when every model is ready (default false: a device serves what loaded)",
    )
    add_bool(
        p,
        "--exit-on-error",
        "exit when a model fails to load at start-up (default false: serve the others)",
    )
    p.add_argument(
        "--log-verbose",
        type=_verbose_level,
        default=0,
        metavar="N",
        help="1: this server's debug lines; 2 and above: libraries' too (default 0)",
    )
    add_bool(p, "--log-info", "log INFO lines (default true)")
    add_bool(p, "--log-warning", "log WARNING lines (default true)")
    add_bool(p, "--log-error", "log ERROR lines (default true)")
    p.add_argument(
        "--log-format",
        choices=logs.FORMATS,
        default=_D.log_format,
        help="default; ISO8601 (UTC timestamps); json (one object per line). Under systemd "
        "lines carry syslog priorities and default drops the timestamp",
    )
    p.add_argument(
        "--log-file",
        default=_D.log_file,
        metavar="PATH",
        help="append the log here instead of stderr",
    )
    p.add_argument(
        "--model-control-mode",
        type=str.lower,  # tritonserver lowercases it: EXPLICIT and Poll are accepted
        choices=("none", "poll", "explicit"),
        default=_D.model_control_mode,
        help="none: load every model at start; explicit: load the --load-model ones, then "
        "load / unload over the repository API; poll: rescan the repository every "
        "--repository-poll-secs and apply a change once it has settled for one poll",
    )
    p.add_argument(
        "--load-model",
        action="append",
        default=[],
        metavar="NAME",
        help="explicit mode: a model to load at start (repeatable; '*': every model)",
    )
    p.add_argument(
        "--repository-poll-secs",
        type=float,
        default=_D.repository_poll_secs,
        help="poll mode: seconds between repository scans (changes apply once settled)",
    )
    p.add_argument(
        "--exit-timeout-secs",
        type=float,
        default=_D.exit_timeout_secs,
        metavar="S",
        help="shutdown deadline: in-flight requests get this long, then what is left is "
        f"cancelled (default {_D.exit_timeout_secs:g}, below the unit's TimeoutStopSec)",
    )
    p.add_argument(
        "--max-request-bytes",
        "--http-max-input-size",  # tritonserver's name
        type=int,
        default=_D.max_request_bytes,
        help=f"largest HTTP request body accepted (default {_D.max_request_bytes // MiB} MiB)",
    )
    p.add_argument(
        "--grpc-max-message-bytes",
        type=int,
        default=_D.grpc_max_message_bytes,
        help="largest gRPC message sent or received "
        f"(default {_D.grpc_max_message_bytes // MiB} MiB)",
    )
    p.add_argument(
        "--grpc-max-concurrent-rpcs",
        type=int,
        default=_D.grpc_max_concurrent_rpcs,
        metavar="N",
        help="gRPC calls in flight, all connections together (a stream counts as one while "
        "open); more are answered UNAVAILABLE at once; health calls are never refused "
        f"(default {_D.grpc_max_concurrent_rpcs}; 0: no limit)",
    )
    p.add_argument(
        "--grpc-max-response-pool-size",
        type=_positive_int,
        default=None,
        metavar="N",
        help="a decoupled request's responses waiting for its client, at most; then the model "
        "waits in send() until the client reads one (default 16, with 32 MiB; tritonserver's "
        "default is no bound)",
    )
    add_grpc_connection_flags(p)
    _add_limit_flags(p)
    add_memory_flags(p)
    add_bool(
        p,
        "--require-manifest",
        "load a version only when its SHA256SUMS manifest lists and matches its files "
        "(default false)",
    )
    p.add_argument(
        "--model-signature",
        default="",
        metavar="METHOD:ARGS",
        help="verify OpenSSF model signatures (model.sig in a version folder) before a load: "
        "key:PUBLIC.pem, certificate:CA.pem[,MORE.pem] or sigstore:IDENTITY,ISSUER,TRUST.json "
        "(offline); a version whose signature fails is never loaded",
    )
    add_bool(
        p,
        "--require-model-signature",
        "with --model-signature: refuse a version folder without model.sig (default false)",
    )
    p.add_argument(
        "--rate-limit",
        default="off",
        type=str.lower,  # as tritonserver: OFF, EXECUTION_COUNT are accepted
        choices=("off", "execution_count"),
        help="execution_count: instances run only when their rate_limiter resources are free",
    )
    p.add_argument(
        "--rate-limit-resource",
        action="append",
        default=[],
        metavar="NAME:COUNT[:DEVICE]",
        help="a rate limiter resource and how many there are",
    )
    p.add_argument("--trace-file", default=_D.trace_file, help="where traces go (JSON lines)")
    p.add_argument(
        "--trace-level",
        default=None,
        metavar="OFF|TIMESTAMPS|TENSORS",
        help="tritonserver's words, any case: off/false, timestamps/true/on/min/max, tensors "
        f"(the inputs' and outputs' values too; default {_D.trace_level})",
    )
    p.add_argument("--trace-rate", type=int, default=_D.trace_rate, help="trace one request in N")
    p.add_argument(
        "--trace-count", type=int, default=_D.trace_count, help="stop after N traces (-1: never)"
    )
    p.add_argument(
        "--trace-log-frequency",
        type=_non_negative_int,
        default=_D.trace_log_frequency,
        metavar="N",
        help="write the traces to <trace-file>.0, .1, ... N at a time (0: all to --trace-file)",
    )
    p.add_argument(
        "--backend-config",
        action="append",
        default=[],
        metavar="[BACKEND,]SETTING=VALUE",
        help="tritonserver's backend settings, repeatable: [BACKEND,]default-max-batch-size=N "
        "(the max_batch_size auto-complete gives a model that can batch, for every backend or "
        f"one; default {_D.default_max_batch_size}); the backends' own settings are accepted "
        "with a warning",
    )
    p.add_argument(
        "--trace-config",
        action="append",
        default=[],
        metavar="[MODE,]SETTING=VALUE",
        help="tritonserver's spelling of the trace flags, repeatable: rate=N, level=LEVEL, "
        "count=N, triton,file=PATH, triton,log-frequency=N (they win over --trace-rate, ...); "
        "OpenTelemetry mode is accepted and ignored",
    )
    p.add_argument(
        "--metrics-config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="histogram_latencies=true adds nv_inference_first_response_histogram_ms; "
        "summary_latencies=true adds the nv_inference_*_summary_us summaries (quantiles of the "
        "last 60 s), summary_quantiles=Q:E,... chooses them (default "
        "0.5:0.05,0.9:0.01,0.95:0.001,0.99:0.001,0.999:0.001)",
    )
    p.add_argument(
        "--cache-config",
        action="append",
        default=[],
        metavar="local,size=BYTES",
        help="enable the response cache with a byte limit (models opt in with response_cache)",
    )
    p.add_argument("--response-cache-byte-size", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument(
        "--max-queue-wait-ms",
        type=int,
        default=None,
        metavar="MS",
        help="answer 503 / UNAVAILABLE at once when the work queued for a model would keep a "
        "new request waiting longer than this; one request per instance may always wait "
        f"(default: {_S.max_queue_wait_ms} ms or {_S.max_queue_wait_executions} of the "
        "model's measured executions, whichever is longer; 0: no limit)",
    )
    p.add_argument(
        "--inline-execution-budget-us",
        type=int,
        default=_S.inline_budget_us,
        help="run a batch on the event loop instead of a worker thread when the model's "
        "measured cost says it finishes within this many microseconds (0: never)",
    )
    p.add_argument(
        "--max-instances-per-model",
        type=_positive_int,
        default=_S.max_instances_per_model,
        metavar="N",
        help="most instances one model version may have, all instance groups and GPUs "
        "together (one thread or process each); a config or load request asking more is "
        f"refused with the reason (default {_S.max_instances_per_model})",
    )
    for flag in IGNORED_FLAGS:
        p.add_argument(
            f"--{flag}",
            dest=f"ignored_{flag}",
            default=None,
            nargs="?",
            const=True if flag in _IGNORED_BOOL else "",  # a bare boolean flag means true
            type=_ignored_type(flag),
            help=argparse.SUPPRESS,
        )


def _ignored_type(flag: str) -> type[str] | Callable[[str], object]:
    if flag in _IGNORED_BOOL:
        return parse_bool
    if flag in _IGNORED_INT:
        return integer
    if flag in _IGNORED_NUMBER:
        return float
    return str


def _verbose_level(text: str) -> int:
    """tritonserver's --log-verbose: an integer, or true (1) / false (0)."""
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return int(lowered == "true")
    return integer(text)


def _tls(args: argparse.Namespace) -> TlsSettings:
    mutual = on(args.grpc_use_ssl_mutual, False)
    tls = TlsSettings(
        grpc=on(args.grpc_use_ssl, False) or mutual,
        grpc_mutual=mutual,
        grpc_cert=args.grpc_server_cert,
        grpc_key=args.grpc_server_key,
        grpc_root=args.grpc_root_cert,
        http_cert=args.http_ssl_cert,
        http_key=args.http_ssl_key,
        http_root=args.http_ssl_root_cert,
    )
    problem = tls.problem()
    if problem:
        raise SystemExit(f"edge-appliance: {problem}")
    return tls


# The restricted-API flags' values may also come from the environment, which only root and the
# server's own user can read, where every local user can read a command line: the systemd
# unit's settings file keeps the key of the repository API there (systemd/).
RESTRICTED_FROM_ENV = {
    "--http-restricted-api": "EDGE_APPLIANCE_HTTP_RESTRICTED_API",
    "--grpc-restricted-protocol": "EDGE_APPLIANCE_GRPC_RESTRICTED_PROTOCOL",
}


def _restricted(values: list[str], flag: str) -> tuple[tuple[str, str, str], ...]:
    variable = RESTRICTED_FROM_ENV[flag]
    from_env = os.environ.get(variable, "").split()  # API,...:KEY=VALUE groups, space-separated
    try:
        parse_groups(from_env, f"${variable}")  # a mistake there is named after the variable
        groups = parse_groups(values + from_env, f"{flag} and ${variable}" if from_env else flag)
    except ValueError as exc:
        raise SystemExit(f"edge-appliance: {exc}") from None
    return tuple((api, rule.key, rule.value) for api, rule in sorted(groups.items()))


def _forward_pattern(pattern: str | None, flag: str) -> str | None:
    """The flag's pattern, checked once here: one that does not compile stops the start."""
    if pattern is not None:
        try:
            compile_pattern(pattern, flag)
        except ValueError as exc:
            raise SystemExit(f"edge-appliance: {exc}") from None
    return pattern


def default_store_dir() -> Path:
    """systemd's StateDirectory= when run as a unit, else the user's state folder."""
    state = os.environ.get("STATE_DIRECTORY", "").split(":")[0]
    if state:
        return Path(state)
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "edge-appliance"


def _fleet(args: argparse.Namespace) -> dict[str, Any]:
    """The device's fleet identity and report interval; a malformed one stops the start."""
    interval = args.fleet_report_interval
    if interval != 0 and not interval >= 30:
        raise SystemExit(
            f"edge-appliance: --fleet-report-interval must be 0 (never) or at least 30, "
            f"got {interval:g}"
        )
    try:
        device_id = args.device_id
        if device_id is not None:
            check_device_id(device_id)
        elif os.environ.get("EDGE_DEVICE_ID"):
            device_id = check_device_id(os.environ["EDGE_DEVICE_ID"], "EDGE_DEVICE_ID")
        labels = (
            parse_labels(args.device_label)
            if args.device_label
            else parse_label_text(os.environ.get("EDGE_DEVICE_LABELS", ""))
        )
    except RolloutError as exc:
        raise SystemExit(f"edge-appliance: {exc}") from None
    return {
        "device_id": device_id,
        "device_labels": tuple(labels.items()),
        "fleet_report_interval_secs": float(interval),
    }


def _host_policies(values: list[str]) -> tuple[HostPolicy, ...]:
    """--host-policy's policies, checked against this machine (its cores, its NUMA nodes)."""
    try:
        return tuple(affinity.check(policy) for policy in parse_host_policies(values))
    except HostPolicyError as exc:
        raise SystemExit(f"edge-appliance: {exc}") from None


def _config_name(value: str | None) -> str:
    if value is None:
        return ""
    try:
        return check_config_name(value)
    except ValueError as exc:
        raise SystemExit(f"edge-appliance: {exc}") from None


def _check_extras(
    remote: tuple[str, ...], public_key: Path | None, tuf_root: Path | None = None
) -> None:
    """An optional package a flag needs and that is missing stops the start in one line."""
    needs = [("aiobotocore", f"--model-repository {remote[0]}")] if remote else []
    if public_key is not None:
        needs.append(("cryptography", "--manifest-public-key"))
    if tuf_root is not None:
        needs.append(("tuf", "--model-repository-tuf-root"))
    for module, flag in needs:
        problem = extras.missing(module, flag)
        if problem:
            raise SystemExit(f"edge-appliance: {problem}")


def _repositories(given: list[str]) -> tuple[tuple[Path, ...], tuple[str, ...]]:
    """The local and remote repositories, each once: tritonserver keeps its repositories in a
    set, so a path given twice is one repository (here also two spellings of one folder),
    where two would hold every model twice."""
    local: dict[str, Path] = {}
    for path in (p for p in given if not is_remote(p)):
        local.setdefault(os.path.realpath(path), Path(path))
    return tuple(local.values()), tuple(dict.fromkeys(r for r in given if is_remote(r)))


def settings_from_args(args: argparse.Namespace) -> ServerSettings:
    if not args.model_repository:
        raise SystemExit("edge-appliance: --model-repository is required")
    ignored = tuple(
        f"--{flag}" for flag in IGNORED_FLAGS if getattr(args, f"ignored_{flag}") is not None
    ) + tuple(
        f"--metrics-config {key}"
        for key in parse_metrics_config(args.metrics_config)
        if key not in ("histogram_latencies", "summary_latencies", "summary_quantiles")
    )
    trace, ignored_trace = parse_trace_config(args.trace_config, args.trace_level)
    batch_defaults, ignored_backend = parse_backend_config(args.backend_config)
    ignored += ignored_trace + ignored_backend
    local, remote = _repositories(args.model_repository)
    if not args.repository_timeout_secs > 0:
        raise SystemExit("edge-appliance: --repository-timeout-secs must be above 0")
    ratio = args.model_rollback_latency_ratio
    if not (ratio == 0 or 1 <= ratio < float("inf")):
        raise SystemExit(
            f"edge-appliance: --model-rollback-latency-ratio must be 0 (off) or at least 1, "
            f"got {ratio:g}"
        )
    for location in remote:
        try:
            check_location(location)
        except ValueError as exc:
            raise SystemExit(f"edge-appliance: {exc}") from None
    _check_extras(remote, args.manifest_public_key, args.model_repository_tuf_root)
    try:
        parse_policy(args.model_signature, on(args.require_model_signature, False))
    except ValueError as exc:
        raise SystemExit(f"edge-appliance: {exc}") from None
    if args.model_signature and (problem := extras.missing("model_signing", "--model-signature")):
        raise SystemExit(f"edge-appliance: {problem}")
    return ServerSettings(
        model_repositories=local,
        remote_repositories=remote,
        model_store_dir=args.model_store_dir or default_store_dir(),
        model_store_reserve_bytes=(
            None if args.model_store_reserve_mb is None else args.model_store_reserve_mb * MiB
        ),
        manifest_public_key=args.manifest_public_key,
        model_repository_tuf_root=args.model_repository_tuf_root,
        download_rate_bytes_s=args.model_download_limit_mbps * 1e6 / 8,
        repository_sync_wait_secs=max(0.0, args.repository_sync_wait_secs),
        repository_timeout_secs=args.repository_timeout_secs,
        rollback_error_rate=args.model_rollback_error_rate,
        rollback_window=args.model_rollback_window,
        rollback_latency_ratio=ratio,
        **_fleet(args),
        http_address=args.http_address,
        http_port=args.http_port,
        grpc_address=args.grpc_address,
        grpc_port=args.grpc_port,
        http_unix_socket=args.http_unix_socket,
        grpc_unix_socket=args.grpc_unix_socket,
        unix_socket_mode=args.unix_socket_mode,
        http_restricted=_restricted(args.http_restricted_api, "--http-restricted-api"),
        tls=_tls(args),
        grpc_restricted=_restricted(args.grpc_restricted_protocol, "--grpc-restricted-protocol"),
        http_header_forward_pattern=_forward_pattern(
            args.http_header_forward_pattern, "--http-header-forward-pattern"
        ),
        grpc_header_forward_pattern=_forward_pattern(
            args.grpc_header_forward_pattern, "--grpc-header-forward-pattern"
        ),
        metrics_address=args.metrics_address,
        metrics_port=args.metrics_port,
        allow_http=on(args.allow_http, True),
        allow_client_shm=on(args.allow_client_shm, False),
        max_shm_regions=max(0, args.max_shm_regions),
        http_allowed_hosts=tuple(
            name.strip().lower() for name in args.http_allowed_hosts.split(",") if name.strip()
        ),
        reuse_http_port=on(args.reuse_http_port, False),
        reuse_grpc_port=on(args.reuse_grpc_port, False),
        allow_grpc=on(args.allow_grpc, True),
        allow_metrics=on(args.allow_metrics, True),
        allow_cpu_metrics=on(args.allow_cpu_metrics, True),
        allow_gpu_metrics=on(args.allow_gpu_metrics, True),
        metrics_interval_ms=max(0, round(args.metrics_interval_ms)),
        latency_histograms=parse_bool(
            parse_metrics_config(args.metrics_config).get("histogram_latencies", "false")
        ),
        latency_summaries=parse_bool(
            parse_metrics_config(args.metrics_config).get("summary_latencies", "false")
        ),
        summary_quantiles=parse_quantiles(
            parse_metrics_config(args.metrics_config).get("summary_quantiles", "")
        )
        or _D.summary_quantiles,
        strict_model_config=(
            on(args.strict_model_config, False) or on(args.disable_auto_complete_config, False)
        ),
        model_config_name=_config_name(args.model_config_name),
        model_load_threads=args.model_load_thread_count,
        model_load_retries=args.model_load_retry_count,
        model_namespacing=on(args.model_namespacing, False),
        host_policies=_host_policies(args.host_policy),
        default_max_batch_size=batch_defaults.pop("", _D.default_max_batch_size),
        backend_max_batch_sizes=tuple(sorted(batch_defaults.items())),
        server_id=args.id,
        strict_readiness=on(args.strict_readiness, False),
        exit_on_error=on(args.exit_on_error, False),
        log_verbose=args.log_verbose,
        log_info=on(args.log_info, True),
        log_warning=on(args.log_warning, True),
        log_error=on(args.log_error, True),
        log_format=args.log_format,
        log_file=args.log_file,
        model_control_mode=args.model_control_mode,
        load_models=tuple(args.load_model),
        repository_poll_secs=args.repository_poll_secs,
        exit_timeout_secs=args.exit_timeout_secs,
        max_request_bytes=args.max_request_bytes,
        grpc_max_message_bytes=args.grpc_max_message_bytes,
        grpc_max_concurrent_rpcs=max(0, args.grpc_max_concurrent_rpcs),
        max_waiting_responses=args.grpc_max_response_pool_size or 0,
        grpc_connections=grpc_connections(args),
        request_limits=RequestLimits(args.max_tensor_elements, args.max_request_tensor_bytes),
        http_connections=HttpConnectionLimits(
            max_header_bytes=args.max_request_header_bytes,
            max_headers=args.max_request_headers,
            header_timeout_secs=args.http_header_timeout_secs,
            body_timeout_secs=args.http_body_timeout_secs,
            keepalive_timeout_secs=args.http_keepalive_timeout_secs,
            max_connections=args.http_max_connections,
        ),
        scheduling=SchedulingSettings(
            inline_budget_us=args.inline_execution_budget_us,
            max_queue_wait_ms=(
                _S.max_queue_wait_ms if args.max_queue_wait_ms is None else args.max_queue_wait_ms
            ),
            # A bound the operator gives is fixed; the default grows with the model.
            max_queue_wait_executions=(
                _S.max_queue_wait_executions if args.max_queue_wait_ms is None else 0
            ),
            rate_limit=args.rate_limit == "execution_count",
            rate_limit_resources=parse_rate_limit_resources(args.rate_limit_resource),
            max_instances_per_model=args.max_instances_per_model,
        ),
        memory=memory_settings(args),
        require_manifest=on(args.require_manifest, False),
        model_signature=args.model_signature,
        require_model_signature=on(args.require_model_signature, False),
        trace_file=trace.get("trace_file", args.trace_file),
        trace_level=trace.get("trace_level", _D.trace_level),
        trace_rate=trace.get("trace_rate", args.trace_rate),
        trace_count=trace.get("trace_count", args.trace_count),
        trace_log_frequency=trace.get("trace_log_frequency", args.trace_log_frequency),
        response_cache_bytes=parse_cache_config(args.cache_config, args.response_cache_byte_size),
        ignored_flags=ignored,
    )


def _add_limit_flags(p: argparse.ArgumentParser) -> None:
    """Input limits and slow-client timeouts (defaults sized for a 4 GB device)."""
    defaults, conn = RequestLimits(), HttpConnectionLimits()
    p.add_argument(
        "--max-tensor-elements",
        type=int,
        default=defaults.max_tensor_elements,
        help="most elements in one input tensor; more: 413 / RESOURCE_EXHAUSTED "
        f"(default {defaults.max_tensor_elements}; 0: no limit)",
    )
    p.add_argument(
        "--max-request-tensor-bytes",
        type=int,
        default=defaults.max_request_tensor_bytes,
        help="most bytes of input tensors in one request (default 256 MiB; 0: no limit)",
    )
    p.add_argument(
        "--max-request-header-bytes",
        type=int,
        default=conn.max_header_bytes,
        help="longest HTTP request line or header field; longer: 400 "
        f"(default {conn.max_header_bytes})",
    )
    p.add_argument(
        "--max-request-headers",
        type=int,
        default=conn.max_headers,
        help=f"most HTTP header fields in one request (default {conn.max_headers})",
    )
    for flag, value, what in (
        ("header", conn.header_timeout_secs, "for a request's headers, from their first byte"),
        ("body", conn.body_timeout_secs, "while reading a request body, between bytes"),
        ("keepalive", conn.keepalive_timeout_secs, "for the next request on an idle connection"),
    ):
        p.add_argument(
            f"--http-{flag}-timeout-secs",
            type=float,
            default=value,
            metavar="SECS",
            help=f"close an HTTP connection after waiting this long {what} (default {value:g})",
        )
    p.add_argument(
        "--http-max-connections",
        type=int,
        default=conn.max_connections,
        help="open HTTP connections per listener; more are answered 503 and closed "
        f"(default {conn.max_connections}; 0: no limit)",
    )
