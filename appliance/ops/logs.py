"""Log settings: tritonserver's `--log-*` flags, changed at run time by the logging extension.

One `LogSettings` object owns the root logger's handler. Formats:

- `default`: `2024-05-01 12:00:00,123 INFO appliance.server.app: message`; when stderr is the
  journal (`$JOURNAL_STREAM` names it) no timestamp, since journald stamps each line itself.
- `ISO8601`: the timestamp in ISO 8601, UTC (`2024-05-01T12:00:00.123Z`), as tritonserver's.
- `json`: one object per line: `ts`, `level`, `logger`, `msg`, and `exc` with a traceback.

Writing to the journal, every line starts with its syslog priority (`<3>` error, `<4>` warning,
`<6>` info, `<7>` debug), which journald reads into PRIORITY and strips.

`log_verbose_level` 1 shows this server's debug lines (each HTTP request and gRPC call among
them); 2 and above also the libraries' (aiohttp, botocore, ...), which are many.

Lines a client can cause at will (a malformed HTTP request, a request that hits a server bug)
are logged with `extra=RATE_LIMITED` and pass a token bucket per message kind (`RateLimit`), so
a hostile client cannot fill the journal; what was dropped is counted and the next line of the
kind says how many. aiohttp's own report of a malformed request (an ERROR with a traceback) is
rewritten into one such INFO line (`ClientHttpErrors`): a client's bad input is not our error.
"""

from __future__ import annotations

import datetime
import json
import logging
import logging.handlers
import os
import re
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, TextIO

from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web import RequestPayloadError

from appliance.common.errors import InvalidInput, Unsupported
from appliance.common.settings import ServerSettings

FORMATS = ("default", "ISO8601", "json")
KEYS = ("log_file", "log_info", "log_warning", "log_error", "log_verbose_level", "log_format")
# Loggers whose debug lines level 1 shows; everything else needs level 2.
OWN_LOGGERS = ("appliance", "edge_backends", "python_model")
_SYSLOG_PRIORITY = {
    logging.DEBUG: 7,
    logging.INFO: 6,
    logging.WARNING: 4,
    logging.ERROR: 3,
    logging.CRITICAL: 2,
}


@dataclass(frozen=True)
class LogState:
    """The settings, in the names of Triton's logging extension."""

    log_file: str = ""  # empty: stderr
    log_info: bool = True
    log_warning: bool = True
    log_error: bool = True
    log_verbose_level: int = 0
    log_format: str = "default"

    @classmethod
    def from_settings(cls, settings: ServerSettings) -> LogState:
        """The start's log settings (the flags), in these names."""
        return cls(
            log_file=settings.log_file,
            log_info=settings.log_info,
            log_warning=settings.log_warning,
            log_error=settings.log_error,
            log_verbose_level=settings.log_verbose,
            log_format=settings.log_format,
        )

    def passes(self, record: logging.LogRecord) -> bool:
        level = record.levelno
        if level >= logging.ERROR:
            return self.log_error
        if level >= logging.WARNING:
            return self.log_warning
        if level >= logging.INFO:
            return self.log_info
        if self.log_verbose_level >= 2:
            return True
        return self.log_verbose_level == 1 and record.name.startswith(OWN_LOGGERS)

    def root_level(self) -> int:
        """The lowest level any record can pass at, so that disabled calls cost nothing."""
        if self.log_verbose_level > 0:
            return logging.DEBUG
        for level, on in (
            (logging.INFO, self.log_info),
            (logging.WARNING, self.log_warning),
            (logging.ERROR, self.log_error),
        ):
            if on:
                return level
        return logging.CRITICAL + 1


def checked_changes(current: LogState, changes: Mapping[str, Any]) -> LogState:
    """The state after `changes` (a JSON object's values), or InvalidInput naming the setting.

    A null value leaves a setting as it is (as in Triton). All are checked before any applies.
    """
    updates: dict[str, Any] = {}
    for key, value in changes.items():
        if key not in KEYS:
            raise InvalidInput(f"unknown log setting '{key}'; known: {', '.join(KEYS)}")
        if value is None:
            continue
        if key in ("log_info", "log_warning", "log_error"):
            if not isinstance(value, bool):
                raise InvalidInput(
                    f"log setting '{key}' must be a boolean (true or false), got {_shown(value)}"
                )
        elif key == "log_verbose_level":
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidInput(
                    f"log setting 'log_verbose_level' must be an integer >= 0, got {_shown(value)}"
                )
        elif not isinstance(value, str):
            raise InvalidInput(f"log setting '{key}' must be a string, got {_shown(value)}")
        elif key == "log_format" and value not in FORMATS:
            raise InvalidInput(
                f"log setting 'log_format' must be one of {', '.join(FORMATS)}; got '{value}'"
            )
        elif key == "log_file" and value != current.log_file:
            # As tritonserver: a network client must not choose files for the server to write.
            raise Unsupported(  # tritonserver's words first
                "log file location can not be updated through network protocol: "
                "start the server with --log-file"
            )
        updates[key] = value
    return replace(current, **updates)


