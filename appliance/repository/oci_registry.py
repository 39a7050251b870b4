"""OCI registries: the location, the artifact layout, and the distribution API calls.

A model repository in a registry is one OCI repository (`oci://host:port/fleet/models`):

    <repo>:index                  the repository index: an OCI manifest whose config blob
                                  (INDEX_TYPE) pins, per model, the digest of its model-level
                                  artifact and of each version's artifact
    <repo>@sha256:...             one artifact per version (ModelPack: artifactType
                                  MODEL_ARTIFACT), every file of the version folder a layer
                                  with its path in `org.opencontainers.image.title`; and one
                                  per model for the files beside the version folders
                                  (config.pbtxt, labels, ...)

Versions are also tagged `<model>.<version>` for people; a device follows only the digests the
index pins, never a tag, so a tag moved to other content changes nothing on a device. Every
manifest and blob is content-addressed: what arrives is hashed as it streams and must be the
digest it was asked for, and is never read past the size its descriptor gives.

The calls are the OCI distribution API's own (GET manifests and blobs, blob uploads, PUT
manifests) through aiohttp, the HTTP client the server already has: the `oras` package is
synchronous (requests) and downloads whole files without the bounds and resumption the store
needs, so it would add a dependency and still leave the verified download to write.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import ipaddress
import json
import os
import re
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from appliance.repository.local import name_problem, version_number

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
INDEX_TYPE = "application/vnd.edge-appliance.repository.index.v1+json"
INDEX_TAG = "index"
# CNCF ModelPack (model-spec v1): the artifact type, its config and the layers' media types.
MODEL_ARTIFACT = "application/vnd.cncf.model.manifest.v1+json"
MODEL_CONFIG = "application/vnd.cncf.model.config.v1+json"
WEIGHT = "application/vnd.cncf.model.weight.v1.raw"
WEIGHT_CONFIG = "application/vnd.cncf.model.weight.config.v1.raw"
DOC = "application/vnd.cncf.model.doc.v1.raw"
CODE = "application/vnd.cncf.model.code.v1.raw"
TITLE = "org.opencontainers.image.title"
FILEPATH = "org.cncf.model.filepath"  # ModelPack's own name for the same path

# What a device believes of a registry: a manifest lists a version's files (a handful; 4 MiB
# is some 10,000 layers), the index lists every model's versions.
MAX_MANIFEST_BYTES = 4 << 20
MAX_INDEX_BYTES = 4 << 20
MAX_LAYERS = 10_000
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
# The distribution spec's grammar of a repository name and of a tag.
_REPO_PART = re.compile(r"^[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*$")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$")
_LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1", "[::1]"})


class RegistryError(Exception):
    """The registry cannot be read now (unreachable, refused, an error status)."""


class ContentRejected(Exception):
    """What the registry sent is not what was asked for (digest, size, format)."""


class NotInRegistry(Exception):
    """A manifest or blob the index pins is not in the registry (now): tried again later."""


def _is_loopback(host: str) -> bool:
    name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
    if name in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class OciLocation:
    url: str
    base: str  # http(s)://host:port
    repository: str  # fleet/models

    @classmethod
    def parse(cls, url: str) -> OciLocation:
        """`oci://host[:port]/repo[/...]`: HTTPS, or plain HTTP for a loopback host;
        `oci+http://` for plain HTTP elsewhere (a registry on a trusted network)."""
        prefixes = {"oci+https://": "https", "oci+http://": "http", "oci://": ""}
        prefix = next((p for p in prefixes if url.startswith(p)), None)
        if prefix is None:
            raise ValueError(f"'{url}' is not an oci:// location")
        rest, scheme = url[len(prefix) :], prefixes[prefix]
        host, _, path = rest.partition("/")
        path = path.strip("/")
        if not host or not path:
            raise ValueError(f"'{url}' names no repository (expected oci://host[:port]/repository)")
        bad = [part for part in path.split("/") if not _REPO_PART.match(part)]
        if bad:
            raise ValueError(
                f"'{url}': '{bad[0]}' is not a registry repository name (lowercase letters, "
                "digits and . _ - between them)"
            )
        scheme = scheme or ("http" if _is_loopback(host) else "https")
        return cls(url, f"{scheme}://{host}", path)

    @property
    def source_id(self) -> str:
        readable = re.sub(r"[^A-Za-z0-9._-]+", "_", f"oci_{self.repository}").strip("_")
        digest = hashlib.sha256(self.url.encode()).hexdigest()[:10]
        return f"{readable[:60]}-{digest}"


@dataclass(frozen=True)
class Descriptor:
    digest: str
    size: int
    media_type: str = ""

    def as_json(self) -> dict[str, Any]:
        return {"mediaType": self.media_type, "digest": self.digest, "size": self.size}


@dataclass(frozen=True)
class ModelEntry:
    """One model of the index: its model-level artifact (None: no files beside the version
    folders) and each version's artifact."""

    files: Descriptor | None
    versions: dict[int, Descriptor]


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _descriptor(value: Any, what: str) -> Descriptor:
    if not isinstance(value, dict):
        raise ContentRejected(f"{what}: not a descriptor")
    digest, size = value.get("digest"), value.get("size")
    if not isinstance(digest, str) or not _DIGEST.match(digest):
        raise ContentRejected(f"{what}: digest {digest!r} is not sha256:<64 hex digits>")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise ContentRejected(f"{what}: size {size!r} is not a byte count")
    media_type = value.get("mediaType", "")
    return Descriptor(digest, size, media_type if isinstance(media_type, str) else "")


