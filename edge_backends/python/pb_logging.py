"""`pb_utils.Logger`: a model's log lines, in the server's log with the model's name."""

from __future__ import annotations

import enum
import logging

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
