"""A small S3 endpoint that lies, for tests: just enough of ListObjectsV2 and GET for the
server's sync, with listings and bodies the test chooses (a body longer than the size listed,
a listing that is always truncated). In the test's own event loop, on 127.0.0.1 port 0.

    async with LyingS3() as s3:
        s3.objects["models/m/1/model.onnx"] = Listed(size=10, body=b"x" * 1000)
        source = S3Source(s3.url("models"), ...)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from types import TracebackType
from typing import Any
from xml.sax.saxutils import escape

from aiohttp import web

BUCKET = "lying"


@dataclasses.dataclass
class Listed:
    """An object as the listing gives it, and the body a GET sends (the listed size of
    zeros when None)."""

    size: int
    body: bytes | None = None
    etag: str = "0123456789abcdef0123456789abcdef-1"  # not an MD5: no ETag check


# A page of the listing: (objects, next continuation token or None for the last page).
Pages = Callable[[str | None], tuple[dict[str, Listed], str | None]]


class LyingS3:
    def __init__(self) -> None:
        self.objects: dict[str, Listed] = {}
        self.pages: Pages | None = None  # None: one page of `objects`, not truncated
        self.gets: list[str] = []  # keys fetched, in order
        self.listings = 0
        self._runner: web.AppRunner | None = None
        self.port = 0

    def url(self, prefix: str) -> str:
        return f"s3://127.0.0.1:{self.port}/{BUCKET}/{prefix}"

    async def __aenter__(self) -> LyingS3:
        app = web.Application()
        app.router.add_get(f"/{BUCKET}", self._list)
        app.router.add_get(f"/{BUCKET}/{{key:.+}}", self._get)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._runner is not None
        await self._runner.cleanup()

    async def _list(self, request: web.Request) -> web.Response:
        self.listings += 1
        token = request.query.get("continuation-token")
        prefix = request.query.get("prefix", "")
        if self.pages is None:
            objects, following = self.objects, None
        else:
            objects, following = self.pages(token)
        contents = "".join(
            f"<Contents><Key>{escape(key)}</Key>"
            "<LastModified>2026-01-01T00:00:00.000Z</LastModified>"
            f"<ETag>&quot;{obj.etag}&quot;</ETag><Size>{obj.size}</Size>"
            "<StorageClass>STANDARD</StorageClass></Contents>"
            for key, obj in sorted(objects.items())
            if key.startswith(prefix)
        )
        more = (
            f"<IsTruncated>true</IsTruncated><NextContinuationToken>{escape(following)}"
            "</NextContinuationToken>"
            if following
            else "<IsTruncated>false</IsTruncated>"
        )
        body = (
            '<?xml version="1.0" encoding="UTF-8"?>'
            '<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
            f"<Name>{BUCKET}</Name><Prefix>{escape(prefix)}</Prefix>"
            f"<KeyCount>{len(objects)}</KeyCount><MaxKeys>1000</MaxKeys>{more}{contents}"
            "</ListBucketResult>"
        )
        return web.Response(body=body.encode(), content_type="application/xml")

    async def _get(self, request: web.Request) -> web.StreamResponse:
        key = request.match_info["key"]
        self.gets.append(key)
        obj = self.objects.get(key)
        if obj is None:
            error = (
                "<?xml version='1.0' encoding='UTF-8'?><Error><Code>NoSuchKey</Code>"
                f"<Message>no such key</Message><Key>{escape(key)}</Key></Error>"
            )
            return web.Response(status=404, body=error.encode(), content_type="application/xml")
        body = obj.body if obj.body is not None else bytes(obj.size)
        headers: dict[str, Any] = {"ETag": f'"{obj.etag}"'}
        return web.Response(body=body, headers=headers, content_type="binary/octet-stream")
