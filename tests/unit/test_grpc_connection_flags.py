"""tritonserver's gRPC keepalive, connection-age and compression flags: Triton's defaults
(server repository, src/grpc/grpc_server.h KeepAliveOptions, src/command_line_parser.cc), the
gRPC channel arguments each becomes, and bad values refused at start naming the flag. What
they do to connections: tests/integration/test_grpc_keepalive.py."""

from __future__ import annotations

import pytest

from appliance.common.settings import GrpcConnectionSettings, ServerSettings
from appliance.face.cli import build_parser
from appliance.flags.serve import settings_from_args
from appliance.server.app import _connection_options

FLAGS = (
    "--grpc-keepalive-time",
    "--grpc-keepalive-timeout",
    "--grpc-keepalive-permit-without-calls",
    "--grpc-http2-max-pings-without-data",
    "--grpc-http2-min-recv-ping-interval-without-data",
    "--grpc-http2-max-ping-strikes",
    "--grpc-max-connection-age",
    "--grpc-max-connection-age-grace",
    "--grpc-infer-response-compression-level",
)


def _settings(*flags: str) -> ServerSettings:
    args = build_parser().parse_args(["serve", "--model-repository", "/models", *flags])
    return settings_from_args(args)


def test_the_defaults_are_tritons_and_become_its_channel_arguments() -> None:
    settings = _settings()
    assert settings.grpc_connections == GrpcConnectionSettings(
        keepalive_time_ms=7_200_000,
        keepalive_timeout_ms=20_000,
        keepalive_permit_without_calls=False,
        http2_max_pings_without_data=2,
        http2_min_recv_ping_interval_without_data_ms=300_000,
        http2_max_ping_strikes=2,
        max_connection_age_ms=0,
        max_connection_age_grace_ms=0,
        infer_compression_level="none",
    )
    # tritonserver sets the keepalive ones always, the connection age only when not 0.
    assert dict(_connection_options(settings.grpc_connections)) == {
        "grpc.keepalive_time_ms": 7_200_000,
        "grpc.keepalive_timeout_ms": 20_000,
        "grpc.http2.ping_timeout_ms": 20_000,
        "grpc.keepalive_permit_without_calls": 0,
        "grpc.http2.max_pings_without_data": 2,
        "grpc.http2.min_ping_interval_without_data_ms": 300_000,
        "grpc.http2.max_ping_strikes": 2,
    }


def test_given_values_reach_their_channel_arguments_and_are_not_ignored() -> None:
    settings = _settings(
        "--grpc-keepalive-time=10000",
        "--grpc-keepalive-timeout",
        "3000",
        "--grpc-keepalive-permit-without-calls",  # bare: true
        "--grpc-http2-max-pings-without-data=0",
        "--grpc-http2-min-recv-ping-interval-without-data=5000",
        "--grpc-http2-max-ping-strikes=0",
        "--grpc-max-connection-age=600000",
        "--grpc-max-connection-age-grace=30000",
        "--grpc-infer-response-compression-level=HIGH",  # tritonserver lowercases it
    )
    assert not set(FLAGS) & set(settings.ignored_flags)
    assert settings.grpc_connections.infer_compression_level == "high"
    assert dict(_connection_options(settings.grpc_connections)) == {
        "grpc.keepalive_time_ms": 10_000,
        "grpc.keepalive_timeout_ms": 3_000,
        "grpc.http2.ping_timeout_ms": 3_000,
        "grpc.keepalive_permit_without_calls": 1,
        "grpc.http2.max_pings_without_data": 0,
        "grpc.http2.min_ping_interval_without_data_ms": 5_000,
        "grpc.http2.max_ping_strikes": 0,
        "grpc.max_connection_age_ms": 600_000,
        "grpc.max_connection_age_grace_ms": 30_000,
    }


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("--grpc-keepalive-time=0", "expected a whole number from 1 to 2147483647, got 0"),
        ("--grpc-keepalive-time=2h", "expected a whole number, got '2h'"),
        ("--grpc-keepalive-time=1.5", "expected a whole number, got '1.5'"),
        ("--grpc-keepalive-timeout=-1", "from 1 to 2147483647, got -1"),
        ("--grpc-http2-max-pings-without-data=-2", "from 0 to 2147483647, got -2"),
        ("--grpc-http2-min-recv-ping-interval-without-data=x", "expected a whole number"),
        ("--grpc-http2-max-ping-strikes=-1", "from 0 to 2147483647, got -1"),
        ("--grpc-max-connection-age=2147483648", "from 0 to 2147483647, got 2147483648"),
        ("--grpc-max-connection-age-grace=-30", "from 0 to 2147483647, got -30"),
        ("--grpc-keepalive-permit-without-calls=maybe", "expected true or false, got 'maybe'"),
        ("--grpc-infer-response-compression-level=max", "invalid choice: 'max'"),
    ],
)
def test_a_bad_value_stops_the_start_naming_the_flag(
    flag: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        _settings(flag)
    err = capsys.readouterr().err
    assert f"error: argument {flag.partition('=')[0]}: " in err
    assert message in err
