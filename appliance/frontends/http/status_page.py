"""The status page over HTTP: `GET /status` (the page), `/status.json` (its data; with
`?since=T` the charts' points after T only, as the page asks once it has the older ones), `/` (a
redirect to the page), `/status/<asset>` (its script and style) and `/openapi.json` (the
HTTP API this server serves).

The files are package data (`frontends/http/static/`), read once and gzipped once (sent so to a
browser that accepts gzip: 5 KB instead of 15 KB): no CDN, works offline. Only
the fixed names below are served, so no request can name a file. The page writes the data with
`textContent` only and is sent with a Content-Security-Policy that allows its own script and
nothing inline, so nothing in a model name or a log line can run in the browser.
"""

from __future__ import annotations

import gzip
import math
from collections.abc import Awaitable, Callable
from importlib import resources

import orjson
from aiohttp import web

from appliance.services.status import StatusService

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# A status.json this big goes gzipped (level 1) to a client that accepts it: a page's first poll
# (every chart point of the window: 14 KB a model, 2.7 KB gzipped) and big repositories; a
# later poll (?since=: 1.7 KB for one model) goes as it is, not worth the CPU.
GZIP_JSON_BYTES = 4096
API = "status"  # the restricted-API group (appliance/common/access.py)
# /status.json shows each model's configuration summary, versions and reasons (the repository
# index), and its request counts and latencies (statistics): a client that may not read those
# through their own APIs may not read them here either. The page and its files show nothing.
DATA_APIS = (API, "model-repository", "statistics", "model-config")

# name -> content type; the page's own files (static/).
ASSETS = {
    "status.html": "text/html",
    "status.js": "text/javascript",
    "status.css": "text/css",
    "openapi.json": "application/json",
}
_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
    "Referrer-Policy": "no-referrer",
}


def _shown(text: str) -> str:
    """A client's text, quoted in an answer: escaped (a reason has no line breaks), short."""
    return text[:60].encode("unicode_escape").decode("ascii")


def read_asset(name: str) -> bytes:
    """One of the page's files, from the package (or the binary's bundled copy)."""
    return (resources.files("appliance.frontends.http") / "static" / name).read_bytes()


class StatusPage:
    """The handlers; `routes()` gives them with their restricted-API group."""

    def __init__(self, status: StatusService) -> None:
        self.status = status
        self._assets = {name: read_asset(name) for name in ASSETS}
        self._gzipped = {n: gzip.compress(data, 9, mtime=0) for n, data in self._assets.items()}

    def routes(self) -> list[tuple[str, str, Handler, str | tuple[str, ...]]]:
        return [
            ("GET", "/", self.root, API),
            ("GET", "/status", self.page, API),
            ("GET", "/status.json", self.data, DATA_APIS),
            ("GET", "/status/{asset}", self.asset, API),
            ("GET", "/openapi.json", self.openapi, API),
        ]

    def _file(self, request: web.Request, name: str) -> web.Response:
        headers = {**_HEADERS, "Vary": "Accept-Encoding"}
        if "gzip" in request.headers.get("Accept-Encoding", ""):
            body, headers["Content-Encoding"] = self._gzipped[name], "gzip"
        else:
            body = self._assets[name]
        return web.Response(body=body, content_type=ASSETS[name], headers=headers)

    async def root(self, request: web.Request) -> web.StreamResponse:
        return web.Response(status=302, headers={"Location": "/status"})

    async def page(self, request: web.Request) -> web.StreamResponse:
        return self._file(request, "status.html")

    async def asset(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["asset"]
        if name not in ("status.js", "status.css"):
            raise web.HTTPNotFound(reason=f"no such file: /status/{_shown(name)}")
        return self._file(request, name)

    async def openapi(self, request: web.Request) -> web.StreamResponse:
        return self._file(request, "openapi.json")

    async def data(self, request: web.Request) -> web.StreamResponse:
        since = request.query.get("since", "0")
        try:
            since_s = float(since)
        except ValueError:
            since_s = math.nan
        if not math.isfinite(since_s):
            raise web.HTTPBadRequest(
                reason=f"since: expected seconds since the epoch, got '{_shown(since)}'"
            )
        # orjson writes the report's frozen dataclasses with their field names.
        body = orjson.dumps(self.status.report(since_s))
        headers = {**_HEADERS, "Vary": "Accept-Encoding"}
        if len(body) >= GZIP_JSON_BYTES and "gzip" in request.headers.get("Accept-Encoding", ""):
            body, headers["Content-Encoding"] = gzip.compress(body, 1, mtime=0), "gzip"
        return web.Response(body=body, content_type="application/json", headers=headers)
