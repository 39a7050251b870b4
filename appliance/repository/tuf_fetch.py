"""TUF's downloads through the source's own S3 client (python-tuf's `FetcherInterface`).

python-tuf's `Updater` is synchronous: it runs in a worker thread, and each metadata file it
asks for is read here by the source's aiobotocore client on the event loop (so the
endpoint, credentials, TLS settings and timeouts of `--model-repository` apply, and every
request is counted with the source's). A download is cut at the length python-tuf gives
(its bound for the role, or the length the signed metadata lists) and kept in memory:
metadata never touches a temporary file outside the store.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any, Protocol

from tuf.api import exceptions
from tuf.ngclient import FetcherInterface

SCHEME = "s3key:"  # Updater URLs are this and the object's key
_CHUNK = 1 << 16
# The most a fetch may read when python-tuf gives no bound (it always does for metadata).
_DEFAULT_MAX_BYTES = 5_000_000


class Client(Protocol):
    """What the fetcher needs of the source (s3.S3Source): its client and request counter."""

    _client: Any
    requests: int


class S3Fetcher(FetcherInterface):
    """Reads `s3key:<key>` from the source's bucket; called from the Updater's thread."""

    def __init__(
        self, source: Client, bucket: str, loop: asyncio.AbstractEventLoop, timeout_s: float
    ) -> None:
        self._source = source
        self._bucket = bucket
        self._loop = loop
        self._timeout_s = timeout_s

    def _fetch(self, url: str) -> Iterator[bytes]:
        return iter([self._get(url, _DEFAULT_MAX_BYTES)])

    def download_bytes(self, url: str, max_length: int) -> bytes:
        return self._get(url, max_length)

    def _get(self, url: str, max_length: int) -> bytes:
        if not url.startswith(SCHEME):
            raise exceptions.DownloadError(f"not an S3 key: {url}")
        future = asyncio.run_coroutine_threadsafe(
            self._read(url[len(SCHEME) :], max_length), self._loop
        )
        try:
            # Each read waits at most timeout_s (the client's); this bounds a slow drip.
            return future.result(timeout=self._timeout_s * 8)
        except exceptions.DownloadError:
            raise
        except TimeoutError as exc:
            future.cancel()
            raise exceptions.SlowRetrievalError(f"'{url}': not read in time") from exc
        except Exception as exc:
            raise exceptions.DownloadError(f"'{url}': {type(exc).__name__}: {exc}") from exc

    async def _read(self, key: str, max_length: int) -> bytes:
        self._source.requests += 1
        try:
            response = await self._source._client.get_object(Bucket=self._bucket, Key=key)
        except Exception as exc:
            status = _status(exc)
            if status:
                raise exceptions.DownloadHTTPError(f"'{key}': HTTP {status}", status) from exc
            raise
        data = bytearray()
        async with response["Body"] as body:
            while chunk := await body.read(min(_CHUNK, max_length + 1 - len(data))):
                data += chunk
                if len(data) > max_length:
                    raise exceptions.DownloadLengthMismatchError(
                        f"'{key}' is longer than the {max_length} bytes TUF allows it"
                    )
        return bytes(data)


def _status(exc: Exception) -> int:
    """The HTTP status of an S3 error (404 for a missing key), 0 when none."""
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return 0
    code = str(response.get("Error", {}).get("Code", ""))
    if code in ("NoSuchKey", "404"):
        return 404
    return int(response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
