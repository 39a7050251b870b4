"""The fleet bucket from the operator's side: a blocking S3 client on the devices' location.

The location has --model-repository's spellings (s3://bucket/prefix,
s3://host:port/bucket/prefix, s3://https://host:port/bucket/prefix), parsed by the server's own
S3Location; credentials come from wherever the AWS SDK finds them, as on a device. botocore
(which aiobotocore, the server's S3 extra, brings) signs every request; path-style addressing
for an S3-compatible endpoint, as the server uses.
"""

from __future__ import annotations

import contextlib
import email.utils
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from appliance.repository.s3 import S3Location, client_options

_REQUEST_ATTEMPTS = 3
# A file above this goes up in parts of this size (a single PUT stops at 5 GiB).
PART_BYTES = 64 << 20


class FleetError(Exception):
    """The bucket refused or could not be reached, or the fleet's state forbids the change."""


class Conflict(FleetError):
    """A conditional write found the object changed since it was read (another writer)."""


@dataclass(frozen=True)
class Listed:
    key: str  # the full key
    size: int
    etag: str
    modified_s: float  # by the bucket's clock


@dataclass(frozen=True)
class Fetched:
    data: bytes
    etag: str
    modified_s: float  # by the bucket's clock
    now_s: float  # the bucket's clock when it answered


