"""Lines a client can cause at will are rate-limited per message kind, and aiohttp's report of
a malformed request is one INFO line without a traceback (issue 17, item 11)."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import pytest
from aiohttp.http_exceptions import BadHttpMessage, ContentEncodingError
from aiohttp.web import RequestPayloadError

from appliance.ops.logs import RATE_LIMITED, ClientHttpErrors, LogSettings, LogState, RateLimit


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _record(msg: str = "bad request from %s", limited: bool = True) -> logging.LogRecord:
    record = logging.LogRecord("appliance.x", logging.INFO, __file__, 1, msg, ("a",), None)
    if limited:
        record.rate_limited = True
    return record


def test_a_burst_passes_then_one_line_per_interval_and_the_count_of_the_rest() -> None:
    clock = Clock()
    limit = RateLimit(burst=3, per_second=0.5, clock=clock)
    passed = [limit.filter(_record()) for _ in range(10)]
    assert passed == [True] * 3 + [False] * 7
    clock.now += 2.0  # one token back
    record = _record()
    assert limit.filter(record)
    assert record.getMessage() == "bad request from a (7 more like this suppressed in the last 2 s)"
    assert not limit.filter(_record())
    clock.now += 2.0
    record = _record()
    assert limit.filter(record)
    assert record.getMessage() == "bad request from a (1 more like this suppressed in the last 2 s)"
    clock.now += 100.0  # a quiet spell refills the burst, no more
    assert [limit.filter(_record()) for _ in range(4)] == [True, True, True, False]


def test_kinds_have_their_own_buckets_and_other_lines_always_pass() -> None:
    limit = RateLimit(burst=1, per_second=0.0, clock=Clock())
    assert limit.filter(_record("one %s"))
    assert not limit.filter(_record("one %s"))
    assert limit.filter(_record("two %s"))
    assert all(limit.filter(_record("one %s", limited=False)) for _ in range(100))


def _error_record(
    exc: BaseException, msg: str = "Error handling request from %s", *args: object
) -> logging.LogRecord:
    """A record as aiohttp's server logger makes it (logger.exception)."""
    args = args or (("127.0.0.1",) if "%s" in msg else ())
    return logging.LogRecord(
        "aiohttp.server", logging.ERROR, __file__, 1, msg, args, (type(exc), exc, None)
    )


def test_a_malformed_request_becomes_one_info_line_without_a_traceback() -> None:
    record = _error_record(BadHttpMessage("Invalid header token:\n\n    b'Bad Header'\n      ^"))
    assert ClientHttpErrors().filter(record)
    assert (record.levelno, record.levelname) == (logging.INFO, "INFO")
    assert record.exc_info is None
    assert record.rate_limited is True  # type: ignore[attr-defined]
    assert record.getMessage() == (
        "malformed HTTP request: Invalid header token (400); aiohttp: Error handling request "
        "from 127.0.0.1"
    )


def test_a_malformed_request_aiohttp_logs_at_debug_stays_at_debug() -> None:
    record = _error_record(BadHttpMessage("Invalid method"))
    record.levelno, record.levelname = logging.DEBUG, "DEBUG"
    ClientHttpErrors().filter(record)
    assert record.levelno == logging.DEBUG
    assert record.exc_info is None


def test_a_body_that_does_not_decode_is_the_clients_error_too() -> None:
    payload = RequestPayloadError("400, message:\n  Can not decode content-encoding: gzip")
    payload.__cause__ = ContentEncodingError("Can not decode content-encoding: gzip")
    record = _error_record(payload, "Unhandled exception")
    ClientHttpErrors().filter(record)
    assert record.levelno == logging.INFO
    assert record.getMessage() == (
        "malformed HTTP request: Can not decode content-encoding: gzip (400); aiohttp: "
        "Unhandled exception"
    )


def test_a_server_error_stays_an_error_with_its_traceback() -> None:
    record = _error_record(RuntimeError("bug"), "Unhandled exception")
    ClientHttpErrors().filter(record)
    assert record.levelno == logging.ERROR
    assert record.exc_info is not None
    assert not hasattr(record, "rate_limited")


@pytest.fixture
def installed() -> Iterator[io.StringIO]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    stream = io.StringIO()
    LogSettings(LogState(), stream=stream).install()
    yield stream
    root.handlers[:] = handlers
    root.setLevel(level)


def test_installed_settings_limit_a_flood_of_malformed_requests(installed: io.StringIO) -> None:
    server = logging.getLogger("aiohttp.server")
    for _ in range(500):
        try:
            raise BadHttpMessage("Invalid header token:\n\n    b'x'")
        except BadHttpMessage:
            server.exception("Error handling request from %s", "127.0.0.1")
    for _ in range(500):
        logging.getLogger("appliance.frontends.http.server").error(
            "unexpected error handling %s", "GET /", extra=RATE_LIMITED
        )
    text = installed.getvalue()
    assert "Traceback" not in text
    assert text.count("malformed HTTP request: Invalid header token (400)") <= 21
    assert text.count("unexpected error handling GET /") <= 21
    assert len(text) < 12_000  # 500 x ~556 bytes before
