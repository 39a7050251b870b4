"""The HTTP infer route without aiohttp (appliance/frontends/http/fastpath.py) in the real
server, with tritonclient: infer requests are answered by it, everything else by aiohttp, on
the same keep-alive connections, and what the route adds or drops shows from outside."""

from __future__ import annotations

import gzip
import http.client
import json

import numpy as np
import tritonclient.http as httpclient

from tests.serverproc import ServerProcess


def _inputs(binary: bool) -> list[httpclient.InferInput]:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = []
    for name, data in (("INPUT0", a), ("INPUT1", np.ones_like(a))):
        tensor = httpclient.InferInput(name, [1, 16], "INT32")
        tensor.set_data_from_numpy(data, binary_data=binary)
        inputs.append(tensor)
    return inputs


def test_infer_is_answered_by_the_route_and_metadata_by_aiohttp(server: ServerProcess) -> None:
    conn = http.client.HTTPConnection(server.http_url, timeout=30)
    body = json.dumps(
        {
            "inputs": [
                {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": list(range(16))},
                {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": [1] * 16},
            ]
        }
    )
    for _ in range(2):  # one keep-alive connection, alternating
        conn.request("GET", "/v2/models/simple")
        meta = conn.getresponse()
        assert meta.status == 200
        assert json.loads(meta.read())["name"] == "simple"
        # Both write aiohttp's Server header and a Date; the infer route writes them first,
        # aiohttp last: the order says who answered.
        assert [name for name, _ in meta.getheaders()][-2:] == ["Date", "Server"]
        conn.request("POST", "/v2/models/simple/infer", body)
        answer = conn.getresponse()
        assert answer.status == 200
        assert [name for name, _ in answer.getheaders()][:2] == ["Server", "Date"]
        assert answer.getheader("Server") == meta.getheader("Server")
        outputs = {o["name"]: o["data"] for o in json.loads(answer.read())["outputs"]}
        assert outputs["OUTPUT0"] == [i + 1 for i in range(16)]
    conn.close()


def test_tritonclient_binary_json_and_compression_through_the_route(
    server: ServerProcess,
) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    for binary in (True, False):
        for algorithm in (None, "gzip", "deflate"):
            result = client.infer(
                "simple",
                _inputs(binary),
                request_compression_algorithm=algorithm,  # relayed: aiohttp decodes the body
                response_compression_algorithm=algorithm,
            )
            np.testing.assert_array_equal(
                result.as_numpy("OUTPUT0"), np.arange(1, 17, dtype=np.int32).reshape(1, 16)
            )
    stats = client.get_inference_statistics("simple")["model_stats"][0]
    assert int(stats["inference_count"]) >= 6


def test_errors_through_the_route_keep_tritons_words(server: ServerProcess) -> None:
    conn = http.client.HTTPConnection(server.http_url, timeout=30)
    conn.request("POST", "/v2/models/no_such_model/infer", b"{}")
    missing = conn.getresponse()
    assert missing.status in (400, 404)
    assert "no_such_model" in json.loads(missing.read())["error"]
    conn.request("POST", "/v2/models/simple/infer", b"not json")
    bad = conn.getresponse()
    assert bad.status == 400
    assert "error" in json.loads(bad.read())
    # The connection is still good after both errors.
    conn.request(
        "POST", "/v2/models/simple/infer", gzip.compress(b"{}"), {"Content-Encoding": "gzip"}
    )
    assert conn.getresponse().status == 400
    conn.close()