class FleetBucket:
    """Reads and writes under the location's prefix (keys given relative to it)."""

    def __init__(self, url: str, timeout_s: float = 20.0, client: Any = None) -> None:
        try:
            self.location = S3Location.parse(url)
        except ValueError as exc:
            raise FleetError(str(exc)) from None
        self.url = url
        self.prefix = self.location.prefix
        self.requests = 0  # S3 calls made (the cost of a command)
        # Conditional writes (If-Match / If-None-Match on PUT: AWS S3 since 2024, MinIO,
        # SeaweedFS, moto); off once the store says it has none, then the read-back after a
        # write is the only check.
        self.conditional = True
        self._client = client if client is not None else _client(self.location, timeout_s)

    def key(self, rel: str) -> str:
        return self.prefix + rel.lstrip("/")

    def get(self, rel: str) -> bytes | None:
        """The object's bytes, None when there is none."""
        entry = self.read(rel)
        return entry[0] if entry is not None else None

    def read(self, rel: str) -> tuple[bytes, str] | None:
        """The object's bytes and ETag, None when there is none."""
        found = self.read_object(rel)
        return (found.data, found.etag) if found is not None else None

    def read_object(self, rel: str) -> Fetched | None:
        """The object's bytes, ETag and times (by the bucket's clock), None when there is none."""
        self.requests += 1
        try:
            response = self._client.get_object(Bucket=self.location.bucket, Key=self.key(rel))
            with contextlib.closing(response["Body"]) as body:
                data = bytes(body.read())
            now = time.time()
            date = response.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
            if date:
                with contextlib.suppress(TypeError, ValueError):
                    now = email.utils.parsedate_to_datetime(date).timestamp()
            modified = response.get("LastModified")
            return Fetched(
                data,
                str(response.get("ETag", "")).strip('"'),
                modified.timestamp() if modified is not None else now,
                now,
            )
        except Exception as exc:
            if _status(exc) == 404 or _code(exc) in ("NoSuchKey", "NotFound"):
                return None
            raise FleetError(self._explain(exc, f"reading '{self.key(rel)}'")) from exc

    def put(self, rel: str, data: bytes, expect: str | None = None) -> str:
        """Write an object; its ETag. `expect`: None writes whatever is there; '' only where
        there is no object; an ETag only over the object with that ETag (else Conflict)."""
        kwargs: dict[str, str] = {}
        if expect is not None and self.conditional:
            kwargs = {"IfMatch": f'"{expect}"'} if expect else {"IfNoneMatch": "*"}
        self.requests += 1
        try:
            answer = self._client.put_object(
                Bucket=self.location.bucket, Key=self.key(rel), Body=data, **kwargs
            )
        except Exception as exc:
            code, status = _code(exc), _status(exc)
            if kwargs and (status in (409, 412) or code == "PreconditionFailed"):
                raise Conflict(f"'{self.key(rel)}' changed since it was read") from exc
            if kwargs and (status == 501 or code == "NotImplemented"):
                self.conditional = False  # a store without conditional writes
                return self.put(rel, data)
            raise FleetError(self._explain(exc, f"writing '{self.key(rel)}'")) from exc
        return str(answer.get("ETag", "")).strip('"')

    def put_file(self, rel: str, path: Path) -> None:
        """Upload a file; in parts when it is large. The object appears only once complete."""
        size = path.stat().st_size
        if size <= PART_BYTES:
            self.put(rel, path.read_bytes())
            return
        key, bucket = self.key(rel), self.location.bucket
        try:
            self.requests += 1
            upload = self._client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
        except Exception as exc:
            raise FleetError(self._explain(exc, f"starting the upload of '{key}'")) from exc
        parts = []
        try:
            with path.open("rb") as handle:
                number = 1
                while chunk := handle.read(PART_BYTES):
                    self.requests += 1
                    answer = self._client.upload_part(
                        Bucket=bucket, Key=key, UploadId=upload, PartNumber=number, Body=chunk
                    )
                    parts.append({"PartNumber": number, "ETag": answer["ETag"]})
                    number += 1
            self.requests += 1
            self._client.complete_multipart_upload(
                Bucket=bucket, Key=key, UploadId=upload, MultipartUpload={"Parts": parts}
            )
        except Exception as exc:
            with contextlib.suppress(Exception):
                self._client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload)
            raise FleetError(self._explain(exc, f"uploading '{key}'")) from exc

    def delete(self, rel: str) -> None:
        self.requests += 1
        try:
            self._client.delete_object(Bucket=self.location.bucket, Key=self.key(rel))
        except Exception as exc:
            raise FleetError(self._explain(exc, f"deleting '{self.key(rel)}'")) from exc

    def listing(self, rel: str) -> tuple[list[Listed], float]:
        """Every object under a relative prefix, and the bucket's clock at the listing (the
        local clock when the answer had no Date)."""
        found: list[Listed] = []
        now = time.time()
        for page in self._pages(Prefix=self.key(rel)):
            date = page.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
            if date:
                with contextlib.suppress(TypeError, ValueError):
                    now = email.utils.parsedate_to_datetime(date).timestamp()
            for item in page.get("Contents", []):
                found.append(
                    Listed(
                        key=item["Key"],
                        size=int(item["Size"]),
                        etag=str(item.get("ETag", "")).strip('"'),
                        modified_s=item["LastModified"].timestamp(),
                    )
                )
        return found, now

    def folders(self, rel: str = "") -> list[str]:
        """The names of the 'folders' right under a relative prefix (a delimiter listing)."""
        base = self.key(rel)
        names = []
        for page in self._pages(Prefix=base, Delimiter="/"):
            for common in page.get("CommonPrefixes", []):
                names.append(common["Prefix"][len(base) :].rstrip("/"))
        return names

    def _pages(self, **kwargs: Any) -> Iterator[dict[str, Any]]:
        token = None
        while True:
            if token:
                kwargs["ContinuationToken"] = token
            self.requests += 1
            try:
                page = self._client.list_objects_v2(Bucket=self.location.bucket, **kwargs)
            except Exception as exc:
                raise FleetError(self._explain(exc, f"listing '{kwargs['Prefix']}'")) from exc
            yield page
            if not page.get("IsTruncated"):
                return
            token = page.get("NextContinuationToken")

    def _explain(self, exc: Exception, what: str) -> str:
        """One line naming the bucket, what failed and what to check."""
        where = f"{self.url}: {what}"
        code = _code(exc)
        if code:
            message = getattr(exc, "response", {}).get("Error", {}).get("Message", "")
            if code == "NoSuchBucket":
                return f"{where} failed: bucket '{self.location.bucket}' does not exist"
            if code in ("SignatureDoesNotMatch", "InvalidAccessKeyId", "AccessDenied", "403"):
                return f"{where} refused ({code}): check the AWS credentials and policy: {message}"
            return f"{where} failed ({code}): {message}"
        if type(exc).__name__ in ("NoCredentialsError", "PartialCredentialsError"):
            return (
                f"{where} failed: no AWS credentials found (AWS_ACCESS_KEY_ID / "
                "AWS_SECRET_ACCESS_KEY, ~/.aws/credentials or instance metadata)"
            )
        return f"{where} failed: cannot reach the endpoint: {exc}"


def _code(exc: Exception) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict) and "Error" in response:
        return str(response["Error"].get("Code", ""))
    return ""


def _status(exc: Exception) -> int:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return int(response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    return 0


def _client(location: S3Location, timeout_s: float) -> Any:
    """A botocore S3 client with the server's settings (`s3.client_options`)."""
    try:
        import botocore.session
    except ImportError as exc:
        raise FleetError(
            "the fleet commands need botocore (pip install 'edge-appliance[s3]')"
        ) from exc
    session = botocore.session.get_session()
    options = client_options(location, session, timeout_s, _REQUEST_ATTEMPTS)
    return session.create_client("s3", **options)
