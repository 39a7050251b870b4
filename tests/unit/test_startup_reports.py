"""The pure parts of issue 37's start-up reports: the ready summary, the failing sources'
problems, and the port checks of server/preflight.py (on real loopback sockets)."""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass

import pytest

from appliance.server.app import ready_summary
from appliance.server.listeners import ConfigurationError, StartupError
from appliance.server.preflight import check_ports
from appliance.services.control import source_problems
from appliance.services.results import IndexRow


def test_ready_summary_counts_models_once_and_names_the_ones_not_ready() -> None:
    rows = [
        IndexRow("a", 1, "UNAVAILABLE", "version 1 failed"),
        IndexRow("a", 2, "READY", ""),  # a serves: its failed version does not count
        IndexRow("b", 1, "READY", ""),
        IndexRow("c", None, "UNAVAILABLE", "no such file"),
        IndexRow("d", 3, "", "waiting for disk"),
    ]
    assert ready_summary(rows) == (
        "2 of 4 models ready, 2 not ready: c (no such file), d (waiting for disk)"
    )
    assert ready_summary([IndexRow("b", 1, "READY", "")]) == "1 of 1 model ready"
    assert ready_summary([]) == "0 of 0 models ready"


@dataclass
class _Source:
    url: str
    reachable: bool | None
    last_error: str
    frozen_since_s: float = 0.0


def test_only_sources_whose_last_sync_failed_are_problems_and_without_credentials() -> None:
    sources = [
        _Source("s3://key:secret@host/bucket/models", False, "bucket 'bucket' does not exist"),
        _Source("s3://host/fine/models", True, ""),
        _Source("s3://host/first/models", None, ""),  # not synced yet
    ]
    problems = source_problems(sources)
    assert len(problems) == 1
    assert "s3://host/bucket/models unreachable: bucket 'bucket' does not exist" in problems[0]
    assert "secret" not in problems[0]


def test_a_port_held_by_another_socket_is_in_use_and_retried() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        with pytest.raises(StartupError) as raised:
            check_ports([("grpc", "127.0.0.1", port, False)])
    assert not isinstance(raised.value, ConfigurationError)  # exit 1: systemd tries again
    assert str(raised.value).startswith(f"--grpc-port {port}: 127.0.0.1:{port} is already in use")


def test_two_listeners_on_one_port_are_refused() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(StartupError, match=f"--metrics-port {port}"):
        check_ports([("http", "127.0.0.1", port, False), ("metrics", "127.0.0.1", port, False)])


def test_an_address_that_is_not_this_machines_names_the_address_flag() -> None:
    with pytest.raises(StartupError, match=re.escape("--http-address 'no-such-host.invalid'")):
        check_ports([("http", "no-such-host.invalid", 8000, False)])
