"""Trace settings: `trace_file` is set by the start-up flag only, and a refused update changes
nothing."""

from __future__ import annotations

from typing import Any

import pytest

from appliance.common.errors import ErrorCode, InvalidInput, Unsupported
from appliance.ops.trace import Tracer

REFUSED = "trace file location can not be updated through network protocol"


@pytest.mark.parametrize("model", ["", "simple"])
@pytest.mark.parametrize("value", ["/etc/cron.d/job", ["/tmp/x.log"], "/var/log/trace.jsonl", None])
def test_trace_file_cannot_be_set_by_a_client(model: str, value: Any) -> None:
    tracer = Tracer(trace_file="/var/log/trace.jsonl")
    before = tracer.settings(model)
    with pytest.raises(Unsupported, match=f"^{REFUSED}; start the server with --trace-file$"):
        tracer.update(model, {"trace_file": value})
    assert Unsupported.code is ErrorCode.UNSUPPORTED  # 501 / UNIMPLEMENTED, as tritonserver
    assert tracer.settings(model) == before


def test_a_refused_update_changes_nothing() -> None:
    tracer = Tracer(trace_file="/var/log/trace.jsonl")
    with pytest.raises(Unsupported):
        tracer.update("", {"trace_level": ["TIMESTAMPS"], "trace_file": "/tmp/elsewhere"})
    with pytest.raises(InvalidInput, match="Unable to parse 'trace_rate', got: "):
        tracer.update("simple", {"trace_level": ["TIMESTAMPS"], "trace_rate": "often"})
    assert tracer.settings()["trace_level"] == ["OFF"]
    assert tracer.settings("simple")["trace_level"] == ["OFF"]
    assert tracer.sample("simple") == 0  # still not tracing


def test_the_flags_file_is_reported_and_used() -> None:
    tracer = Tracer(trace_file="/var/log/trace.jsonl", level="OFF", rate=1)
    settings = tracer.update("simple", {"trace_level": ["TIMESTAMPS"]})
    assert settings["trace_file"] == "/var/log/trace.jsonl"
    assert tracer.sample("simple") == 1
    assert tracer.sample("other") == 0  # the global level is still OFF


def test_a_cleared_global_setting_goes_back_to_its_start_up_value() -> None:
    tracer = Tracer(trace_file="/var/log/trace.jsonl", level="TIMESTAMPS", rate=7, count=5)
    tracer.update("", {"trace_level": ["OFF"], "trace_rate": "100", "trace_count": "-1"})
    settings = tracer.update("", {"trace_level": [], "trace_rate": None, "trace_count": None})
    # tritonserver 2.51 answers so (its global defaults are the start-up flags' values).
    assert settings["trace_level"] == ["TIMESTAMPS"]
    assert (settings["trace_rate"], settings["trace_count"]) == ("7", "5")
    assert tracer.active
    assert tracer.update("", {"trace_level": None})["trace_level"] == ["TIMESTAMPS"]
    # A model's override that is cleared follows the global settings again.
    tracer.update("simple", {"trace_rate": "3"})
    assert tracer.update("simple", {"trace_rate": None})["trace_rate"] == "7"


def test_tracing_on_without_a_trace_file_is_refused_in_tritons_words() -> None:
    """tritonserver refuses a setting that would trace with no file to write to (no
    --trace-file at start); switching tracing off stays allowed."""
    tracer = Tracer()
    message = "^Attempting to set invalid trace setting :trace file name is not given$"
    for model in ("", "simple"):
        with pytest.raises(InvalidInput, match=message):
            tracer.update(model, {"trace_level": ["TIMESTAMPS"]})
    assert tracer.update("", {"trace_level": ["OFF"], "trace_rate": "5"})["trace_rate"] == "5"
    assert tracer.settings("simple")["trace_level"] == ["OFF"]
