"""What the client commands (`pin`, `unpin`, `status`) share: the server's URL, extra headers
(the key of a restricted API), and how an unreachable server is said."""

from __future__ import annotations

import argparse
import sys
import urllib.error

DEFAULT_URL = "http://127.0.0.1:8000"


def add_endpoint_flags(p: argparse.ArgumentParser, api: str) -> None:
    """--url and --header; `api`: the restricted API group a header key would open."""
    p.add_argument(
        "--url",
        default=DEFAULT_URL,
        help=f"the server's HTTP endpoint; HOST:PORT: http://HOST:PORT (default {DEFAULT_URL})",
    )
    p.add_argument(
        "--header",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"a header to send, e.g. the key of a restricted {api} API; repeatable",
    )


def with_scheme(url: str) -> str:
    """`127.0.0.1:8000` means http://127.0.0.1:8000, as curl takes it."""
    return url if "://" in url else f"http://{url}"


def parse_headers(items: list[str], prog: str) -> dict[str, str] | None:
    """The --header values by name; None (the reason printed) when one is not KEY=VALUE."""
    headers: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            print(f"{prog}: --header {item!r}: KEY=VALUE", file=sys.stderr)  # noqa: T201
            return None
        headers[key] = value
    return headers


def unreachable(url: str, exc: urllib.error.URLError | OSError) -> str:
    reason = getattr(exc, "reason", exc)
    return f"cannot reach the server at {url}: {reason}"
