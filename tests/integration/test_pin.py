"""An operator's rollback: `edge-appliance pin MODEL VERSION` (a repository load request with
`pin_version`) serves that version alone, in poll mode too, through new pushes and restarts;
`unpin` goes back to the version policy. Real server processes, a real S3 server (moto).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2, service_pb2_grpc

from tests.integration.s3device import Device
from tests.integration.test_s3_repository import _wait_for
from tests.s3servers import S3Server, moto_server
from tests.serverproc import ROOT, ServerProcess

PINNED = "pinned to version 1 (unpin to follow the version policy)"


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with moto_server() as server:
        yield server


@pytest.fixture
def dev(start_server: Any, s3: S3Server, tmp_path: Path) -> Iterator[Device]:
    device = Device(start_server, s3, tmp_path)
    device.bucket.seed()
    device.bucket.put_version(2, 2)
    yield device
    device.link.stop()


def _status(proc: ServerProcess) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://{proc.http_url}/status.json", timeout=10) as resp:
        return dict(json.loads(resp.read()))


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-m", "appliance", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )


def test_a_pin_holds_through_pushes_and_restarts_until_unpinned(dev: Device) -> None:
    proc = dev.start(first=True)
    assert dev.added() == 2.0
    url = f"http://{proc.http_url}"

    done = _cli("pin", "m", "1", "--url", url)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "model 'm' pinned to version 1"
    assert dev.added() == 1.0  # at once: the request returns once version 1 serves
    assert PINNED in dev.row("1").get("reason", "")
    assert not dev.row("2")  # not served, not failed: not pinned
    status = _status(proc)  # the status page's data says so too
    assert f"model 'm': {PINNED}" in status["server"]["notes"]
    (model,) = [m for m in status["models"] if m["name"] == "m"]
    assert any(PINNED in v.get("reason", "") for v in model["versions"] if v["version"] == 1)
    dev.bucket.put_version(3, 3)  # a new push does not move a pinned model
    _wait_for(lambda: bool(list(dev.store.glob("models/*/m/3"))))
    _wait_for(lambda: "model 'm' changed in the repository" in proc.log() or
              "model 'm' arrived in the model store" in proc.log())
    assert dev.added() == 1.0

    dev.kill()
    dev.start()
    assert dev.added() == 1.0  # the pin is in the store's ledger
    dev.stop()
    dev.link.stop()
    proc = dev.start()  # offline too
    assert dev.added() == 1.0
    assert PINNED in dev.row("1").get("reason", "")
    dev.link.start()
    url = f"http://{proc.http_url}"

    missing = _cli("pin", "m", "7", "--url", url)
    assert missing.returncode == 1
    assert "cannot pin model 'm' to version 7: no version 7 in" in missing.stderr
    assert dev.added() == 1.0

    done = _cli("unpin", "m", "--url", proc.http_url)  # HOST:PORT: http://, as curl takes it
    assert done.returncode == 0, done.stderr
    assert dev.added() == 3.0  # the version policy again: the newest
    assert "pinned" not in dev.row("3").get("reason", "")
    dev.stop()
    dev.start()
    assert dev.added() == 3.0


def test_grpc_pins_with_the_load_request_parameter_and_bad_requests_are_refused(
    dev: Device,
) -> None:
    proc = dev.start(first=True)
    stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(proc.grpc_url))
    param = service_pb2.ModelRepositoryParameter
    stub.RepositoryModelLoad(
        service_pb2.RepositoryModelLoadRequest(
            model_name="m", parameters={"pin_version": param(int64_param=1)}
        )
    )
    assert dev.added() == 1.0
    for parameters, message in [
        ({"pin_version": param(string_param="one")}, "'pin_version' must be a version number"),
        # str.isdigit() is true for a superscript two, which int() refuses (issue 31, item 12).
        ({"pin_version": param(string_param="\u00b2")}, "'pin_version' must be a version number"),
        ({"unpin": param(bool_param=False)}, "'unpin' must be true"),
        (
            {"pin_version": param(int64_param=2), "config": param(string_param="{}")},
            "'pin_version' or 'unpin' comes alone in a load request (also given: config)",
        ),
    ]:
        with pytest.raises(grpc.RpcError) as refused:
            stub.RepositoryModelLoad(
                service_pb2.RepositoryModelLoadRequest(model_name="m", parameters=parameters)
            )
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert message in str(refused.value.details())
    assert dev.added() == 1.0
    client = grpcclient.InferenceServerClient(proc.grpc_url)
    with pytest.raises(Exception, match="not allowed if polling is enabled"):
        client.load_model("m")  # a plain load stays explicit-mode only
    stub.RepositoryModelLoad(
        service_pb2.RepositoryModelLoadRequest(
            model_name="m", parameters={"unpin": param(bool_param=True)}
        )
    )
    assert dev.added() == 2.0


def test_a_pin_to_a_version_that_cannot_load_is_refused_and_changes_nothing(
    dev: Device,
) -> None:
    dev.bucket.put_version(1, None)  # version 1 is corrupt now
    proc = dev.start(first=True)
    assert dev.added() == 2.0
    refused = _cli("pin", "m", "1", "--url", f"http://{proc.http_url}")
    assert refused.returncode == 1
    assert "cannot pin model 'm' to version 1: it did not load: onnxruntime cannot load" in (
        refused.stderr
    )
    assert dev.added() == 2.0
    assert "pinned" not in dev.row("2").get("reason", "")
    dev.kill()
    dev.start()
    assert dev.added() == 2.0  # the refused pin was not kept
