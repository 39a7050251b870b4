"""Every flag of tritonserver's --help (server repository, src/command_line_parser.cc) is
accepted by `serve`: implemented, or accepted with a warning; a value tritonserver refuses is
still refused."""

from __future__ import annotations

import os
import re

import pytest

from appliance.common.settings import ServerSettings
from appliance.face.cli import build_parser
from appliance.flags.serve import settings_from_args
from appliance.runtime.settings import RuntimeSettings

# tritonserver's flags, each with a value tritonserver accepts.
TRITONSERVER_FLAGS = {
    "allow-client-shm": "true",
    "allow-cpu-metrics": "true",
    "allow-gpu-metrics": "false",
    "allow-grpc": "true",
    "allow-http": "true",
    "allow-metrics": "true",
    "allow-sagemaker": "false",
    "allow-vertex-ai": "false",
    "backend-config": "python,shm-default-byte-size=1048576",
    "backend-directory": "/opt/tritonserver/backends",
    "buffer-manager-thread-count": "0",
    "cache-config": "local,size=1048576",
    "cache-directory": "/opt/tritonserver/caches",
    "cuda-memory-pool-byte-size": "0:67108864",
    "cuda-virtual-address-size": "0:1073741824",
    "disable-auto-complete-config": None,  # takes no value
    "enable-peer-access": "true",
    "exit-on-error": "true",
    "exit-timeout-secs": "30",
    "grpc-address": "0.0.0.0",
    "grpc-header-forward-pattern": "^x-.*",
    "grpc-http2-max-ping-strikes": "2",
    "grpc-http2-max-pings-without-data": "2",
    "grpc-http2-min-recv-ping-interval-without-data": "300000",
    "grpc-infer-allocation-pool-size": "8",
    "grpc-infer-response-compression-level": "none",
    "grpc-infer-thread-count": "2",
    "grpc-keepalive-permit-without-calls": "false",
    "grpc-keepalive-time": "7200000",
    "grpc-keepalive-timeout": "20000",
    "grpc-max-connection-age": "0",
    "grpc-max-connection-age-grace": "0",
    "grpc-max-response-pool-size": "8",
    "grpc-port": "8001",
    "grpc-restricted-protocol": "model-repository:admin-key=secret",
    "grpc-use-ssl": "false",
    "grpc-use-ssl-mutual": "false",
    "host-policy": "gpu0,numa-node=0",
    "http-address": "0.0.0.0",
    "http-header-forward-pattern": "^x-.*",
    "http-max-input-size": "67108864",
    "http-port": "8000",
    "http-restricted-api": "model-repository:admin-key=secret",
    "http-thread-count": "8",
    "id": "device-7",
    "load-model": "simple",
    "log-error": "true",
    "log-file": "",
    "log-format": "default",
    "log-info": "true",
    "log-verbose": "true",
    "log-warning": "true",
    "metrics-address": "0.0.0.0",
    "metrics-config": "summary_latencies=true",
    "metrics-interval-ms": "2000.5",
    "metrics-port": "8002",
    "min-supported-compute-capability": "6.0",
    "model-config-name": "production",
    "model-control-mode": "explicit",
    "model-load-gpu-limit": "0:0.8",
    "model-load-retry-count": "0",
    "model-load-thread-count": "4",
    "model-namespacing": "false",
    "model-repository": "/models",
    "model-store": "/models",
    "pinned-memory-pool-byte-size": "268435456",
    "rate-limit": "off",
    "rate-limit-resource": "R1:10",
    "repoagent-directory": "/opt/tritonserver/repoagents",
    "repository-poll-secs": "15",
    "response-cache-byte-size": "0",
    "reuse-grpc-port": "false",
    "reuse-http-port": "false",
    "sagemaker-port": "8080",
    "sagemaker-safe-port-range": "8000-9000",
    "sagemaker-thread-count": "8",
    "strict-model-config": "false",
    "strict-readiness": "true",
    "trace-config": "rate=1000",
    "trace-count": "-1",
    "trace-file": "/tmp/trace.json",
    "trace-level": "OFF",
    "trace-log-frequency": "0",
    "trace-rate": "1000",
    "vertex-ai-default-model": "simple",
    "vertex-ai-port": "8080",
    "vertex-ai-thread-count": "8",
}


def _settings(*flags: str) -> ServerSettings:
    parser = build_parser()
    args = parser.parse_args(["serve", "--model-repository", "/models", *flags])
    return settings_from_args(args)


