"""The notify protocol's pieces: the datagram client, the watchdog's decisions, STATUS."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from appliance.ops.notify import (
    Notifier,
    bootloader_pid,
    status_text,
    watchdog_interval_s,
    watchdog_verdict,
)
from appliance.scheduling.base import stalled_reason

S = 1_000_000_000


def _receiver(address: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(address)
    sock.settimeout(2)
    return sock


def test_sends_to_a_socket_path(tmp_path: Path) -> None:
    path = str(tmp_path / "notify")
    with _receiver(path) as sock:
        notifier = Notifier.from_env({"NOTIFY_SOCKET": path})
        assert notifier.enabled
        notifier.ready("serving")
        assert sock.recv(100) == b"READY=1\nSTATUS=serving"
        notifier.stopping_now()
        assert sock.recv(100).startswith(b"STOPPING=1\nSTATUS=stopping")
        notifier.ready("again")  # never READY once stopping
        assert notifier.send("WATCHDOG=1")
        assert sock.recv(100) == b"WATCHDOG=1"
        notifier.close()


def test_sends_to_an_abstract_socket() -> None:
    name = f"edge-appliance-test-{os.getpid()}"
    with _receiver("\0" + name) as sock:
        notifier = Notifier(f"@{name}")
        assert notifier.send("WATCHDOG=1")
        assert sock.recv(100) == b"WATCHDOG=1"
        notifier.close()


def test_without_a_socket_nothing_is_sent_and_nothing_raises(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert not Notifier.from_env({}).enabled
    assert not Notifier.from_env({}).send("READY=1")
    gone = Notifier(str(tmp_path / "missing"))
    assert not gone.send("WATCHDOG=1")
    assert not gone.send("WATCHDOG=1")
    assert len([r for r in caplog.records if "cannot notify systemd" in r.message]) == 1


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, 0.0),
        ({"WATCHDOG_USEC": "3000000"}, 3.0),
        ({"WATCHDOG_USEC": "3000000", "WATCHDOG_PID": "42"}, 3.0),
        ({"WATCHDOG_USEC": "3000000", "WATCHDOG_PID": "43"}, 0.0),  # meant for another process
        ({"WATCHDOG_USEC": "0"}, 0.0),
        ({"WATCHDOG_USEC": "soon"}, 0.0),
    ],
)
def test_watchdog_interval(env: dict[str, str], expected: float) -> None:
    assert watchdog_interval_s(env, 42) == expected


def test_verdict_fails_on_loop_lag_or_stalled_versions() -> None:
    assert watchdog_verdict(0.01, 2.0, []) == ""
    assert watchdog_verdict(1.9, 2.0, []) == ""
    assert watchdog_verdict(2.5, 2.0, []).startswith("event loop lagging 2.50 s")
    assert watchdog_verdict(0.0, 2.0, ["a: stuck", "b: stuck"]) == "a: stuck; b: stuck"


def test_stalled_only_when_every_instance_is_stuck_or_a_thread_died() -> None:
    now = 100 * S
    label = "model 'm' version 1"
    assert stalled_reason(label, [], now, 2 * S) == ""  # an ensemble: no instances
    assert stalled_reason(label, [(True, 0), (True, 0)], now, 2 * S) == ""  # idle
    assert stalled_reason(label, [(True, 90 * S), (True, 0)], now, 2 * S) == ""  # one of two
    assert stalled_reason(label, [(True, 99 * S), (True, 90 * S)], now, 2 * S) == ""  # 1 s
    assert stalled_reason(label, [(True, 97 * S), (True, 90 * S)], now, 2 * S) == (
        "model 'm' version 1: every instance (2) has been in one execution for over 3.0 s"
    )
    assert stalled_reason(label, [(False, 0), (True, 0)], now, 2 * S) == (
        "model 'm' version 1: 1 of 2 instance threads exited"
    )


def test_status_text() -> None:
    assert (
        status_text(7, 6, 120, [("HTTP", 8000), ("gRPC", 8001)])
        == "serving 7 models (6 ready), 120 requests served; HTTP :8000 gRPC :8001"
    )
    assert status_text(1, 1, 0, [("HTTP", None)]) == "serving 1 model (1 ready), 0 requests served"


def test_a_one_file_build_feeds_its_bootloaders_watchdog() -> None:
    env = {"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "7"}
    assert watchdog_interval_s(env, 42) == 0.0  # someone else's watchdog
    assert watchdog_interval_s(env, 42, stand_in=7) == 2.0  # our bootloader's
    assert bootloader_pid() is None  # not frozen here