def _shown(value: Any) -> str:
    kind = {str: "a string", bool: "a boolean", int: "a number", float: "a number"}.get(
        type(value), "an array" if isinstance(value, list) else "an object"
    )
    return f"{json.dumps(value)} ({kind})"


# `extra=` for a line a client can cause at will: it passes RateLimit's bucket for its kind.
RATE_LIMITED: Mapping[str, object] = {"rate_limited": True}
# Per message kind: 20 lines at once, then one every 5 s (a flood costs ~3.5 MB a day per kind
# at ~200 bytes a line, and the kinds are the format strings in the code: a few dozen).
RATE_LIMIT_BURST = 20
RATE_LIMIT_PER_SECOND = 0.2


@dataclass
class _Bucket:
    tokens: float
    updated: float  # clock reading of the last refill
    suppressed: int = 0
    since: float = 0.0  # clock reading of the first line dropped since the last that passed


class RateLimit(logging.Filter):
    """A token bucket per message kind (logger and format string) for `RATE_LIMITED` lines.

    `burst` lines of a kind pass at once, then `per_second`; the lines dropped are counted, and
    the next line of the kind that passes says how many were suppressed. Other lines pass.
    """

    def __init__(
        self,
        burst: int = RATE_LIMIT_BURST,
        per_second: float = RATE_LIMIT_PER_SECOND,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self._burst = burst
        self._per_second = per_second
        self._clock = clock
        self._buckets: dict[tuple[str, str], _Bucket] = {}
        self._lock = threading.Lock()  # instance threads log too

    def filter(self, record: logging.LogRecord) -> bool:
        if not getattr(record, "rate_limited", False):
            return True
        key = (record.name, str(record.msg))
        with self._lock:
            now = self._clock()
            bucket = self._buckets.get(key)
            if bucket is None:
                bucket = self._buckets[key] = _Bucket(float(self._burst), now)
            refill = (now - bucket.updated) * self._per_second
            bucket.tokens = min(float(self._burst), bucket.tokens + refill)
            bucket.updated = now
            if bucket.tokens < 1:
                if not bucket.suppressed:
                    bucket.since = now
                bucket.suppressed += 1
                return False
            bucket.tokens -= 1
            suppressed, since = bucket.suppressed, bucket.since
            bucket.suppressed = 0
        if suppressed:
            record.msg = (
                f"{record.getMessage()} ({suppressed} more like this suppressed in the last "
                f"{now - since:.0f} s)"
            )
            record.args = ()
        return True


class ClientHttpErrors(logging.Filter):
    """aiohttp logs a malformed request (request line, header, framing, a body that does not
    decode: the payload error it raises again when it drains the body after the answer) as an
    ERROR with a traceback. It is the client's error: one INFO line with aiohttp's reason,
    rate-limited."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, RequestPayloadError):
            exc = exc.__cause__  # aiohttp's HttpProcessingError, when the client is at fault
        if isinstance(exc, HttpProcessingError):
            # The first line only: the rest repeats the client's bytes.
            reason = str(exc.message).split("\n", 1)[0].rstrip(" :")[:200]
            original = record.getMessage()  # "Error handling request from <peer>"
            record.msg = "malformed HTTP request: %s (%d); aiohttp: %s"
            record.args = (reason, exc.code, original)
            if record.levelno > logging.INFO:  # aiohttp logs some at DEBUG already
                record.levelno, record.levelname = logging.INFO, "INFO"
            record.exc_info, record.exc_text = None, None
            record.rate_limited = True
        return True


_CLIENT_HTTP_ERRORS = ClientHttpErrors()

# Warnings and errors the status page shows: the newest 100 (about 30 KB at most).
RECENT_PROBLEMS = 100
_MODEL_NAMED = re.compile(r"model '([^']{1,200})'")


@dataclass(frozen=True, slots=True)
class Problem:
    """A warning or error line as the status page shows it."""

    time_s: float  # wall clock, seconds since the epoch
    level: str  # WARNING, ERROR or CRITICAL
    logger: str
    message: str  # the first line, at most 500 characters
    model: str  # the model the line names ("model 'x'"), or ""


class RecentProblems(logging.Handler):
    """A bounded ring of the latest WARNING and ERROR records, for the status page.

    Kept apart from the output handler: it sees every warning and error whatever the log
    settings and the rate limits say (it never grows, so a flood only pushes old lines out).
    """

    def __init__(self, capacity: int = RECENT_PROBLEMS) -> None:
        super().__init__(logging.WARNING)
        self._ring: deque[Problem] = deque(maxlen=capacity)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
        except Exception:  # a bad format string must not break logging
            message = str(record.msg)
        first = message.split("\n", 1)[0][:500]
        named = _MODEL_NAMED.search(first)
        self._ring.append(
            Problem(record.created, record.levelname, record.name, first,
                    named.group(1) if named else "")
        )

    def recent(self) -> list[Problem]:
        """Oldest first."""
        return list(self._ring)


class LogSettings:
    """The server's log settings and the root logger's one handler that applies them."""

    def __init__(self, state: LogState | None = None, stream: TextIO | None = None) -> None:
        self.state = state or LogState()
        self._stream = stream
        self._handler: logging.Handler | None = None
        self._rate_limit = RateLimit()
        self.problems = RecentProblems()

    def as_dict(self) -> dict[str, Any]:
        """Triton's log settings object (every setting, as `GET /v2/logging` answers)."""
        state = self.state
        return {key: getattr(state, key) for key in KEYS}

    def update(self, changes: Mapping[str, Any]) -> dict[str, Any]:
        """Apply some settings (all or none); returns every setting afterwards."""
        new = checked_changes(self.state, changes)
        if new != self.state:
            self.state = new
            if self._handler is not None:
                self._configure(self._handler)
            logging.getLogger(__name__).info("log settings are now %s", self.as_dict())
        return self.as_dict()

    def install(self) -> None:
        """Make the root logger write through these settings (OSError: --log-file unusable)."""
        handler: logging.Handler
        if self.state.log_file:
            handler = logging.handlers.WatchedFileHandler(self.state.log_file, encoding="utf-8")
        else:
            handler = logging.StreamHandler(self._stream or sys.stderr)
        handler.addFilter(self._filter)
        handler.addFilter(self._rate_limit)  # after the level filter: only shown lines count
        self._configure(handler)
        logging.getLogger().handlers[:] = [handler, self.problems]
        logging.getLogger("aiohttp.server").addFilter(_CLIENT_HTTP_ERRORS)
        self._handler = handler

    def _filter(self, record: logging.LogRecord) -> bool:
        return self.state.passes(record)

    def _configure(self, handler: logging.Handler) -> None:
        journal = (
            isinstance(handler, logging.StreamHandler)
            and not isinstance(handler, logging.FileHandler)
            and _is_journal(handler.stream)
        )
        handler.setFormatter(formatter(self.state.log_format, journal))
        logging.getLogger().setLevel(self.state.root_level())


def _is_journal(stream: TextIO) -> bool:
    """Whether `stream` is the journal: systemd sets JOURNAL_STREAM to its device:inode."""
    expected = os.environ.get("JOURNAL_STREAM", "")
    if not expected:
        return False
    try:
        info = os.fstat(stream.fileno())
    except (OSError, ValueError, AttributeError):
        return False
    return expected == f"{info.st_dev}:{info.st_ino}"


def formatter(name: str, journal: bool = False) -> logging.Formatter:
    """The formatter for a log_format; `journal`: syslog priority prefixes, no own timestamp."""
    if name == "json":
        return JsonFormatter(journal)
    if name == "ISO8601":
        return TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s", journal, iso=True)
    if journal:
        return TextFormatter("%(name)s: %(message)s", journal)
    return TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s")


def _iso(created: float) -> str:
    stamp = datetime.datetime.fromtimestamp(created, datetime.timezone.utc)
    return stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _prefixed(text: str, record: logging.LogRecord) -> str:
    """Each line with the record's syslog priority: journald makes each line an entry."""
    prefix = f"<{_SYSLOG_PRIORITY.get(record.levelno, 6)}>"
    return "\n".join(prefix + line for line in text.split("\n"))


# Control characters (C0, DEL, C1) in what a client or a repository names (a model name from
# a load request's path, a folder name): a newline would forge a log line, an escape sequence
# would drive the terminal that reads the log. Shown as \xNN instead.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def escape_controls(text: str) -> str:
    """`text` with every control character written as \\xNN (a backslash, x, two digits)."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def _escaped_args(args: Any) -> Any:
    """A record's %-arguments with control characters escaped: strings, and objects shown by
    str() (exceptions carry names); numbers stay numbers for %d and %g."""
    if not isinstance(args, tuple):
        return args  # a mapping (logging's `%(key)s` form): left as it is
    return tuple(
        a if isinstance(a, (int, float)) else escape_controls(a if isinstance(a, str) else str(a))
        for a in args
    )


class TextFormatter(logging.Formatter):
    """The text formats. The record's arguments (names, errors) are written with control
    characters escaped, so that every entry is the lines its message and traceback make."""

    def __init__(self, fmt: str, journal: bool = False, iso: bool = False) -> None:
        super().__init__(fmt)
        self._journal = journal
        self._iso = iso

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return _iso(record.created) if self._iso else super().formatTime(record, datefmt)

    def format(self, record: logging.LogRecord) -> str:
        args = record.args
        if args:
            record.args = _escaped_args(args)
        try:
            text = super().format(record)
        finally:
            record.args = args
        return _prefixed(text, record) if self._journal else text


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg (and exc with the traceback)."""

    def __init__(self, journal: bool = False) -> None:
        super().__init__()
        self._journal = journal

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": _iso(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            doc["exc"] = record.exc_text
        if record.stack_info:
            doc["stack"] = self.formatStack(record.stack_info)
        text = json.dumps(doc, ensure_ascii=False, default=str)
        return _prefixed(text, record) if self._journal else text
