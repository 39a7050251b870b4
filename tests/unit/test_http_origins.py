"""The Host / Origin / Content-Type decisions against web pages (frontends/http/origins.py)."""

from __future__ import annotations

import pytest

from appliance.frontends.http.origins import RequestOrigins, split_host


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("127.0.0.1:8000", ("127.0.0.1", 8000)),
        ("[::1]:8000", ("::1", 8000)),
        ("[::1]", ("::1", None)),
        ("Device.Example.", ("device.example", None)),
        ("host:port", ("", None)),
        ("[::1", ("", None)),
        ("[::1]x", ("", None)),
        ("host:\u00b2", ("", None)),  # isdigit() is true for it, int() is not
    ],
)
def test_split_host(value: str, expected: tuple[str, int | None]) -> None:
    assert split_host(value) == expected


def test_decisions() -> None:
    origins = RequestOrigins(["edge.example"], "0.0.0.0", tls=False)
    assert origins.problem("GET", "10.0.0.7:8000", None, False, None) is None
    assert origins.problem("GET", "edge.example:8000", None, False, None) is None
    assert origins.problem("GET", "app.localhost", None, False, None) is None
    refused = origins.problem("GET", "evil.example", None, False, None)
    assert refused is not None
    assert refused[0] == 403
    # A GET's answer cannot be read cross-origin: a foreign Origin refuses only the others.
    assert origins.problem("GET", "127.0.0.1", "http://evil.example", False, None) is None
    assert origins.problem("POST", "127.0.0.1", "http://evil.example", False, None) is not None
    # Default ports: http://127.0.0.1 is port 80, as a Host without a port.
    assert origins.problem("POST", "127.0.0.1", "http://127.0.0.1", False, None) is None
    assert origins.problem("POST", "127.0.0.1", "https://127.0.0.1", False, None) is not None
    assert origins.problem("POST", None, "http://127.0.0.1", False, None) is not None
    # Form types on control POSTs only; parameters and case do not hide them.
    assert origins.problem("POST", None, None, True, "Text/Plain; charset=utf-8") == (
        415,
        "Content-Type 'text/plain' is not accepted on this endpoint: send the body as "
        "application/json (or with no Content-Type)",
    )
    assert origins.problem("POST", None, None, False, "text/plain") is None
    assert origins.problem("POST", None, None, True, "application/x-www-form-urlencoded") is None
    assert RequestOrigins(["*"], "", tls=False).problem(
        "POST", "evil.example", "http://evil.example", True, "text/plain"
    ) is None