@pytest.mark.parametrize("flag", sorted(TRITONSERVER_FLAGS))
@pytest.mark.parametrize("spelling", ["equals", "space"])
def test_every_tritonserver_flag_is_accepted(flag: str, spelling: str) -> None:
    value = TRITONSERVER_FLAGS[flag]
    if value is None:
        _settings(f"--{flag}")
    elif spelling == "equals":
        _settings(f"--{flag}={value}")
    else:
        _settings(f"--{flag}", value)


def test_a_whole_tritonserver_command_line() -> None:
    line = [f"--{f}={v}" for f, v in TRITONSERVER_FLAGS.items() if v is not None]
    settings = _settings(*line, "--disable-auto-complete-config")
    ignored = set(settings.ignored_flags)
    assert "--grpc-infer-thread-count" in ignored
    assert settings.allow_client_shm  # --allow-client-shm=true
    assert "--backend-directory" in ignored
    assert "--model-config-name" not in ignored
    assert settings.model_config_name == "production"
    assert settings.server_id == "device-7"
    assert "--backend-config python,shm-default-byte-size=1048576" in ignored  # each entry
    assert "--model-load-thread-count" not in ignored
    assert RuntimeSettings.from_server(settings).load_concurrency == 4
    assert "--http-max-input-size" not in ignored  # --max-request-bytes
    assert settings.max_request_bytes == 67108864
    assert settings.strict_model_config  # --disable-auto-complete-config
    assert settings.metrics_interval_ms == 2000
    assert settings.log_verbose == 1  # --log-verbose=true


def test_backend_config_sets_the_default_max_batch_size() -> None:
    settings = _settings(
        "--backend-config=default-max-batch-size=16",
        "--backend-config=onnxruntime,default-max-batch-size=8",  # one backend's own
        "--backend-config=onnxruntime,enable-global-threadpool=1",
    )
    assert settings.default_max_batch_size == 16
    assert settings.backend_max_batch_sizes == (("onnxruntime", 8),)
    runtime = RuntimeSettings.from_server(settings)
    assert runtime.default_max_batch_sizes == {"": 16, "onnxruntime": 8}
    assert settings.ignored_flags == ("--backend-config onnxruntime,enable-global-threadpool=1",)
    assert _settings().default_max_batch_size == 4  # tritonserver's default
    assert RuntimeSettings.from_server(_settings()).default_max_batch_sizes == {"": 4}


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("default-max-batch-size", "expects \\[BACKEND,\\]SETTING=VALUE"),
        (",default-max-batch-size=4", "expects \\[BACKEND,\\]SETTING=VALUE"),
        ("default-max-batch-size=-1", "must be an integer >= 0"),
        ("default-max-batch-size=many", "must be an integer >= 0"),
    ],
)
def test_a_backend_config_tritonserver_refuses_is_refused(value: str, words: str) -> None:
    with pytest.raises(SystemExit, match=words):
        _settings(f"--backend-config={value}")


@pytest.mark.parametrize(
    "flag",
    [
        "--http-thread-count=many",
        "--allow-client-shm=perhaps",
        "--grpc-keepalive-time=1.5",
        "--min-supported-compute-capability=high",
        "--log-verbose=loud",
        "--http-port=eighty",
        "--grpc-max-response-pool-size=0",  # "must be greater than 0"
    ],
)
def test_a_value_tritonserver_refuses_is_refused(
    flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        _settings(flag)
    assert "error: argument" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("", "empty argument for --model-config-name"),
        ("two words", "must not contain spaces"),
        ("../escape", "not a path"),
        ("sub/name", "not a path"),
        ("..", "not a path"),
    ],
)
def test_a_model_config_name_that_cannot_name_a_file_is_refused(value: str, words: str) -> None:
    with pytest.raises(SystemExit, match=words):
        _settings(f"--model-config-name={value}")


