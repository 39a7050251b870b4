"""The running server names the backends it can serve with: in its log and in /v2's "build"."""

from __future__ import annotations

import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from appliance.ops import buildinfo
from appliance.services.control import extensions
from tests.serverproc import ServerProcess


def test_metadata_build_and_startup_log_list_the_backends(server: ServerProcess) -> None:
    expected = buildinfo.available_backends()
    assert "onnxruntime" in expected
    meta = httpclient.InferenceServerClient(server.http_url).get_server_metadata()
    assert meta["build"]["backends"] == expected
    assert meta["extensions"] == list(extensions())  # nothing non-standard added there
    # gRPC's ServerMetadataResponse has no such field; the standard ones are unchanged.
    grpc_meta = grpcclient.InferenceServerClient(server.grpc_url).get_server_metadata()
    assert list(grpc_meta.extensions) == list(extensions())
    assert f"backends available: {buildinfo.backends_line()}" in server.log()
