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


@pytest.mark.parametrize("address", ["127.0.0.1", "::1", "[::1]", "localhost", "127.0.0.2"])
def test_a_local_listener_checks_host(address: str) -> None:
    refused = RequestOrigins([], address, tls=False).problem(
        "GET", "edge-appliance:8000", None, False, None
    )
    assert refused is not None
    assert refused[0] == 403


@pytest.mark.parametrize("address", ["0.0.0.0", "::", "", "192.168.1.20", "edge.lan"])
def test_a_network_listener_takes_the_names_the_network_gives_it(address: str) -> None:
    # A container's --http-address=0.0.0.0 is called by its Compose / Kubernetes Service name.
    origins = RequestOrigins([], address, tls=False)
    assert origins.problem("GET", "edge-appliance.default.svc:8000", None, False, None) is None
    # The Origin and form checks stay.
    cross = origins.problem(
        "POST", "edge-appliance:8000", "http://evil.example", False, None
    )
    assert cross is not None
    assert cross[0] == 403
    assert origins.problem("POST", "edge-appliance:8000", None, True, "text/plain") is not None
    # Naming hosts turns the Host check on again.
    named = RequestOrigins(["edge.lan"], address, tls=False)
    refused = named.problem("GET", "edge-appliance:8000", None, False, None)
    assert refused is not None
    assert refused[0] == 403
