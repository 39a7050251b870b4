"""The status line and headers of the answers the infer fast path writes itself.

They carry the `Server` and `Date` headers aiohttp writes on the answers it makes (relayed
requests), so that every answer of a connection carries them; the date is formatted once a
second.
"""

from __future__ import annotations

import time
from email.utils import formatdate
from http import HTTPStatus

from aiohttp.http import SERVER_SOFTWARE


def response_head(
    status: int,
    content_type: bytes,
    length: int,
    extra: tuple[tuple[bytes, bytes], ...],
    keep_alive: bool,
) -> bytes:
    lines = [
        _status_line(status),
        _SERVER_LINE,
        _date_line(),
        b"Content-Type: %s\r\nContent-Length: %d\r\n" % (content_type, length),
    ]
    lines += [b"%s: %s\r\n" % pair for pair in extra]
    if not keep_alive:
        lines.append(b"Connection: close\r\n")
    lines.append(b"\r\n")
    return b"".join(lines)


# The Server and Date headers aiohttp writes on the answers it makes (relayed requests), so
# that every answer of a connection carries them. The date is formatted once a second.
_SERVER_LINE = b"Server: %s\r\n" % SERVER_SOFTWARE.encode()
_date: tuple[int, bytes] = (0, b"")


def _date_line() -> bytes:
    global _date
    now = int(time.time())
    second, line = _date
    if now != second:
        line = b"Date: %s\r\n" % formatdate(now, usegmt=True).encode()
        _date = (now, line)  # one assignment: loop threads may race to it harmlessly
    return line


_STATUS_LINES = {s.value: b"HTTP/1.1 %d %s\r\n" % (s.value, s.phrase.encode()) for s in HTTPStatus}


def _status_line(status: int) -> bytes:
    return _STATUS_LINES.get(status) or b"HTTP/1.1 %d Unknown\r\n" % status