def test_trace_config_sets_the_trace_flags_as_tritonserver_does() -> None:
    settings = _settings(
        "--trace-rate=1000",
        "--trace-config=rate=50",  # wins over the deprecated flag, as in tritonserver
        "--trace-config",
        "level=TIMESTAMPS",
        "--trace-config=count=7",
        "--trace-config=triton,file=/var/log/trace.json",
        "--trace-config=triton,log-frequency=50",
        "--trace-config=mode=triton",
    )
    assert (settings.trace_rate, settings.trace_count) == (50, 7)
    assert settings.trace_level == "TIMESTAMPS"
    assert settings.trace_file == "/var/log/trace.json"
    assert settings.trace_log_frequency == 50
    assert settings.ignored_flags == ()
    assert _settings("--trace-log-frequency=20").trace_log_frequency == 20
    with pytest.raises(SystemExit):
        _settings("--trace-config=triton,log-frequency=-1")
    # Levels combine; OFF alone turns tracing off.
    assert _settings("--trace-config=level=OFF", "--trace-config=level=TIMESTAMPS").trace_level == (
        "TIMESTAMPS"
    )
    # As there: levels combine, and the deprecated --trace-level=OFF turns tracing off.
    assert _settings("--trace-level=TIMESTAMPS", "--trace-config=level=OFF").trace_level == (
        "TIMESTAMPS"
    )
    assert _settings("--trace-level=off", "--trace-config=level=TIMESTAMPS").trace_level == "OFF"
    tensors = _settings("--trace-level=tensors")
    assert tensors.trace_level == "TENSORS"
    assert tensors.ignored_flags == ()
    both = _settings("--trace-config=level=TENSORS", "--trace-config=level=TIMESTAMPS")
    assert both.trace_level == "TIMESTAMPS,TENSORS"  # the trace setting's ["TIMESTAMPS", "TENSORS"]
    assert _settings("--trace-level=true").trace_level == "TIMESTAMPS"  # tritonserver's words
    assert _settings().trace_level == "OFF"
    otel = _settings("--trace-config=mode=opentelemetry", "--trace-config=opentelemetry,url=x:4318")
    assert otel.ignored_flags == (
        "--trace-config mode=opentelemetry",
        "--trace-config opentelemetry,url=x:4318",
    )


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("rate", "expects \\[MODE,\\]SETTING=VALUE"),
        (",rate=5", "expects \\[MODE,\\]SETTING=VALUE"),
        ("jaeger,url=x", "expects \\[MODE,\\]SETTING=VALUE"),
        ("mode=zipkin", "expects \\[MODE,\\]SETTING=VALUE"),
        ("rate=", "expects \\[MODE,\\]SETTING=VALUE"),
        ("rate=often", "rate must be an integer"),
        ("level=LOUD", "invalid value for trace level option: LOUD"),
    ],
)
def test_a_trace_config_tritonserver_refuses_is_refused(value: str, words: str) -> None:
    with pytest.raises(SystemExit, match=words):
        _settings(f"--trace-config={value}")


def test_client_shared_memory_is_off_unless_allowed() -> None:
    """tritonserver's default since April 2026; a bare flag means true, as other booleans."""
    assert _settings().allow_client_shm is False
    assert _settings("--allow-client-shm").allow_client_shm is True
    assert _settings("--allow-client-shm=false").allow_client_shm is False


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("cpu", "--host-policy option format is '<policy name>,<setting>=<value>'. Got cpu"),
        ("cpu,cpu-cores", "format is '<policy name>,<setting>=<value>'"),
        (",cpu-cores=0-1", "format is '<policy name>,<setting>=<value>'"),
        ("cpu,cpu-cores=", "format is '<policy name>,<setting>=<value>'"),
        ("cpu,pinned=1", "unknown setting 'pinned' (tritonserver's are cpu-cores and numa-node)"),
        ("cpu,cpu-cores=a-b", "'cpu-cores' format is '<lower_cpu_core_id>-<upper_cpu_core_id>'"),
        ("cpu,cpu-cores=3-1", "'3-1' is not a range of core numbers"),
        ("cpu,numa-node=one", "Parsing 'numa-node' value: Can't parse 'one' to integer"),
        ("cpu,cpu-cores=4096-4097", "none of cpu-cores 4096-4097 is available to the server"),
        ("cpu,numa-node=999", "numa-node 999"),
    ],
)
def test_a_host_policy_that_cannot_apply_is_refused_at_start(value: str, words: str) -> None:
    with pytest.raises(SystemExit, match=re.escape(words)):
        _settings(f"--host-policy={value}")


def test_host_policies_merge_their_settings_by_name() -> None:
    allowed = sorted(os.sched_getaffinity(0))
    core = allowed[-1]
    settings = _settings(
        f"--host-policy=cpu,cpu-cores={core}-{core}",
        "--host-policy=cpu,numa-node=0",
        f"--host-policy=fast,cpu-cores={allowed[0]},{core}",
    )
    policies = RuntimeSettings.from_server(settings).host_policies
    assert sorted(policies) == ["cpu", "fast"]
    assert policies["cpu"].cpu_cores == {core}
    assert policies["fast"].cpu_cores == {allowed[0], core}
    assert policies["fast"].numa_node is None
    assert "--host-policy" not in settings.ignored_flags


def test_the_response_pool_size_bounds_a_decoupled_request() -> None:
    assert _settings("--grpc-max-response-pool-size=3").max_waiting_responses == 3
    assert _settings().max_waiting_responses == 0  # services/inference.py's default
