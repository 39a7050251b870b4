"""Hostile input on the real server (issue 17): malformed bodies, shapes, file overrides and
config values are refused with a 4xx / INVALID_ARGUMENT that says what is wrong; refused loads
leave no files; config numbers cannot size memory or threads without bound; a client's bad
input is not logged as the server's error, nor without limit."""

from __future__ import annotations

import base64
import gzip
import http.client
import json
import socket
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from appliance.ops.memory import _malloc_trim
from configs.generate import SIMPLE_CONFIG, save, simple_model
from tests.integration.models import _add_constant_model
from tests.serverproc import ServerProcess

HUGE = 4611686018427387904  # 2**62
U64_MAX = 18446744073709551615
FRESH = {
    "name": "fresh",
    "backend": "onnxruntime",
    "max_batch_size": 4,
    "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
    "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
}
SIMPLE_JSON = {
    "name": "simple",
    "backend": "onnxruntime",
    "max_batch_size": 8,
}


def _repository(root: Path) -> Path:
    save(simple_model(), root / "simple" / "1" / "model.onnx")
    (root / "simple" / "config.pbtxt").write_text(SIMPLE_CONFIG)
    for name, extra in (
        ("too_many", "instance_group [ { count: 65, kind: KIND_CPU } ]\n"),
        (
            "huge_priorities",
            f"dynamic_batching {{ priority_levels: {U64_MAX} default_priority_level: 1 }}\n",
        ),
    ):
        save(simple_model(), root / name / "1" / "model.onnx")
        (root / name / "config.pbtxt").write_text(
            SIMPLE_CONFIG.replace('"simple"', f'"{name}"') + extra
        )
    return root


