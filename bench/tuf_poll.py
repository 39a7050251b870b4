"""What an idle poll costs: TUF metadata mode vs signed-manifest mode (issue 33).

    python -m bench.tuf_poll [--models N] [--polls P]

One bucket of N models (config.pbtxt + one version of model.onnx), signed both ways: a
SHA256SUMS + SHA256SUMS.sig per version and per model folder (manifest mode) and TUF metadata
over every file (`fleet sign`). Each mode's source syncs once (taking everything), then polls P
times with nothing changed; the S3 requests it makes and the bytes the endpoint sends (counted
at a TCP proxy in front of moto) are reported per idle poll.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import tempfile
import uuid
from pathlib import Path
from typing import Any

from appliance.fleet import tuf_keys
from appliance.fleet.bucket import FleetBucket
from appliance.repository.manifest import ManifestPolicy
from appliance.repository.s3 import S3Source
from appliance.repository.tuf_source import TufSource
from tests.s3servers import moto_server
from tests.tcpproxy import TcpProxy

CONFIG = b'name: "m"\nplatform: "onnxruntime_onnx"\n'


def _manifest(files: dict[str, bytes]) -> bytes:
    return "".join(f"{hashlib.sha256(d).hexdigest()}  {n}\n" for n, d in files.items()).encode()


def _fill(client: Any, bucket: str, models: int, key: Any) -> None:
    def put(rel: str, data: bytes) -> None:
        client.put_object(Bucket=bucket, Key=f"models/{rel}", Body=data)

    for i in range(models):
        name = f"m{i}"
        version = {"model.onnx": os.urandom(4096)}
        model_level = {"config.pbtxt": CONFIG.replace(b'"m"', f'"{name}"'.encode())}
        for folder, files in ((f"{name}/1", version), (name, model_level)):
            manifest = _manifest(files)
            for file, data in files.items():
                put(f"{folder}/{file}", data)
            put(f"{folder}/SHA256SUMS.sig", key.sign(manifest))
            put(f"{folder}/SHA256SUMS", manifest)


async def _idle(source: S3Source, proxy: TcpProxy, polls: int) -> tuple[float, float]:
    async with source.opened():
        await source.sync()  # takes everything
        requests, sent = source.requests, proxy.bytes_to_clients
        for _ in range(polls):
            assert await source.sync() == set()
        return (source.requests - requests) / polls, (proxy.bytes_to_clients - sent) / polls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=int, default=20)
    parser.add_argument("--polls", type=int, default=10)
    args = parser.parse_args()
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    with moto_server() as s3, tempfile.TemporaryDirectory() as tmp:
        os.environ.update(s3.env())
        proxy = TcpProxy(s3.host_port)
        try:
            bucket = f"b-{uuid.uuid4().hex[:10]}"
            s3.make_bucket(bucket)
            _fill(s3.client(), bucket, args.models, key)
            url = f"s3://{proxy.address}/{bucket}/models"
            keys = Path(tmp) / "keys"
            tuf_keys.create_keys(keys, {})
            tuf_keys.sign_bucket(FleetBucket(url), keys)
            manifest = S3Source(url, Path(tmp) / "a", 0, ManifestPolicy(True, key.public_key()))
            tuf = TufSource(
                url,
                Path(tmp) / "b",
                0,
                ManifestPolicy(),
                trusted_root=(keys / "1.root.json").read_bytes(),
            )
            results = {}
            for name, source in (("manifest", manifest), ("tuf", tuf)):
                results[name] = asyncio.run(_idle(source, proxy, args.polls))
        finally:
            proxy.stop()
    print(f"idle poll, {args.models} models, mean of {args.polls} polls:")
    for name, (requests, sent) in results.items():
        print(f"  {name:8s} {requests:5.1f} requests  {sent / 1024:7.1f} KiB from the endpoint")


if __name__ == "__main__":
    main()