def parse_manifest(raw: bytes, what: str) -> dict[str, Any]:
    try:
        manifest = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise ContentRejected(f"{what} is not JSON: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("schemaVersion") != 2:
        raise ContentRejected(f"{what} is not an OCI image manifest (schemaVersion 2)")
    return manifest


def parse_index(raw: bytes) -> tuple[dict[str, ModelEntry], dict[str, str]]:
    """Pure: the index document -> model name -> entry, and model -> why it is left out."""
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise ContentRejected(f"the repository index is not JSON: {exc}") from None
    models = data.get("models") if isinstance(data, dict) else None
    if not isinstance(models, dict):
        raise ContentRejected("the repository index has no 'models' object")
    found: dict[str, ModelEntry] = {}
    problems: dict[str, str] = {}
    for name, entry in models.items():
        why = name_problem(name) or ("not a folder name" if _unsafe_part(name) else "")
        if why or not isinstance(entry, dict):
            problems[name] = why or "its entry is not an object"
            continue
        try:
            files = entry.get("files")
            versions: dict[int, Descriptor] = {}
            listed = entry.get("versions", {})
            if not isinstance(listed, dict):
                raise ContentRejected("'versions' is not an object")
            for text, value in listed.items():
                number = version_number(text)
                if number is None:
                    raise ContentRejected(f"'{text}' is not a version number")
                versions[number] = _descriptor(value, f"version {text}")
            found[name] = ModelEntry(
                _descriptor(files, "model files") if files is not None else None, versions
            )
        except ContentRejected as exc:
            problems[name] = str(exc)
    return found, problems


def index_document(models: Mapping[str, ModelEntry]) -> bytes:
    doc = {
        "schema": 1,
        "models": {
            name: {
                **({"files": entry.files.as_json()} if entry.files else {}),
                "versions": {str(v): d.as_json() for v, d in sorted(entry.versions.items())},
            }
            for name, entry in sorted(models.items())
        },
    }
    return json.dumps(doc, indent=1, sort_keys=True).encode()


def _unsafe_part(part: str) -> bool:
    return part in ("", ".", "..") or "/" in part or "\\" in part or "\0" in part


def artifact_files(manifest: dict[str, Any], what: str) -> dict[str, Descriptor]:
    """Pure: a model artifact's layers -> relative path -> descriptor. A layer without a
    path, a path outside the folder, twice, or both a file and a folder rejects it whole."""
    layers = manifest.get("layers")
    if not isinstance(layers, list):
        raise ContentRejected(f"{what} has no layers list")
    if len(layers) > MAX_LAYERS:
        raise ContentRejected(f"{what} has {len(layers)} layers, more than {MAX_LAYERS}")
    files: dict[str, Descriptor] = {}
    for number, layer in enumerate(layers):
        descriptor = _descriptor(layer, f"{what} layer {number}")
        notes = layer.get("annotations") if isinstance(layer, dict) else None
        path = notes.get(TITLE) if isinstance(notes, dict) else None
        if not isinstance(path, str) or not path:
            raise ContentRejected(f"{what} layer {number} has no {TITLE} annotation")
        parts = path.split("/")
        if PurePosixPath(path).is_absolute() or any(_unsafe_part(p) for p in parts):
            raise ContentRejected(f"{what}: layer path '{path}' leaves the model folder")
        bad = next(filter(None, (name_problem(p) for p in parts)), "")
        if bad:
            raise ContentRejected(f"{what}: layer path '{path}': {bad}")
        if path in files:
            raise ContentRejected(f"{what}: '{path}' is two layers")
        files[path] = descriptor
    folders = {"/".join(p.split("/")[:i]) for p in files for i in range(1, p.count("/") + 1)}
    clash = sorted(folders & set(files))
    if clash:
        raise ContentRejected(f"{what}: '{clash[0]}' is both a file and a folder")
    return files


def layer_type(rel: str) -> str:
    """The ModelPack media type of a file of a Triton model folder."""
    name = rel.rsplit("/", 1)[-1].lower()
    if name.endswith((".py", ".so")):
        return CODE
    if name.endswith((".md", ".rst")) or (name.endswith(".txt") and "label" not in name):
        return DOC
    if name.endswith((".pbtxt", ".json", ".yaml", ".yml", ".txt", ".sig")) or name == "sha256sums":
        return WEIGHT_CONFIG
    return WEIGHT


def artifact_manifest(config: Descriptor, files: Mapping[str, Descriptor]) -> dict[str, Any]:
    """An OCI image manifest for a model artifact (ModelPack's artifact type)."""
    return {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "artifactType": MODEL_ARTIFACT,
        "config": config.as_json(),
        "layers": [
            {**d.as_json(), "annotations": {TITLE: rel, FILEPATH: rel}}
            for rel, d in sorted(files.items())
        ],
    }


def model_config(name: str, version: str, files: Mapping[str, Descriptor]) -> bytes:
    """ModelPack's model config blob for an artifact."""
    doc = {
        "descriptor": {"name": name, "version": version},
        "config": {},
        "modelfs": {"type": "layers", "diffIds": [d.digest for _, d in sorted(files.items())]},
    }
    return json.dumps(doc, sort_keys=True).encode()


def version_tag(model: str, version: int | str) -> str | None:
    tag = f"{model}.{version}"
    return tag if _TAG.match(tag) else None


def _credentials() -> str | None:
    """HTTP Basic credentials for the registry: EDGE_OCI_USERNAME / EDGE_OCI_PASSWORD."""
    user = os.environ.get("EDGE_OCI_USERNAME")
    if not user:
        return None
    secret = os.environ.get("EDGE_OCI_PASSWORD", "")
    return "Basic " + base64.b64encode(f"{user}:{secret}".encode()).decode()


def _challenge(header: str) -> dict[str, str]:
    """`Bearer realm="...",service="...",scope="..."` -> its parameters."""
    return dict(re.findall(r'(\w+)="([^"]*)"', header))


class Registry:
    """The distribution API calls on one repository, over one aiohttp session. Basic
    credentials from the environment; a `Bearer` challenge is answered with a token from its
    realm (anonymous, or with those credentials)."""

    def __init__(self, location: OciLocation, timeout_s: float) -> None:
        self.location = location
        self.timeout_s = timeout_s
        self.requests = 0
        self.uploaded_bytes = 0  # by `oci push`
        self._session: Any = None
        self._auth: str | None = _credentials()

    async def __aenter__(self) -> Registry:
        import aiohttp

        timeout = aiohttp.ClientTimeout(
            total=None, connect=self.timeout_s, sock_read=self.timeout_s
        )
        self._session = aiohttp.ClientSession(timeout=timeout, auto_decompress=False)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._session.close()

    def _url(self, path: str) -> str:
        return f"{self.location.base}/v2/{self.location.repository}/{path}"

    async def request(self, method: str, url: str, **kwargs: Any) -> Any:
        """One call (a response to be used as a context manager); a 401 with a Bearer
        challenge gets a token and is tried once more."""
        import aiohttp

        headers = dict(kwargs.pop("headers", {}))
        for attempt in range(2):
            if self._auth:
                headers["Authorization"] = self._auth
            self.requests += 1
            try:
                response = await self._session.request(method, url, headers=headers, **kwargs)
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
                raise RegistryError(
                    f"{self.location.url}: cannot reach the registry: {exc}"
                ) from exc
            header = response.headers.get("WWW-Authenticate", "")
            if response.status != 401 or attempt or not header.lower().startswith("bearer"):
                return response
            response.release()
            await self._token(_challenge(header))
        raise AssertionError("unreachable")

    async def _token(self, challenge: dict[str, str]) -> None:
        realm = challenge.get("realm")
        if not realm:
            raise RegistryError(f"{self.location.url}: a Bearer challenge without a realm")
        params = {k: v for k, v in challenge.items() if k in ("service", "scope")}
        basic = _credentials()
        headers = {"Authorization": basic} if basic else {}
        self.requests += 1
        async with self._session.get(realm, params=params, headers=headers) as response:
            if response.status != 200:
                raise RegistryError(
                    f"{self.location.url}: the token service refused ({response.status})"
                )
            body = await response.content.read(64 << 10)
        try:
            data = json.loads(body)
            token = data.get("token") or data.get("access_token")
        except (ValueError, AttributeError):
            token = None
        if not isinstance(token, str):
            raise RegistryError(f"{self.location.url}: the token service sent no token")
        self._auth = f"Bearer {token}"

    def _status_error(self, status: int, what: str) -> RegistryError:
        why = {401: "unauthorized (EDGE_OCI_USERNAME / EDGE_OCI_PASSWORD)", 403: "forbidden"}
        return RegistryError(
            f"{self.location.url}: {what} failed: HTTP {status}"
            + (f", {why[status]}" if status in why else "")
        )

    async def read(self, kind: str, ref: str, max_bytes: int, what: str) -> bytes | None:
        """A manifest (`kind` "manifests") or small blob ("blobs"), at most `max_bytes`;
        None when the registry has no such thing (404)."""
        headers = {"Accept": OCI_MANIFEST} if kind == "manifests" else {}
        async with await self.request("GET", self._url(f"{kind}/{ref}"), headers=headers) as r:
            if r.status == 404:
                return None
            if r.status != 200:
                raise self._status_error(r.status, f"reading {what}")
            data = bytearray()
            while chunk := await r.content.read(max(1, min(1 << 20, max_bytes + 1 - len(data)))):
                data += chunk
                if len(data) > max_bytes:
                    raise ContentRejected(f"{what} is larger than the {max_bytes} bytes it may be")
            return bytes(data)

    async def blob_chunks(self, digest: str, start: int, chunk: int) -> AsyncIterator[bytes]:
        """A blob's bytes from `start` (a Range request when above 0)."""
        headers = {"Range": f"bytes={start}-"} if start else {}
        async with await self.request("GET", self._url(f"blobs/{digest}"), headers=headers) as r:
            if r.status == 404:
                raise NotInRegistry(f"blob {digest} is not in the registry")
            if r.status == 416:
                raise ContentRejected(f"blob {digest} is shorter than its manifest says")
            if r.status not in (200, 206):
                raise self._status_error(r.status, f"downloading blob {digest}")
            skip = start if r.status == 200 else 0  # a registry that ignored the Range
            while data := await r.content.read(chunk):
                if skip:
                    dropped = min(skip, len(data))
                    data, skip = data[dropped:], skip - dropped
                if data:
                    yield data

    # ---- pushing (the operator's `edge-appliance oci push`) -----------------------------

    async def has_blob(self, digest: str) -> bool:
        async with await self.request("HEAD", self._url(f"blobs/{digest}")) as response:
            return bool(response.status == 200)

    async def upload(self, digest: str, body: Any, size: int) -> None:
        """A monolithic upload: POST for a session, PUT of the bytes with their digest."""
        async with await self.request("POST", self._url("blobs/uploads/")) as response:
            if response.status != 202 or "Location" not in response.headers:
                raise self._status_error(response.status, "starting an upload")
            location = response.headers["Location"]
        if location.startswith("/"):
            location = self.location.base + location
        headers = {"Content-Type": "application/octet-stream", "Content-Length": str(size)}
        async with await self.request(
            "PUT", location, params={"digest": digest}, data=body, headers=headers
        ) as response:
            if response.status != 201:
                raise self._status_error(response.status, f"uploading blob {digest}")

    async def put_manifest(self, ref: str, manifest: bytes) -> None:
        headers = {"Content-Type": OCI_MANIFEST}
        async with await self.request(
            "PUT", self._url(f"manifests/{ref}"), data=manifest, headers=headers
        ) as response:
            if response.status != 201:
                text = (await response.content.read(2048)).decode(errors="replace")
                raise RegistryError(
                    f"{self.location.url}: writing manifest '{ref}' failed: HTTP "
                    f"{response.status} {text.strip()}"
                )
