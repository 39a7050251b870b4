"""--http-restricted-api / --grpc-restricted-protocol, over both protocols, with tritonclient."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from appliance.common.access import parse_groups

ADMIN = "model-repository,shared-memory,logging,model-config:admin-key=s3cret"


@pytest.fixture(scope="module")
def restricted(model_repository: Path, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    from tests.serverproc import ServerProcess

    proc = ServerProcess(
        model_repository,
        "--model-control-mode=explicit",
        "--load-model=simple",
        f"--http-restricted-api={ADMIN}",
        f"--grpc-restricted-protocol={ADMIN}",
        "--http-restricted-api=inference:infer-key=abc",
        log_path=tmp_path_factory.mktemp("restricted") / "server.log",
    )
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()


def _simple_inputs(module):  # type: ignore[no-untyped-def]
    inputs = [
        module.InferInput("INPUT0", [1, 16], "INT32"),
        module.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    for inp in inputs:
        inp.set_data_from_numpy(np.ones((1, 16), np.int32))
    return inputs


def test_http_restricted_apis_need_their_header(restricted) -> None:  # type: ignore[no-untyped-def]
    client = httpclient.InferenceServerClient(restricted.http_url)
    assert client.is_server_ready()  # health is open
    with pytest.raises(InferenceServerException, match="expecting header 'admin-key'") as err:
        client.unload_model("simple")
    assert err.value.status() == "403"
    assert client.is_model_ready("simple")  # the refused call did nothing
    with pytest.raises(InferenceServerException, match="admin-key"):
        client.get_model_config("simple", headers={"admin-key": "wrong"})
    config = client.get_model_config("simple", headers={"admin-key": "s3cret"})
    assert config["name"] == "simple"
    with pytest.raises(InferenceServerException, match="'infer-key'"):
        client.infer("simple", _simple_inputs(httpclient))
    result = client.infer("simple", _simple_inputs(httpclient), headers={"infer-key": "abc"})
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.full((1, 16), 2))
    assert client.get_log_settings(headers={"admin-key": "s3cret"})["log_verbose_level"] == 0


def test_status_data_is_restricted_with_what_it_shows(restricted) -> None:  # type: ignore[no-untyped-def]
    """/status.json shows the repository index and each model's configuration summary: with
    model-repository and model-config restricted, it needs their header too (issue 31, 12);
    the page itself shows nothing and stays open."""
    import urllib.error
    import urllib.request

    url = f"http://{restricted.http_url}/status.json"
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(url, timeout=10)
    assert refused.value.code == 403
    assert b"expecting header 'admin-key'" in refused.value.read()
    sent = urllib.request.Request(url, headers={"admin-key": "s3cret"})
    with urllib.request.urlopen(sent, timeout=10) as answer:
        assert b'"simple"' in answer.read()
    with urllib.request.urlopen(f"http://{restricted.http_url}/status", timeout=10) as page:
        assert page.status == 200
    assert "/status.json) shows what the restricted model-repository, model-config" in (
        restricted.log()
    )


def test_grpc_restricted_protocols_need_their_metadata(restricted) -> None:  # type: ignore[no-untyped-def]
    client = grpcclient.InferenceServerClient(restricted.grpc_url)
    assert client.is_server_live()
    with pytest.raises(InferenceServerException, match="triton-grpc-protocol-admin-key") as err:
        client.get_system_shared_memory_status()
    assert err.value.status() == "StatusCode.PERMISSION_DENIED"
    with pytest.raises(InferenceServerException, match="triton-grpc-protocol-admin-key"):
        client.unload_model("simple", headers={"triton-grpc-protocol-admin-key": "nope"})
    assert client.is_model_ready("simple")
    headers = {"triton-grpc-protocol-admin-key": "s3cret"}
    assert client.get_model_repository_index(headers=headers, as_json=True)["models"]
    # gRPC inference is not restricted (only the HTTP flag named it).
    result = client.infer("simple", _simple_inputs(grpcclient))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), np.zeros((1, 16)))


def test_stream_infer_is_checked_too(model_repository: Path, start_server) -> None:  # type: ignore[no-untyped-def]
    proc = start_server(model_repository, "--grpc-restricted-protocol=inference:k=v")
    client = grpcclient.InferenceServerClient(proc.grpc_url)
    errors: list[InferenceServerException] = []
    client.start_stream(callback=lambda result, error: errors.append(error))
    # The stream is refused as it opens; the send may already find it closed.
    with contextlib.suppress(InferenceServerException):
        client.async_stream_infer("simple", _simple_inputs(grpcclient))
    deadline = time.monotonic() + 30
    while not errors and time.monotonic() < deadline:
        time.sleep(0.05)
    client.stop_stream()
    assert errors
    assert "triton-grpc-protocol-k" in str(errors[0])


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("inference", "expected API"),
        ("nope:k=v", "unknown API 'nope'"),
        ("inference:k", "expected API"),
    ],
)
def test_bad_groups_are_refused(value: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_groups([value], "--http-restricted-api")
    with pytest.raises(ValueError, match="more than one group"):
        parse_groups(["inference:a=b", "inference,health:c=d"], "--http-restricted-api")