@pytest.fixture(scope="module")
def temp_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The server's TMPDIR: where it writes load requests' file overrides."""
    return tmp_path_factory.mktemp("server-tmp")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, temp_dir: Path) -> Iterator[ServerProcess]:
    proc = ServerProcess(
        _repository(tmp_path_factory.mktemp("repo")),
        "--model-control-mode=explicit",
        "--load-model=*",
        "--http-restricted-api=logging:admin-key=s3cret",
        "--allow-client-shm=true",
        log_path=tmp_path_factory.mktemp("logs") / "server.log",
        env={"TMPDIR": str(temp_dir)},
    )
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def stub(server: ServerProcess) -> Iterator[service_pb2_grpc.GRPCInferenceServiceStub]:
    with grpc.insecure_channel(server.grpc_url) as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


def _post(
    server: ServerProcess, path: str, body: bytes, headers: dict[str, str] | None = None
) -> tuple[int, str]:
    """Status and error message (or body) of a raw HTTP POST."""
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    try:
        conn.request("POST", path, body=body, headers=headers or {})
        resp = conn.getresponse()
        data = resp.read()
    finally:
        conn.close()
    try:
        return resp.status, json.loads(data)["error"]
    except (ValueError, KeyError, TypeError):
        return resp.status, data.decode(errors="replace")


def _raw(server: ServerProcess, request: bytes) -> bytes:
    """Send raw bytes, return everything the server answers until it closes."""
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=10) as sock:
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return data


def _infer_body(shape: list[int], data: list[Any]) -> bytes:
    doc = {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": shape, "data": data}]}
    return json.dumps(doc).encode()


def _override_folders(temp_dir: Path) -> list[Path]:
    return sorted(temp_dir.glob("edge-appliance-override-*"))


def _status_file(server: ServerProcess, field: str) -> int:
    for line in Path(f"/proc/{server.proc.pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{server.proc.pid}/status")


# ---- 5. malformed bodies and shapes ----------------------------------------------------------


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
@pytest.mark.parametrize("path", ["/v2/models/simple/infer", "/v2/repository/index"])
def test_a_corrupt_compressed_body_is_a_400(server, encoding: str, path: str) -> None:  # type: ignore[no-untyped-def]
    status, message = _post(server, path, b"not compressed at all", {"Content-Encoding": encoding})
    assert status == 400, message
    assert message == (
        f"request body is not valid {encoding} data, as its Content-Encoding says it is"
    )


@pytest.mark.parametrize("encoding", ["compress", "br", "gzip, deflate", "x-unknown"])
def test_an_unknown_content_encoding_is_a_415(server, encoding: str) -> None:  # type: ignore[no-untyped-def]
    status, message = _post(server, "/v2/repository/index", b"{}", {"Content-Encoding": encoding})
    assert status == 415, message
    assert message == (
        f"Content-Encoding '{encoding}' is not supported; send the request body as identity "
        "(uncompressed), gzip or deflate"
    )


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "identity"])
def test_supported_encodings_still_work(server, encoding: str) -> None:  # type: ignore[no-untyped-def]
    body = _infer_body([1, 16], list(range(16)))
    compressors: dict[str, Callable[[bytes], bytes]] = {
        "gzip": gzip.compress,
        "deflate": zlib.compress,
    }
    compress = compressors.get(encoding, bytes)
    compressed = compress(body)
    status, _ = _post(server, "/v2/models/simple/infer", compressed, {"Content-Encoding": encoding})
    assert status == 400  # INPUT1 is missing: the body was read and decoded
    client = httpclient.InferenceServerClient(server.http_url)
    inputs = [httpclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    for inp in inputs:
        inp.set_data_from_numpy(np.ones((1, 16), np.int32))
    algorithm = encoding if encoding != "identity" else None
    result = client.infer("simple", inputs, request_compression_algorithm=algorithm)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.full((1, 16), 2))


ZERO_HUGE = [HUGE, 0, HUGE]
ZERO_HUGE_MESSAGE = (
    f"model 'simple' input 'INPUT0': shape {ZERO_HUGE} is out of range: its dimensions other "
    f"than 0 multiply to {HUGE * HUGE}, more than {(2**63 - 1) // 8}"
)
DIMS_65_MESSAGE = "model 'simple' input 'INPUT0': shape has 65 dimensions, more than the 64 allowed"


def test_zero_elements_with_huge_dimensions_over_http(server) -> None:  # type: ignore[no-untyped-def]
    status, message = _post(server, "/v2/models/simple/infer", _infer_body(ZERO_HUGE, []))
    assert (status, message) == (400, ZERO_HUGE_MESSAGE)
    doc = {
        "inputs": [
            {
                "name": "INPUT0",
                "datatype": "INT32",
                "shape": ZERO_HUGE,
                "parameters": {"binary_data_size": 0},
            }
        ]
    }
    header = json.dumps(doc).encode()
    headers = {"Inference-Header-Content-Length": str(len(header))}
    status, message = _post(server, "/v2/models/simple/infer", header, headers)
    assert (status, message) == (400, ZERO_HUGE_MESSAGE)


def _grpc_infer(shape: list[int], raw: bytes | None) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name="simple")
    tensor = request.inputs.add(name="INPUT0", datatype="INT32")
    tensor.shape.extend(shape)
    if raw is not None:
        request.raw_input_contents.append(raw)
    return request


@pytest.mark.parametrize("raw", [b"", None], ids=["raw_input_contents", "contents"])
def test_zero_elements_with_huge_dimensions_over_grpc(stub, raw: bytes | None) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(_grpc_infer(ZERO_HUGE, raw))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == ZERO_HUGE_MESSAGE


def test_more_than_64_dimensions_over_http(server) -> None:  # type: ignore[no-untyped-def]
    status, message = _post(server, "/v2/models/simple/infer", _infer_body([1] * 65, [1]))
    assert (status, message) == (400, DIMS_65_MESSAGE)


@pytest.mark.parametrize("raw", [b"\0\0\0\0", None], ids=["raw_input_contents", "contents"])
def test_more_than_64_dimensions_over_grpc(stub, raw: bytes | None) -> None:  # type: ignore[no-untyped-def]
    request = _grpc_infer([1] * 65, raw)
    if raw is None:
        request.inputs[0].contents.int_contents.append(0)
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(request)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == DIMS_65_MESSAGE


# ---- 5 and 7. file overrides the file system refuses; nothing is left behind ------------------

MODEL = _add_constant_model(1).SerializeToString()
LONG = "a" * 300
REFUSED_FILES = {
    "long name": (
        {f"file:1/{LONG}": MODEL},
        f"model 'fresh': file override '1/{LONG}' cannot be written: File name too long",
    ),
    "file then folder": (
        {"file:1": MODEL, "file:1/model.onnx": MODEL},
        "model 'fresh': file override '1/model.onnx' cannot be written: File exists; the "
        "overrides name a path as both a file and a folder",
    ),
    "folder then file": (
        {"file:1/model.onnx": MODEL, "file:1": MODEL},
        "model 'fresh': file override '1/model.onnx' cannot be written: File exists; the "
        "overrides name a path as both a file and a folder",
    ),
    "NUL in a path": (
        {"file:1/model\0.onnx": MODEL},
        "model 'fresh': file override '1/model\\x00.onnx': a path cannot contain a NUL character",
    ),
    "path outside": (
        {"file:1/model.onnx": MODEL, "file:../../escape.onnx": MODEL},
        "failed to load 'fresh', failed to poll from model repository: file override path "
        "'../../escape.onnx' is not allowed",
    ),
}


@pytest.mark.parametrize("case", list(REFUSED_FILES))
@pytest.mark.parametrize("module", [httpclient, grpcclient])
def test_file_overrides_the_file_system_refuses(server, temp_dir, module, case: str) -> None:  # type: ignore[no-untyped-def]
    files, message = REFUSED_FILES[case]
    client = module.InferenceServerClient(
        server.http_url if module is httpclient else server.grpc_url
    )
    with pytest.raises(InferenceServerException) as info:
        client.load_model("fresh", config=json.dumps(FRESH), files=files)
    assert message in str(info.value)
    if "cannot be written" in message:  # the file system refused: tritonserver's words
        assert "failed to load 'fresh', failed to poll from model repository" in str(info.value)
    # the client's input: 400, where tritonserver answers 500 for a name the file system
    # refuses (its test_load_oversized_file_parameter: "TODO: 400 is more appropriate")
    assert info.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")
    assert _override_folders(temp_dir) == []
    assert client.is_server_live()


def test_a_number_as_file_content_allocates_nothing(server, stub, temp_dir) -> None:  # type: ignore[no-untyped-def]
    """bytes(10**12) would allocate a terabyte."""
    body = json.dumps(
        {"parameters": {"config": json.dumps(FRESH), "file:1/model.onnx": 10**12}}
    ).encode()
    status, message = _post(server, "/v2/repository/models/fresh/load", body)
    assert (status, message) == (
        400,
        "model 'fresh': file override '1/model.onnx' must be base64 text (HTTP) or bytes "
        "(gRPC), got int",
    )
    request = service_pb2.RepositoryModelLoadRequest(model_name="fresh")
    request.parameters["config"].string_param = json.dumps(FRESH)
    request.parameters["file:1/model.onnx"].int64_param = 10**12
    with pytest.raises(grpc.RpcError) as info:
        stub.RepositoryModelLoad(request)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details().endswith("must be base64 text (HTTP) or bytes (gRPC), got int")
    assert _override_folders(temp_dir) == []


def test_refused_loads_leave_no_files(server, temp_dir) -> None:  # type: ignore[no-untyped-def]
    """Each refusal path: bad base64, a config refused before instances, a model file that
    fails to load, too many instances; then a load that serves keeps its folder until unload."""
    big = b"\0" * (10 * 1024 * 1024)  # ~10 MB per refused request before the fix
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=120)
    body = json.dumps(
        {"parameters": {"config": json.dumps(FRESH), "file:1/model.onnx": "not base64!"}}
    ).encode()
    assert _post(server, "/v2/repository/models/fresh/load", body)[0] == 400
    refused = [
        (
            {**FRESH, "dynamic_batching": {"default_queue_policy": {"max_queue_size": "65537"}}},
            {"file:1/x": big},
        ),
        (FRESH, {"file:1/model.onnx": big}),  # not an ONNX model: the version fails
        ({**FRESH, "instance_group": [{"count": 65}]}, {"file:1/model.onnx": MODEL}),
    ]
    for config, files in refused:
        with pytest.raises(InferenceServerException):
            client.load_model("fresh", config=json.dumps(config), files=files)
        assert _override_folders(temp_dir) == [], config
    client.load_model("fresh", config=json.dumps(FRESH), files={"file:1/model.onnx": MODEL})
    assert len(_override_folders(temp_dir)) == 1  # the runtime serves from it
    client.unload_model("fresh")
    assert _override_folders(temp_dir) == []


# ---- 5. shared-memory key, restricted-API key --------------------------------------------------


def test_a_nul_in_a_shared_memory_key(server) -> None:  # type: ignore[no-untyped-def]
    message = (
        "shared memory region 'r': key 'a\\x00b' contains a NUL character, which no shared "
        "memory object's name can hold"
    )
    http = httpclient.InferenceServerClient(server.http_url)
    with pytest.raises(InferenceServerException) as info:
        http.register_system_shared_memory("r", "a\0b", 8)
    assert (info.value.status(), info.value.message()) == ("400", message)
    grpc_client = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException) as info:
        grpc_client.register_system_shared_memory("r", "a\0b", 8)
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert message in info.value.message()


@pytest.mark.parametrize("value", [b"\xe9\xff", "s3cr\u00e9t".encode(), b"s3cret\x80"])
def test_a_non_ascii_restricted_api_key_is_refused_not_an_error(server, value: bytes) -> None:  # type: ignore[no-untyped-def]
    answer = _raw(
        server,
        b"GET /v2/logging HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nadmin-key: "
        + value
        + b"\r\n\r\n",
    )
    assert answer.startswith(b"HTTP/1.1 403 "), answer
    assert b"expecting header 'admin-key' with the configured value (logging API)" in answer
    ok = _raw(
        server,
        b"GET /v2/logging HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
        b"admin-key: s3cret\r\n\r\n",
    )
    assert ok.startswith(b"HTTP/1.1 200 ")


# ---- 6. a model that fails to load ----------------------------------------------------------


@pytest.mark.parametrize("module", [httpclient, grpcclient])
def test_a_model_that_fails_to_load_fails_the_request(server, module) -> None:  # type: ignore[no-untyped-def]
    client = module.InferenceServerClient(
        server.http_url if module is httpclient else server.grpc_url
    )
    broken = {**FRESH, "name": "broken"}
    with pytest.raises(InferenceServerException) as info:
        client.load_model(
            "broken", config=json.dumps(broken), files={"file:1/model.onnx": b"not onnx"}
        )
    assert info.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")
    message = info.value.message()
    assert "load failed for model 'broken': version 1 is at UNAVAILABLE state: " in message
    assert "onnxruntime cannot load" in message
    assert not client.is_model_ready("broken")


@pytest.mark.parametrize("module", [httpclient, grpcclient])
def test_a_failed_reload_fails_the_request_and_the_loaded_version_serves(server, module) -> None:  # type: ignore[no-untyped-def]
    client = module.InferenceServerClient(
        server.http_url if module is httpclient else server.grpc_url
    )
    name = f"reloaded_{module.__name__.rsplit('.', 1)[-1]}"
    config = json.dumps({**FRESH, "name": name})
    client.load_model(name, config=config, files={"file:1/model.onnx": MODEL})
    with pytest.raises(InferenceServerException) as info:
        client.load_model(name, config=config, files={"file:1/model.onnx": b"not onnx"})
    assert f"load failed for model '{name}': version 1 is at UNAVAILABLE state: " in str(info.value)
    assert "the versions loaded before keep serving: [1]" in str(info.value)
    assert client.is_model_ready(name)
    client.unload_model(name)


# ---- 8 and 13. config numbers that size threads or memory ------------------------------------


def _index_reason(server: ServerProcess, name: str) -> tuple[str, str]:
    index = httpclient.InferenceServerClient(server.http_url).get_model_repository_index()
    row = next(r for r in index if r["name"] == name)
    return row["state"], row.get("reason", "")


def test_a_config_pbtxt_over_the_instance_cap_is_unavailable_with_the_reason(server) -> None:  # type: ignore[no-untyped-def]
    state, reason = _index_reason(server, "too_many")
    assert state == "UNAVAILABLE"
    assert reason.endswith(
        "(model 'too_many'): instance_group asks for 65 instances ('too_many_0' count 65), "
        "more than the 64 per model allowed (--max-instances-per-model)"
    )


def test_a_config_pbtxt_with_huge_priority_levels_is_served(server) -> None:  # type: ignore[no-untyped-def]
    """Any uint64 is accepted, as in Triton: the queues keep only the levels in use."""
    state, reason = _index_reason(server, "huge_priorities")
    assert state == "READY", reason


@pytest.mark.parametrize("module", [httpclient, grpcclient])
def test_a_load_over_the_instance_cap_is_refused_without_making_threads(server, module) -> None:  # type: ignore[no-untyped-def]
    client = module.InferenceServerClient(
        server.http_url if module is httpclient else server.grpc_url
    )
    threads = _status_file(server, "Threads")
    config = {**SIMPLE_JSON, "instance_group": [{"count": 2000, "kind": "KIND_CPU"}]}
    with pytest.raises(InferenceServerException) as info:
        client.load_model("simple", config=json.dumps(config))
    assert info.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")
    assert (
        "instance_group asks for 2000 instances ('simple_0' count 2000), more than the 64 per "
        "model allowed (--max-instances-per-model)"
    ) in info.value.message()
    assert _status_file(server, "Threads") < threads + 16  # 2,015 before the fix
    assert client.is_model_ready("simple")  # the loaded version keeps serving


@pytest.mark.parametrize("module", [httpclient, grpcclient])
def test_a_load_with_huge_priority_levels_serves_without_growing(server, module) -> None:  # type: ignore[no-untyped-def]
    """Queues were once made per level (23.8 GB for UINT64_MAX levels), then the count was
    bounded at 256; now any uint64 loads, as in Triton, and nothing is made per level."""
    client = module.InferenceServerClient(
        server.http_url if module is httpclient else server.grpc_url
    )
    rss_kb = _status_file(server, "VmRSS")
    config = {
        **SIMPLE_JSON,
        "dynamic_batching": {"priority_levels": str(U64_MAX), "default_priority_level": "1"},
    }
    try:
        client.load_model("simple", config=json.dumps(config))
        assert _status_file(server, "VmRSS") < rss_kb + 64 * 1024
        assert client.is_model_ready("simple")
    finally:
        client.load_model("simple")  # the repository's config again


def test_the_instance_cap_follows_its_flag(start_server, tmp_path) -> None:  # type: ignore[no-untyped-def]
    root = tmp_path / "repo"
    save(simple_model(), root / "simple" / "1" / "model.onnx")
    (root / "simple" / "config.pbtxt").write_text(SIMPLE_CONFIG)
    proc = start_server(root, "--model-control-mode=explicit", "--max-instances-per-model=2")
    client = httpclient.InferenceServerClient(proc.http_url)
    config = {**SIMPLE_JSON, "instance_group": [{"count": 3, "kind": "KIND_CPU"}]}
    with pytest.raises(InferenceServerException, match="more than the 2 per model allowed"):
        client.load_model("simple", config=json.dumps(config))


# ---- 11. logs --------------------------------------------------------------------------------


def test_malformed_requests_do_not_flood_the_log(server) -> None:  # type: ignore[no-untyped-def]
    before = len(server.log())
    for i in range(150):
        _raw(server, b"GET / HTTP/1.1\r\nBad Header %d\r\n\r\n" % i)
        _post(server, "/v2/models/simple/infer", b"garbage", {"Content-Encoding": "gzip"})
    new = server.log()[before:]
    assert "Traceback" not in new
    assert " ERROR " not in new
    lines = [line for line in new.splitlines() if "malformed HTTP request" in line]
    # Each malformed request logged ~556 bytes with its traceback before: ~170 KB for these.
    assert 0 < len(lines) <= 25, new[-2000:]
    assert len(new) < 8 * 1024, len(new)
    assert lines[0].split(" ", 3)[2:3] == ["INFO"]
    assert "malformed HTTP request: Invalid header token (400)" in new


def test_a_base64_file_override_still_loads(server, temp_dir) -> None:  # type: ignore[no-untyped-def]
    """The HTTP path of file overrides (base64 text) after the changes above."""
    body = json.dumps(
        {
            "parameters": {
                "config": json.dumps({**FRESH, "name": "b64"}),
                "file:1/model.onnx": base64.b64encode(MODEL).decode(),
            }
        }
    ).encode()
    assert _post(server, "/v2/repository/models/b64/load", body)[0] == 200
    client = httpclient.InferenceServerClient(server.http_url)
    assert client.is_model_ready("b64")
    client.unload_model("b64")
    assert _override_folders(temp_dir) == []


# ---- 12. memory ------------------------------------------------------------------------------


@pytest.mark.skipif(_malloc_trim() is None, reason="no malloc_trim in this C library")
def test_the_heap_trimmer_runs_without_grpc(start_server, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A burst of large HTTP bodies leaves freed heap with glibc; the trimmer gives it back
    (appliance/ops/memory.py), also when gRPC is off (it was started by the gRPC listener)."""
    root = tmp_path / "repo"
    save(simple_model(), root / "simple" / "1" / "model.onnx")
    (root / "simple" / "config.pbtxt").write_text(SIMPLE_CONFIG)
    proc = start_server(root, "--allow-grpc=false", "--log-verbose=1")
    assert "GRPCInferenceService" not in proc.log()
    tensors = [
        {"name": name, "datatype": "INT32", "shape": [1, 16], "data": list(range(16))}
        for name in ("INPUT0", "INPUT1")
    ]
    body = json.dumps({"inputs": tensors}).encode() + b" " * (8 << 20)  # 8 MiB of padding
    for _ in range(4):
        assert _post(proc, "/v2/models/simple/infer", body)[0] == 200
    deadline = time.monotonic() + 20  # the trimmer runs every 5 s
    while "appliance.ops.memory: malloc_trim: RSS" not in proc.log():
        assert time.monotonic() < deadline, proc.log()[-3000:]
        time.sleep(0.2)
