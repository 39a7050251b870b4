"""The shutdown deadline and the line that ends a shutdown: plain data, a fake clock."""

from __future__ import annotations

import logging
import re
from pathlib import Path

from appliance.common.settings import ServerSettings
from appliance.server.shutdown import CANCEL_GRACE_S, FORCE_AFTER_S, Deadline, shutdown_summary

ROOT = Path(__file__).resolve().parents[2]


def test_deadline_counts_down_from_the_signal_and_never_below_zero() -> None:
    deadline = Deadline.starting(4.0, now_s=100.0)
    assert deadline.at_s == 104.0
    assert deadline.remaining_s(100.0) == 4.0
    assert deadline.remaining_s(103.25) == 0.75
    assert deadline.remaining_s(110.0) == 0.0


def test_cut_off_and_backstop_come_after_the_deadline_in_that_order() -> None:
    deadline = Deadline.starting(4.0, now_s=0.0)
    assert deadline.at_s < deadline.cut_at_s < deadline.force_at_s
    assert deadline.until_cut_s(4.0) == CANCEL_GRACE_S
    assert deadline.until_force_s(4.0) == FORCE_AFTER_S
    assert deadline.until_cut_s(9.0) == 0.0
    assert deadline.until_force_s(9.0) == 0.0
    # Everything ends within 2 s of the deadline (the bound the service unit is set by).
    assert FORCE_AFTER_S < 2.0


def test_a_negative_timeout_means_now() -> None:
    deadline = Deadline.starting(-1.0, now_s=5.0)
    assert deadline.remaining_s(5.0) == 0.0
    assert deadline.at_s == 5.0


def test_summary_of_a_clean_shutdown() -> None:
    level, line = shutdown_summary(Deadline.starting(30.0, now_s=0.0), 0.42, [])
    assert level == logging.INFO
    assert line == "shutdown complete in 0.4 s: every in-flight request finished"


def test_summary_counts_and_names_what_was_cancelled() -> None:
    lines = [
        "model 'a' version 1: 1 request(s) cancelled",
        "model 'b' version 2: 3 request(s) cancelled",
        "HTTP: closed 1 connection(s) still busy",
    ]
    level, line = shutdown_summary(Deadline.starting(4.0, now_s=10.0), 15.04, lines)
    assert level == logging.WARNING
    assert line == (
        "shutdown complete in 5.0 s; cancelled work left at the 4 s deadline in 3 place(s): "
        "model 'a' version 1: 1 request(s) cancelled; model 'b' version 2: 3 request(s) "
        "cancelled; HTTP: closed 1 connection(s) still busy"
    )


def test_summary_names_model_processes_that_had_to_be_killed() -> None:
    level, line = shutdown_summary(
        Deadline.starting(4.0, now_s=0.0), 4.6, [], ["python-model-m_0_0 (pid 12)"]
    )
    assert level == logging.WARNING
    assert line.endswith("killed 1 model process(es) still running: python-model-m_0_0 (pid 12)")


def test_the_service_unit_gives_a_stop_more_time_than_the_server_takes() -> None:
    """systemd kills the whole service at TimeoutStopSec; the server ends by itself at the
    latest FORCE_AFTER_S past its deadline: the unit and the default deadline must agree."""
    unit = (ROOT / "systemd" / "edge-appliance.service").read_text()
    match = re.search(r"^TimeoutStopSec=(\d+)s$", unit, re.MULTILINE)
    assert match, "TimeoutStopSec=<n>s in the unit"
    stop_s = int(match.group(1))
    exit_timeout_s = ServerSettings(model_repositories=()).exit_timeout_secs
    assert exit_timeout_s + 2 <= stop_s, (exit_timeout_s, stop_s)
    assert (
        f"--exit-timeout-secs ({exit_timeout_s:g})"
        in (ROOT / "systemd" / "edge-appliance.env.example").read_text()
    )
    assert (
        f"TimeoutStopSec ({stop_s} s)"
        in (ROOT / "systemd" / "edge-appliance.env.example").read_text()
    )
