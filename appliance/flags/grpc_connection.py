"""tritonserver's gRPC connection flags for `edge-appliance serve`: keepalive, connection age
and infer-response compression, with its defaults, into one GrpcConnectionSettings (app.py
turns it into the server's channel arguments)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from appliance.common.settings import GrpcConnectionSettings
from appliance.flags.values import add_bool, integer, on

_DEFAULTS = GrpcConnectionSettings()

# tritonserver's gRPC connection flags in milliseconds or counts (src/command_line_parser.cc),
# each the field of GrpcConnectionSettings and the gRPC channel argument of the same name:
# flag -> (field, smallest value, help).
_GRPC_CONNECTION_FLAGS = {
    "grpc-keepalive-time": (
        "keepalive_time_ms",
        1,
        "milliseconds after which the server pings a connection that has calls open; "
        "a client that vanished without closing it is noticed this way",
    ),
    "grpc-keepalive-timeout": (
        "keepalive_timeout_ms",
        1,
        "milliseconds a ping may go unanswered before the connection and its calls are closed",
    ),
    "grpc-http2-max-pings-without-data": (
        "http2_max_pings_without_data",
        0,
        "pings sent with no data sent between them (0: any number; gRPC core reads it on "
        "clients only: passed on as tritonserver does)",
    ),
    "grpc-http2-min-recv-ping-interval-without-data": (
        "http2_min_recv_ping_interval_without_data_ms",
        0,
        "milliseconds: a client's pings closer than this with no data between them are strikes",
    ),
    "grpc-http2-max-ping-strikes": (
        "http2_max_ping_strikes",
        0,
        "strikes after which a connection is closed with GOAWAY (0: any number)",
    ),
    "grpc-max-connection-age": (
        "max_connection_age_ms",
        0,
        "milliseconds after which a connection is sent GOAWAY: its clients reconnect (0: never)",
    ),
    "grpc-max-connection-age-grace": (
        "max_connection_age_grace_ms",
        0,
        "milliseconds the calls open at GOAWAY may still run before the connection is closed "
        "(0: not set, they run to their end)",
    ),
}


COMPRESSION_LEVELS = ("none", "low", "medium", "high")


def add_grpc_connection_flags(p: argparse.ArgumentParser) -> None:
    """tritonserver's gRPC keepalive, connection-age and compression flags, its defaults."""
    defaults = _DEFAULTS
    for flag, (name, minimum, what) in _GRPC_CONNECTION_FLAGS.items():
        value = getattr(defaults, name)
        p.add_argument(
            f"--{flag}",
            type=_bounded_int(minimum),
            default=value,
            metavar="MS" if name.endswith("_ms") else "N",
            help=f"{what} (default {value})",
        )
    add_bool(
        p,
        "--grpc-keepalive-permit-without-calls",
        "also ping connections with no call open (default false)",
    )
    p.add_argument(
        "--grpc-infer-response-compression-level",
        type=str.lower,  # tritonserver lowercases it
        choices=COMPRESSION_LEVELS,
        default=defaults.infer_compression_level,
        help="compress ModelInfer and ModelStreamInfer responses, no other RPC's: gzip at "
        "every level (default none)",
    )


def grpc_connections(args: argparse.Namespace) -> GrpcConnectionSettings:
    values = {
        name: getattr(args, flag.replace("-", "_"))
        for flag, (name, _, _) in _GRPC_CONNECTION_FLAGS.items()
    }
    return GrpcConnectionSettings(
        **values,
        keepalive_permit_without_calls=on(
            args.grpc_keepalive_permit_without_calls,
            _DEFAULTS.keepalive_permit_without_calls,
        ),
        infer_compression_level=args.grpc_infer_response_compression_level,
    )


def _bounded_int(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = integer(text)
        if not minimum <= value <= INT32_MAX:
            raise argparse.ArgumentTypeError(
                f"expected a whole number from {minimum} to {INT32_MAX}, got {value}"
            )
        return value

    return parse


INT32_MAX = 2**31 - 1  # tritonserver reads these flags as C ints; gRPC's channel args are ints
