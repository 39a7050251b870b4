"""`edge-appliance oci push MODEL_DIR... oci://host:port/repo`: model folders into a registry.

Each model folder becomes one artifact per version folder and one for its model-level files
(config.pbtxt, labels, SHA256SUMS and its signature: everything beside the version folders),
in the layout of appliance/repository/oci_registry.py. Blobs the registry already holds are not
uploaded again (an unchanged weight file between versions costs one HEAD). The repository index
is written last, with a model's entry replaced by what its folder holds now, so a device polling
in between sees the old index or the new one, never an artifact half pushed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from appliance.repository.local import version_number
from appliance.repository.manifest import SYNC_RECORD, files_in, model_level_files, sha256_of
from appliance.repository.oci_registry import (
    INDEX_TAG,
    INDEX_TYPE,
    MAX_INDEX_BYTES,
    MAX_MANIFEST_BYTES,
    MODEL_CONFIG,
    OCI_MANIFEST,
    ContentRejected,
    Descriptor,
    ModelEntry,
    OciLocation,
    Registry,
    RegistryError,
    artifact_manifest,
    digest_of,
    index_document,
    layer_type,
    model_config,
    parse_index,
    parse_manifest,
    version_tag,
)

PROG = "edge-appliance oci"


class PushError(Exception):
    """The push cannot be done (a folder, the registry); nothing was indexed."""


async def _blob(registry: Registry, path: Path | None, data: bytes | None, kind: str) -> Descriptor:
    """Upload one file (or bytes) unless the registry holds its digest already."""
    if path is not None:
        digest = "sha256:" + await asyncio.to_thread(sha256_of, path)
        size = (await asyncio.to_thread(path.stat)).st_size
    else:
        assert data is not None
        digest, size = digest_of(data), len(data)
    if not await registry.has_blob(digest):
        if path is not None:
            with path.open("rb") as handle:
                await registry.upload(digest, handle, size)
        else:
            await registry.upload(digest, data, size)
        registry.uploaded_bytes += size
    return Descriptor(digest, size, kind)


async def _artifact(
    registry: Registry, model: str, version: str, files: dict[str, Path]
) -> Descriptor:
    layers = {
        rel: await _blob(registry, path, None, layer_type(rel)) for rel, path in files.items()
    }
    config = await _blob(registry, None, model_config(model, version, layers), MODEL_CONFIG)
    manifest = _json(artifact_manifest(config, layers))
    digest = digest_of(manifest)
    await registry.put_manifest(version_tag(model, version or "files") or digest, manifest)
    return Descriptor(digest, len(manifest), OCI_MANIFEST)


def _json(document: object) -> bytes:
    return json.dumps(document, sort_keys=True).encode()


async def read_index(registry: Registry) -> dict[str, ModelEntry]:
    """The index the registry holds now ({} when it has none)."""
    raw = await registry.read("manifests", INDEX_TAG, MAX_MANIFEST_BYTES, "the index")
    if raw is None:
        return {}
    config = parse_manifest(raw, "the index").get("config") or {}
    digest, size = str(config.get("digest", "")), config.get("size")
    if not isinstance(size, int) or size > MAX_INDEX_BYTES:
        raise ContentRejected(f"the index document is {size} bytes")
    body = await registry.read("blobs", digest, size, "the index document")
    if body is None or digest_of(body) != digest:
        raise ContentRejected("the index document does not match its digest")
    return parse_index(body)[0]


async def write_index(registry: Registry, models: dict[str, ModelEntry]) -> str:
    """Upload the index document and point the `index` tag at it; its manifest digest."""
    document = index_document(models)
    config = await _blob(registry, None, document, INDEX_TYPE)
    manifest = _json(
        {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "artifactType": INDEX_TYPE,
            "config": config.as_json(),
            "layers": [],
        }
    )
    await registry.put_manifest(INDEX_TAG, manifest)
    return digest_of(manifest)


def _model_files(folder: Path) -> tuple[dict[str, Path], dict[int, dict[str, Path]]]:
    if not folder.is_dir():
        raise PushError(f"'{folder}' is not a model folder")
    level = {rel: p for rel, p in model_level_files(folder).items() if rel != SYNC_RECORD}
    versions: dict[int, dict[str, Path]] = {}
    for entry in sorted(folder.iterdir()):
        number = version_number(entry.name)
        if number is not None and entry.is_dir():
            versions[number] = {
                rel: entry / rel for rel in files_in(entry) if rel.rsplit("/", 1)[-1] != SYNC_RECORD
            }
    if not versions:
        raise PushError(f"'{folder}' has no version folders (1/, 2/, ...)")
    return level, versions


async def push(folders: Sequence[Path], url: str, timeout_s: float = 30.0) -> list[str]:
    """Push model folders; one line per artifact and the index's."""
    location = OciLocation.parse(url)
    planned = [(folder.name, *_model_files(folder)) for folder in folders]
    lines: list[str] = []
    async with Registry(location, timeout_s) as registry:
        try:
            models = await read_index(registry)
            for name, level, versions in planned:
                files = await _artifact(registry, name, "", level) if level else None
                pinned = {}
                for number, version_files in versions.items():
                    pinned[number] = await _artifact(registry, name, str(number), version_files)
                    lines.append(
                        f"model '{name}' version {number}: {len(version_files)} files, "
                        f"{pinned[number].digest}"
                    )
                models[name] = ModelEntry(files, pinned)
            digest = await write_index(registry, models)
        except (RegistryError, ContentRejected) as exc:
            raise PushError(str(exc)) from exc
        uploaded = registry.uploaded_bytes
    lines.append(f"{url}: index {digest} lists {len(models)} models; {uploaded} bytes uploaded")
    return lines


def parser(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.description = "Model repositories in an OCI registry (see docs/model-updates.md)."
    sub = p.add_subparsers(dest="oci_command", required=True, metavar="COMMAND")
    pushing = sub.add_parser(
        "push", help="push model folders as artifacts and update the repository index"
    )
    pushing.add_argument(
        "folders", nargs="+", type=Path, metavar="MODEL_DIR", help="model folders to push"
    )
    pushing.add_argument(
        "url",
        metavar="oci://HOST[:PORT]/REPOSITORY",
        help="the registry repository (plain HTTP on loopback or with oci+http://)",
    )
    pushing.add_argument(
        "--timeout-secs",
        type=float,
        default=30.0,
        metavar="S",
        help="each connect and read waits at most this long (default 30)",
    )
    return p


def main(argv: Sequence[str]) -> int:
    args = parser(argparse.ArgumentParser(prog=PROG)).parse_args(list(argv))
    try:
        lines = asyncio.run(push(args.folders, args.url, args.timeout_secs))
    except (PushError, ValueError) as exc:
        print(f"{PROG} push: {exc}", file=sys.stderr)  # noqa: T201
        return 1
    for line in lines:
        print(line)  # noqa: T201
    return 0
