"""`pb_utils.Logger`: a model's log lines, in the server's log with the model's name.

Every log record of a model process (pb_utils.Logger's, and the model's own `logging` calls)
goes to the server over the process's channel as ("log", level, text) and is logged there
(backend.py), so it has the server's format, timestamp, log file, journal priority and
--log-* settings, as the server's own lines do. Written to stderr by the process itself, the
lines had no timestamp and ignored --log-file.
"""

from __future__ import annotations

import enum
import logging
import sys
import traceback
from typing import Any

_log = logging.getLogger("python_model")


class LogLevel(enum.IntEnum):
    INFO = 0
    WARNING = 1
    ERROR = 2
    VERBOSE = 3


_LEVELS = {
    LogLevel.INFO: logging.INFO,
    LogLevel.WARNING: logging.WARNING,
    LogLevel.ERROR: logging.ERROR,
    LogLevel.VERBOSE: logging.DEBUG,  # shown when the server logs verbosely
}


class Logger:
    """Log from initialize, execute or finalize: `Logger.log_info("...")`, or
    `Logger.log("...", Logger.WARNING)`."""

    LogLevel = LogLevel
    INFO = LogLevel.INFO
    WARNING = LogLevel.WARNING
    ERROR = LogLevel.ERROR
    VERBOSE = LogLevel.VERBOSE

    @staticmethod
    def log(message: str, level: int = 0) -> None:
        """`level`: Logger.INFO (the default), WARNING, ERROR or VERBOSE."""
        _log.log(_LEVELS.get(LogLevel(level), logging.INFO), "%s", message)

    @staticmethod
    def log_info(message: str) -> None:
        _log.info("%s", message)

    @staticmethod
    def log_warn(message: str) -> None:
        _log.warning("%s", message)

    @staticmethod
    def log_error(message: str) -> None:
        _log.error("%s", message)

    @staticmethod
    def log_verbose(message: str) -> None:
        _log.debug("%s", message)


class ChannelHandler(logging.Handler):
    """A model process's log records, sent to the server: ("log", level, text). Once the
    server is gone, written to stderr instead (a model's last words are not lost)."""

    def __init__(self, channel: Any) -> None:
        super().__init__()
        self._channel = channel

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
            if record.exc_info:
                text += "\n" + "".join(traceback.format_exception(*record.exc_info)).rstrip()
            if record.name not in ("python_model", "root"):
                text = f"{record.name}: {text}"
        except Exception:  # a bad format string in the model's call
            self.handleError(record)
            return
        try:
            self._channel.send("log", record.levelno, text)
        except (OSError, ValueError, EOFError):
            sys.stderr.write(f"{record.levelname} {text}\n")


def forward_to(channel: Any) -> None:
    """Send this process's log records, INFO and above, to the server over `channel`."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.addHandler(ChannelHandler(channel))
    root.setLevel(logging.INFO)
