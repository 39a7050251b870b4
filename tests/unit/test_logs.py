"""Log settings: validation of the logging extension's values, levels, formats, the journal."""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from appliance.common.errors import InvalidInput, Unsupported
from appliance.face import cli
from appliance.ops.logs import LogSettings, LogState, checked_changes, formatter


@pytest.fixture
def root_logger() -> Iterator[logging.Logger]:
    """The root logger, restored after the test (LogSettings.install replaces its handler)."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield root
    root.handlers[:] = handlers
    root.setLevel(level)


def _record(level: int, name: str = "appliance.x", msg: str = "hello") -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, msg, (), None)


def test_changes_apply_and_null_leaves_a_setting_alone() -> None:
    state = checked_changes(
        LogState(), {"log_info": False, "log_verbose_level": 2, "log_format": "json"}
    )
    assert state == LogState(log_info=False, log_verbose_level=2, log_format="json")
    assert checked_changes(state, {"log_info": None, "log_file": ""}) == state


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"log_info": "false"},
            "log setting 'log_info' must be a boolean (true or false), got \"false\" (a string)",
        ),
        ({"log_error": 1}, "log setting 'log_error' must be a boolean (true or false), got 1"),
        ({"log_verbose_level": -1}, "'log_verbose_level' must be an integer >= 0, got -1"),
        ({"log_verbose_level": True}, "'log_verbose_level' must be an integer >= 0, got true"),
        ({"log_verbose_level": 1.5}, "'log_verbose_level' must be an integer >= 0, got 1.5"),
        ({"log_format": "ISO"}, "'log_format' must be one of default, ISO8601, json; got 'ISO'"),
        ({"log_format": 3}, "log setting 'log_format' must be a string, got 3 (a number)"),
        ({"log_file": ["x"]}, "log setting 'log_file' must be a string, got [\"x\"] (an array)"),
        ({"verbose": 1}, "unknown log setting 'verbose'; known: log_file, log_info, log_warning"),
    ],
)
def test_bad_values_name_the_setting(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidInput) as err:
        checked_changes(LogState(), changes)
    assert message in err.value.message


def test_log_file_cannot_be_moved_over_the_network() -> None:
    with pytest.raises(Unsupported, match="log file location can not be updated through network"):
        checked_changes(LogState(), {"log_file": "/tmp/elsewhere.log"})
    assert checked_changes(LogState(log_file="a.log"), {"log_file": "a.log"}).log_file == "a.log"


def test_levels() -> None:
    quiet = LogState(log_info=False)
    assert not quiet.passes(_record(logging.INFO))
    assert quiet.passes(_record(logging.WARNING))
    assert quiet.passes(_record(logging.ERROR))
    assert quiet.root_level() == logging.WARNING
    assert not LogState(log_error=False).passes(_record(logging.CRITICAL))
    assert LogState(log_info=False, log_warning=False, log_error=False).root_level() > 50
    # verbose 1: our debug lines only; 2: the libraries' too
    assert not LogState().passes(_record(logging.DEBUG))
    assert LogState(log_verbose_level=1).passes(_record(logging.DEBUG))
    assert not LogState(log_verbose_level=1).passes(_record(logging.DEBUG, "botocore.hooks"))
    assert LogState(log_verbose_level=2).passes(_record(logging.DEBUG, "botocore.hooks"))
    assert LogState(log_verbose_level=1).root_level() == logging.DEBUG


def test_formats() -> None:
    record = _record(logging.WARNING, msg="disk low")
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} WARNING appliance.x: disk low",
        formatter("default").format(record),
    )
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z WARNING appliance.x: disk low",
        formatter("ISO8601").format(record),
    )
    assert formatter("default", journal=True).format(record) == "<4>appliance.x: disk low"
    doc = json.loads(formatter("json").format(record))
    assert doc == {"ts": doc["ts"], "level": "warning", "logger": "appliance.x", "msg": "disk low"}


def test_control_characters_in_names_are_escaped() -> None:
    """A model name from a load request's path (%0A, %1B) cannot forge a log line or drive
    the terminal that shows the log (issue 31, item 12); the record itself is left as it was."""
    name = "m\nINFO appliance.server.app: all models verified\x1b[2J\x7f\x9b"
    record = logging.LogRecord(
        "appliance.x", logging.INFO, "f", 1, "model '%s' (%d versions): %s", (name, 2,
        ValueError(name)), None
    )
    for text in (formatter("default").format(record), formatter("ISO8601").format(record)):
        assert "\n" not in text
        assert "\x1b" not in text
        assert "\x7f" not in text
        assert (
            "model 'm\\x0aINFO appliance.server.app: all models verified"
            "\\x1b[2J\\x7f\\x9b'" in text
        )
        assert "(2 versions)" in text
    journal = formatter("default", journal=True).format(record)
    assert journal.count("\n") == 0
    assert journal.startswith("<6>")
    assert record.args is not None
    assert record.args[0] == name
    # Messages without arguments, and tracebacks, keep their lines.
    plain = logging.LogRecord("appliance.x", logging.INFO, "f", 1, "a\nb", (), None)
    assert formatter("default").format(plain).endswith("a\nb")


def test_json_and_journal_keep_exceptions_whole() -> None:
    try:
        raise ValueError("bad")
    except ValueError:
        record = logging.LogRecord("appliance.x", logging.ERROR, "f", 1, "boom", (), sys.exc_info())
    line = formatter("json").format(record)
    assert "\n" not in line
    assert "ValueError: bad" in json.loads(line)["exc"]
    journal = formatter("default", journal=True).format(record).split("\n")
    assert len(journal) > 2
    assert all(part.startswith("<3>") for part in journal)
    assert journal[0] == "<3>appliance.x: boom"


def test_journal_only_when_stderr_is_the_named_stream(
    root_logger: logging.Logger, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "journal"
    with path.open("w") as stream:
        info = os.fstat(stream.fileno())
        monkeypatch.setenv("JOURNAL_STREAM", f"{info.st_dev}:{info.st_ino}")
        LogSettings(stream=stream).install()
        logging.getLogger("appliance.t").info("to the journal")
        monkeypatch.setenv("JOURNAL_STREAM", f"{info.st_dev}:{info.st_ino + 1}")
        LogSettings(stream=stream).install()  # another stream is the journal: ordinary lines
        logging.getLogger("appliance.t").info("not to the journal")
    lines = path.read_text().splitlines()
    assert lines[0] == "<6>appliance.t: to the journal"
    assert lines[1].endswith(" INFO appliance.t: not to the journal")


def test_updates_reconfigure_the_installed_handler(root_logger: logging.Logger) -> None:
    stream = io.StringIO()
    settings = LogSettings(stream=stream)
    settings.install()
    log = logging.getLogger("appliance.t")
    log.debug("hidden")
    assert settings.update({"log_verbose_level": 1, "log_format": "json"})["log_verbose_level"] == 1
    log.debug("shown")
    settings.update({"log_info": False})
    log.info("hidden too")
    log.warning("a warning")
    records = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [(r["level"], r["msg"]) for r in records][-2:] == [
        ("debug", "shown"),
        ("warning", "a warning"),
    ]
    assert "hidden" not in stream.getvalue()
    assert settings.as_dict() == {
        "log_file": "",
        "log_info": False,
        "log_warning": True,
        "log_error": True,
        "log_verbose_level": 1,
        "log_format": "json",
    }


def test_log_file_appends(root_logger: logging.Logger, tmp_path: Path) -> None:
    path = tmp_path / "server.log"
    path.write_text("earlier\n")
    LogSettings(LogState(log_file=str(path))).install()
    logging.getLogger("appliance.t").warning("later")
    for handler in root_logger.handlers:
        handler.close()
    lines = path.read_text().splitlines()
    assert lines[0] == "earlier"
    assert lines[1].endswith("WARNING appliance.t: later")


def test_log_flags(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    cli.add_serve_flags(parser)
    args = parser.parse_args(
        [
            "--model-repository=models",
            "--log-info=false",
            "--log-warning",
            "false",
            "--log-error",
            "--log-format=json",
            f"--log-file={tmp_path / 'x.log'}",
            "--log-verbose=2",
        ]
    )
    settings = cli.settings_from_args(args)
    assert (settings.log_info, settings.log_warning, settings.log_error) == (False, False, True)
    assert (settings.log_format, settings.log_verbose) == ("json", 2)
    assert settings.log_file == str(tmp_path / "x.log")
    assert settings.ignored_flags == ()
    with pytest.raises(SystemExit):
        parser.parse_args(["--log-format=xml"])
