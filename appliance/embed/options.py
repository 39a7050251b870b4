"""`Options`: Triton's server options, read into this server's settings by its own flags."""

from __future__ import annotations

import argparse
import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

from appliance.common.settings import ServerSettings
from appliance.embed.errors import InvalidArgumentError, UnsupportedError
from appliance.flags.serve import add_serve_flags, settings_from_args


class ModelControlMode(enum.IntEnum):
    """Triton's TRITONSERVER_ModelControlMode."""

    NONE = 0
    POLL = 1
    EXPLICIT = 2


class LogLevel(enum.IntEnum):
    """Triton's TRITONSERVER_LogLevel: what a `log_callback` is given with each line."""

    INFO = 0
    WARN = 1
    ERROR = 2
    VERBOSE = 3


class LogFormat(enum.IntEnum):
    DEFAULT = 0
    ISO8601 = 1


LogCallback = Callable[[LogLevel, str], None]


@dataclass
class Options:
    """Server options under Triton's names (tritonserver.Options) and defaults.

    Two more than Triton's: `log_callback` (called with each log line the levels let through,
    instead of writing it to stderr) and `server_args` (this server's own command-line flags,
    `edge-appliance serve --help`, for what Triton's options do not name: tracing, shared
    memory, limits, the model store). Options of Triton's that have no meaning here (GPU
    memory pools, backend directories, ...) are accepted at their defaults only.
    """

    model_repository: str | list[str] = field(default_factory=list)
    server_id: str = "triton"
    model_control_mode: ModelControlMode | str = ModelControlMode.NONE
    startup_models: list[str] = field(default_factory=list)
    strict_model_config: bool = False
    exit_on_error: bool = True
    strict_readiness: bool = True
    exit_timeout: int = 30
    model_load_thread_count: int = 4
    model_namespacing: bool = False
    log_file: str | None = None
    log_info: bool = False
    log_warn: bool = False
    log_error: bool = False
    log_format: LogFormat = LogFormat.DEFAULT
    log_verbose: int = 0
    metrics: bool = True
    gpu_metrics: bool = True
    cpu_metrics: bool = True
    metrics_interval: int = 2000
    cache_config: dict[str, dict[str, Any]] = field(default_factory=dict)
    backend_configuration: dict[str, dict[str, str]] = field(default_factory=dict)
    # Triton's, accepted at their defaults only (a GPU server's or a plug-in's settings).
    pinned_memory_pool_size: int = 1 << 28
    cuda_memory_pool_sizes: dict[int, int] = field(default_factory=dict)
    cache_directory: str = "/opt/tritonserver/caches"
    min_supported_compute_capability: float = 6.0
    buffer_manager_thread_count: int = 0
    enable_peer_access: bool = True
    backend_directory: str = "/opt/tritonserver/backends"
    repo_agent_directory: str = "/opt/tritonserver/repoagents"
    host_policies: dict[str, dict[str, str]] = field(default_factory=dict)
    # This server's.
    log_callback: LogCallback | None = None
    server_args: list[str] = field(default_factory=list)

    def _cascade_log_levels(self) -> None:
        """As Triton's: verbose implies info, info warnings, warnings errors."""
        if self.log_verbose > 0:
            self.log_info = True
        if self.log_info:
            self.log_warn = True
        if self.log_warn:
            self.log_error = True

    def command_line(self) -> list[str]:
        """These options as `edge-appliance serve` flags, with no listener of its own (the
        front ends are `tritonfrontend`'s to start)."""
        for name in _DEFAULTS_ONLY:
            if getattr(self, name) != _DEFAULT.get(name):
                raise UnsupportedError(f"Options.{name} has no meaning in edge-appliance")
        self._cascade_log_levels()
        if not isinstance(self.server_id, str):
            raise TypeError(f"Options.server_id must be a str, got {self.server_id!r}")
        repositories = self.model_repository
        if repositories is None:
            raise InvalidArgumentError("Model repository must be specified.")
        if not isinstance(repositories, str | list):
            raise TypeError(
                f"Options.model_repository must be a str or a list, got {repositories!r}"
            )
        if isinstance(repositories, str):
            repositories = [repositories]
        if not repositories:
            raise InvalidArgumentError("Model repository must be specified.")
        mode = self.model_control_mode
        mode_name = mode.name.lower() if isinstance(mode, ModelControlMode) else str(mode)
        argv = [arg for path in repositories for arg in ("--model-repository", str(path))]
        argv += ["--model-control-mode", mode_name, "--id", self.server_id]
        argv += [arg for name in self.startup_models for arg in ("--load-model", name)]
        argv += [
            f"--strict-model-config={_bool(self.strict_model_config)}",
            f"--exit-on-error={_bool(self.exit_on_error)}",
            f"--strict-readiness={_bool(self.strict_readiness)}",
            "--exit-timeout-secs", str(self.exit_timeout),
            "--model-load-thread-count", str(self.model_load_thread_count),
            f"--model-namespacing={_bool(self.model_namespacing)}",
            f"--log-info={_bool(self.log_info)}",
            f"--log-warning={_bool(self.log_warn)}",
            f"--log-error={_bool(self.log_error)}",
            "--log-verbose", str(self.log_verbose),
            "--log-format", "ISO8601" if self.log_format == LogFormat.ISO8601 else "default",
            "--allow-http=false", "--allow-grpc=false", "--allow-metrics=false",
            f"--allow-gpu-metrics={_bool(self.metrics and self.gpu_metrics)}",
            f"--allow-cpu-metrics={_bool(self.metrics and self.cpu_metrics)}",
            "--metrics-interval-ms", str(self.metrics_interval),
        ]  # fmt: skip
        if self.log_file:
            argv += ["--log-file", self.log_file]
        for cache, values in self.cache_config.items():
            argv += ["--cache-config", ",".join([cache, *(f"{k}={v}" for k, v in values.items())])]
        for backend, values in self.backend_configuration.items():
            for key, value in values.items():
                argv += ["--backend-config", f"{backend},{key}={value}"]
        return argv + list(self.server_args)


_DEFAULTS_ONLY = (
    "pinned_memory_pool_size",
    "cuda_memory_pool_sizes",
    "cache_directory",
    "min_supported_compute_capability",
    "buffer_manager_thread_count",
    "enable_peer_access",
    "backend_directory",
    "repo_agent_directory",
    "host_policies",
)
_DEFAULT = {name: getattr(Options(), name) for name in _DEFAULTS_ONLY}


def _bool(value: bool) -> str:
    return "true" if value else "false"


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of printing and exiting."""

    def error(self, message: str) -> NoReturn:
        raise InvalidArgumentError(message)


def parse_settings(argv: Sequence[str]) -> ServerSettings:
    """`edge-appliance serve`'s flags -> settings, each problem an InvalidArgumentError."""
    parser = _Parser(prog="tritonserver.Options", add_help=False)
    add_serve_flags(parser)
    try:
        return settings_from_args(parser.parse_args(list(argv)))
    except SystemExit as exc:  # the flags' own checks stop a command line so
        message = str(exc.code).removeprefix("edge-appliance: ")
        raise InvalidArgumentError(message) from None
