"""The request corpus, in the order it is sent (later cases see what earlier ones did:
statistics after known traffic, model control, sequences)."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from typing import Any

from tests.differential.harness import Case, Grpc, Http, b64

KNOWN = (
    "add_sub",
    "identity_bytes",
    "identity_int32",
    "repeat",
    "accumulate",
    "raises",
    "pipeline",
)
NAMES = (*KNOWN, "unknown_model")
_F4 = [1.0, 2.0, 3.0, 4.0]


def _server_metadata(answer: Any) -> Any:
    # the version and the extension list are the two servers' own
    body = answer.get("body")
    if isinstance(body, dict) and "extensions" in body:
        body = {key: value for key, value in body.items() if key not in ("version", "extensions")}
    return {**answer, "body": body}


def health() -> Iterator[Case]:
    for path in ("/v2/health/live", "/v2/health/ready"):
        yield Case(f"http GET {path}", Http("GET", path))
        yield Case(f"http POST {path} (wrong method)", Http("POST", path))
    yield Case("http GET /v2", Http("GET", "/v2"), _server_metadata)
    yield Case("http PUT /v2 (wrong method)", Http("PUT", "/v2"))
    for path in ("/", "/v2/nonsense", "/v2/models", "/v3/models/add_sub", "/v2/models/add_sub/x"):
        yield Case(f"http GET {path} (unknown route)", Http("GET", path))
    yield Case("grpc ServerLive", Grpc("ServerLive"))
    yield Case("grpc ServerReady", Grpc("ServerReady"))
    yield Case("grpc ServerMetadata", Grpc("ServerMetadata"), _server_metadata)


def per_model() -> Iterator[Case]:
    for name in NAMES:
        base = f"/v2/models/{name}"
        for suffix in (
            "",
            "/versions/1",
            "/versions/7",
            "/versions/abc",
            "/ready",
            "/versions/1/ready",
            "/versions/7/ready",
            "/config",
            "/versions/1/config",
            "/stats",
            "/versions/7/stats",
        ):
            yield Case(f"http GET {base}{suffix}", Http("GET", base + suffix))
        yield Case(f"http POST {base} (wrong method)", Http("POST", base))
        yield Case(f"http DELETE {base}/config (wrong method)", Http("DELETE", base + "/config"))
        for version in ("", "1", "7"):
            request = {"name": name, "version": version}
            for method in ("ModelReady", "ModelMetadata", "ModelConfig", "ModelStatistics"):
                yield Case(f"grpc {method} {name} v{version or '-'}", Grpc(method, (request,)))


def _add_sub_json(**extra: Any) -> dict[str, Any]:
    body = {
        "inputs": [
            {"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": _F4},
            {"name": "INPUT1", "shape": [1, 4], "datatype": "FP32", "data": _F4},
        ]
    }
    body.update(extra)
    return body


def _infer(name: str, body: Any, *headers: tuple[str, str]) -> Http:
    return Http("POST", f"/v2/models/{name}/infer", body, headers)


def http_inference() -> Iterator[Case]:
    yield Case("http infer add_sub", _infer("add_sub", _add_sub_json()))
    yield Case("http infer add_sub with id", _infer("add_sub", _add_sub_json(id="r1")))
    yield Case(
        "http infer add_sub one output",
        _infer("add_sub", _add_sub_json(outputs=[{"name": "OUTPUT1"}])),
    )
    yield Case("http infer add_sub empty outputs", _infer("add_sub", _add_sub_json(outputs=[])))
    yield Case(
        "http infer add_sub binary output",
        _infer(
            "add_sub",
            _add_sub_json(outputs=[{"name": "OUTPUT0", "parameters": {"binary_data": True}}]),
        ),
    )
    yield Case(
        "http infer add_sub unknown output",
        _infer("add_sub", _add_sub_json(id="r2", outputs=[{"name": "NOPE"}])),
    )
    body = _add_sub_json()
    body["inputs"][0]["shape"] = [1, 5]
    yield Case("http infer add_sub wrong shape", _infer("add_sub", body))
    body = _add_sub_json(id="r3")
    body["inputs"][0]["shape"] = [1, 5]
    yield Case("http infer add_sub wrong shape with id", _infer("add_sub", body))
    body = _add_sub_json()
    body["inputs"][0]["shape"] = [9, 4]
    body["inputs"][0]["data"] = _F4 * 9
    body["inputs"][1]["shape"] = [9, 4]
    body["inputs"][1]["data"] = _F4 * 9
    yield Case("http infer add_sub batch over max", _infer("add_sub", body))
    body = _add_sub_json()
    body["inputs"][0]["datatype"] = "INT32"
    body["inputs"][0]["data"] = [1, 2, 3, 4]
    yield Case("http infer add_sub wrong datatype", _infer("add_sub", body))
    body = _add_sub_json()
    body["inputs"][0]["datatype"] = "FP99"
    yield Case("http infer add_sub unknown datatype", _infer("add_sub", body))
    body = _add_sub_json()
    del body["inputs"][1]
    yield Case("http infer add_sub missing input", _infer("add_sub", body))
    body = _add_sub_json()
    body["inputs"].append({"name": "EXTRA", "shape": [1, 4], "datatype": "FP32", "data": _F4})
    yield Case("http infer add_sub extra input", _infer("add_sub", body))
    body = _add_sub_json()
    body["inputs"][0]["data"] = [1.0, 2.0]
    yield Case("http infer add_sub too little data", _infer("add_sub", body))
    body = _add_sub_json()
    body["inputs"][0]["data"] = [-999.0, 2.0, 3.0, 4.0]
    yield Case("http infer add_sub model error", _infer("add_sub", body))
    yield Case("http infer add_sub not json", _infer("add_sub", b"{not json"))
    yield Case("http infer add_sub empty body", _infer("add_sub", b""))
    yield Case("http infer add_sub no inputs", _infer("add_sub", {"inputs": []}))
    yield Case("http infer add_sub inputs not a list", _infer("add_sub", {"inputs": {}}))
    yield Case("http GET infer (wrong method)", Http("GET", "/v2/models/add_sub/infer"))
    for key, value in (
        ("sequence_start", "yes"),
        ("sequence_id", -1),
        ("priority", "high"),
        ("timeout", -5),
        ("binary_data_output", "yes"),
        ("custom", None),
        ("custom", {"a": 1}),
        ("custom", [1]),
        ("custom", "text"),
    ):
        yield Case(
            f"http infer add_sub parameter {key}={value!r}",
            _infer("add_sub", _add_sub_json(parameters={key: value})),
        )
    yield Case("http infer add_sub object id", _infer("add_sub", _add_sub_json(id={"a": 1})))
    yield Case(
        "http infer add_sub version 1",
        Http("POST", "/v2/models/add_sub/versions/1/infer", _add_sub_json()),
    )
    yield Case(
        "http infer add_sub version 7",
        Http("POST", "/v2/models/add_sub/versions/7/infer", _add_sub_json()),
    )
    yield Case(
        "http infer add_sub version arabic-indic one",
        Http("POST", "/v2/models/add_sub/versions/%D9%A1/infer", _add_sub_json()),
    )
    yield Case("http infer unknown model", _infer("unknown_model", _add_sub_json()))
    # binary inputs
    data = struct.pack("<4f", *_F4)
    header = _add_sub_json()
    for tensor in header["inputs"]:
        del tensor["data"]
        tensor["parameters"] = {"binary_data_size": 16}
    raw = json_bytes(header)
    yield Case(
        "http infer add_sub binary",
        _infer("add_sub", raw + data + data, ("Inference-Header-Content-Length", str(len(raw)))),
    )
    yield Case(
        "http infer add_sub binary short",
        _infer(
            "add_sub", raw + data + data[:8], ("Inference-Header-Content-Length", str(len(raw)))
        ),
    )
    yield Case(
        "http infer add_sub binary header length past body",
        _infer("add_sub", raw, ("Inference-Header-Content-Length", str(len(raw) + 10))),
    )
    yield Case(
        "http infer add_sub binary header length words",
        _infer("add_sub", raw, ("Inference-Header-Content-Length", "ten")),
    )
    # BYTES
    yield Case(
        "http infer identity_bytes",
        _infer(
            "identity_bytes",
            {"inputs": [{"name": "IN", "shape": [2], "datatype": "BYTES", "data": ["ab", "c"]}]},
        ),
    )
    prefixed = struct.pack("<I", 2) + b"ab" + struct.pack("<I", 50) + b"c"
    header_bytes = json_bytes(
        {
            "inputs": [
                {
                    "name": "IN",
                    "shape": [2],
                    "datatype": "BYTES",
                    "parameters": {"binary_data_size": len(prefixed)},
                }
            ]
        }
    )
    yield Case(
        "http infer identity_bytes prefix past data",
        _infer(
            "identity_bytes",
            header_bytes + prefixed,
            ("Inference-Header-Content-Length", str(len(header_bytes))),
        ),
    )
    yield Case(
        "http infer identity_bytes numbers",
        _infer(
            "identity_bytes",
            {"inputs": [{"name": "IN", "shape": [2], "datatype": "BYTES", "data": [1, 2]}]},
        ),
    )
    # raw binary request, INT32
    yield Case(
        "http infer identity_int32 raw binary",
        _infer(
            "identity_int32", struct.pack("<3i", 1, 2, 3), ("Inference-Header-Content-Length", "0")
        ),
    )
    yield Case(
        "http infer identity_int32",
        _infer(
            "identity_int32",
            {"inputs": [{"name": "IN", "shape": [3], "datatype": "INT32", "data": [1, 2, 3]}]},
        ),
    )
    yield Case(
        "http infer identity_int32 negative dim",
        _infer(
            "identity_int32",
            {"inputs": [{"name": "IN", "shape": [-3], "datatype": "INT32", "data": [1, 2, 3]}]},
        ),
    )
    yield Case(
        "http infer identity_int32 nested data",
        _infer(
            "identity_int32",
            {
                "inputs": [
                    {"name": "IN", "shape": [3], "datatype": "INT32", "data": [[1], [2], [3]]}
                ]
            },
        ),
    )
    yield Case(
        "http infer raises",
        _infer(
            "raises", {"inputs": [{"name": "IN", "shape": [1], "datatype": "INT32", "data": [1]}]}
        ),
    )
    yield Case(
        "http infer repeat (decoupled over unary)",
        _infer(
            "repeat",
            {"inputs": [{"name": "IN", "shape": [2], "datatype": "INT32", "data": [1, 2]}]},
        ),
    )
    yield Case(
        "http infer pipeline",
        _infer(
            "pipeline",
            {
                "inputs": [
                    {"name": "A", "shape": [1, 4], "datatype": "FP32", "data": _F4},
                    {"name": "B", "shape": [1, 4], "datatype": "FP32", "data": _F4},
                ]
            },
        ),
    )
    yield Case(
        "http infer pipeline missing input",
        _infer(
            "pipeline",
            {
                "id": "p",
                "inputs": [{"name": "A", "shape": [1, 4], "datatype": "FP32", "data": _F4}],
            },
        ),
    )


def json_bytes(value: Any) -> bytes:
    import json

    return json.dumps(value).encode()


def _accumulate(
    value: int, *, id_: Any, start: bool = False, end: bool = False, request_id: str = ""
) -> dict[str, Any]:
    params: dict[str, Any] = {"sequence_id": id_}
    if start:
        params["sequence_start"] = True
    if end:
        params["sequence_end"] = True
    body: dict[str, Any] = {
        "inputs": [{"name": "IN", "shape": [1, 1], "datatype": "INT32", "data": [value]}],
        "parameters": params,
    }
    if request_id:
        body["id"] = request_id
    return body


def sequences() -> Iterator[Case]:
    yield Case("http sequence start", _infer("accumulate", _accumulate(2, id_=11, start=True)))
    yield Case("http sequence next", _infer("accumulate", _accumulate(3, id_=11)))
    yield Case("http sequence end", _infer("accumulate", _accumulate(4, id_=11, end=True)))
    yield Case("http sequence after end", _infer("accumulate", _accumulate(4, id_=11)))
    yield Case(
        "http sequence no start", _infer("accumulate", _accumulate(1, id_=12, request_id="q"))
    )
    yield Case(
        "http sequence no id",
        _infer(
            "accumulate",
            {"inputs": [{"name": "IN", "shape": [1, 1], "datatype": "INT32", "data": [1]}]},
        ),
    )
    yield Case(
        "http sequence string id",
        _infer("accumulate", _accumulate(5, id_="abc", start=True, end=True)),
    )
    body = _accumulate(1, id_=13, start=True)
    body["inputs"][0]["shape"] = [2, 1]
    body["inputs"][0]["data"] = [1, 2]
    yield Case("http sequence batch of two", _infer("accumulate", body))
    stream = tuple(
        _grpc_int32("accumulate", [value], [1, 1], parameters=params)
        for value, params in (
            (1, {"sequence_id": {"int64_param": 21}, "sequence_start": {"bool_param": True}}),
            (2, {"sequence_id": {"int64_param": 21}}),
            (3, {"sequence_id": {"int64_param": 21}, "sequence_end": {"bool_param": True}}),
        )
    )
    yield Case("grpc stream sequence", Grpc("ModelStreamInfer", stream))
    yield Case(
        "grpc sequence start as int64",
        Grpc(
            "ModelInfer",
            (
                _grpc_int32(
                    "accumulate",
                    [1],
                    [1, 1],
                    parameters={
                        "sequence_id": {"int64_param": 22},
                        "sequence_start": {"int64_param": 1},
                    },
                ),
            ),
        ),
    )


def _grpc_int32(name: str, values: list[int], shape: list[int], **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model_name": name,
        "inputs": [{"name": "IN", "datatype": "INT32", "shape": shape}],
        "raw_input_contents": [b64(struct.pack(f"<{len(values)}i", *values))],
    }
    body.update(extra)
    return body


def _grpc_add_sub(**extra: Any) -> dict[str, Any]:
    data = b64(struct.pack("<4f", *_F4))
    body: dict[str, Any] = {
        "model_name": "add_sub",
        "inputs": [
            {"name": "INPUT0", "datatype": "FP32", "shape": [1, 4]},
            {"name": "INPUT1", "datatype": "FP32", "shape": [1, 4]},
        ],
        "raw_input_contents": [data, data],
    }
    body.update(extra)
    return body


def grpc_inference() -> Iterator[Case]:
    yield Case("grpc infer add_sub", Grpc("ModelInfer", (_grpc_add_sub(),)))
    yield Case("grpc infer add_sub with id", Grpc("ModelInfer", (_grpc_add_sub(id="g1"),)))
    yield Case(
        "grpc infer add_sub one output",
        Grpc("ModelInfer", (_grpc_add_sub(outputs=[{"name": "OUTPUT1"}]),)),
    )
    yield Case(
        "grpc infer add_sub unknown output",
        Grpc("ModelInfer", (_grpc_add_sub(outputs=[{"name": "NOPE"}]),)),
    )
    body = _grpc_add_sub()
    body["inputs"][0]["shape"] = [1, 5]
    yield Case("grpc infer add_sub wrong shape", Grpc("ModelInfer", (body,)))
    body = _grpc_add_sub()
    body["raw_input_contents"][0] = b64(b"\0" * 12)
    yield Case("grpc infer add_sub byte size mismatch", Grpc("ModelInfer", (body,)))
    body = _grpc_add_sub()
    body["raw_input_contents"] = body["raw_input_contents"][:1]
    yield Case("grpc infer add_sub one raw content", Grpc("ModelInfer", (body,)))
    body = _grpc_add_sub()
    body["inputs"][0]["datatype"] = "INT32"
    yield Case("grpc infer add_sub wrong datatype", Grpc("ModelInfer", (body,)))
    body = _grpc_add_sub()
    body["inputs"][0]["contents"] = {"fp32_contents": _F4}
    yield Case("grpc infer add_sub contents and raw", Grpc("ModelInfer", (body,)))
    body = _grpc_add_sub()
    body["raw_input_contents"][0] = b64(struct.pack("<4f", -999.0, 0, 0, 0))
    yield Case("grpc infer add_sub model error", Grpc("ModelInfer", (body,)))
    yield Case(
        "grpc infer add_sub version 7", Grpc("ModelInfer", (_grpc_add_sub(model_version="7"),))
    )
    yield Case(
        "grpc infer unknown model", Grpc("ModelInfer", (_grpc_add_sub(model_name="unknown_model"),))
    )
    yield Case("grpc infer raises", Grpc("ModelInfer", (_grpc_int32("raises", [1], [1]),)))
    yield Case(
        "grpc infer repeat (decoupled over unary)",
        Grpc("ModelInfer", (_grpc_int32("repeat", [1, 2], [2]),)),
    )
    yield Case(
        "grpc infer pipeline",
        Grpc(
            "ModelInfer",
            (
                {
                    **_grpc_add_sub(model_name="pipeline"),
                    "inputs": [
                        {"name": "A", "datatype": "FP32", "shape": [1, 4]},
                        {"name": "B", "datatype": "FP32", "shape": [1, 4]},
                    ],
                },
            ),
        ),
    )
    prefixed = struct.pack("<I", 2) + b"ab" + struct.pack("<I", 50) + b"c"
    yield Case(
        "grpc infer identity_bytes prefix past data",
        Grpc(
            "ModelInfer",
            (
                {
                    "model_name": "identity_bytes",
                    "inputs": [{"name": "IN", "datatype": "BYTES", "shape": [2]}],
                    "raw_input_contents": [b64(prefixed)],
                },
            ),
        ),
    )
    yield Case(
        "grpc stream repeat 3",
        Grpc("ModelStreamInfer", (_grpc_int32("repeat", [4, 5, 6], [3], id="s1"),)),
    )
    yield Case("grpc stream repeat 0", Grpc("ModelStreamInfer", (_grpc_int32("repeat", [], [0]),)))
    yield Case("grpc stream add_sub", Grpc("ModelStreamInfer", (_grpc_add_sub(id="s2"),)))
    yield Case(
        "grpc stream unknown model",
        Grpc("ModelStreamInfer", (_grpc_add_sub(model_name="unknown_model"),)),
    )
    body = _grpc_add_sub(id="s3")
    body["inputs"][0]["shape"] = [1, 5]
    yield Case("grpc stream add_sub wrong shape", Grpc("ModelStreamInfer", (body,)))
    yield Case(
        "grpc stream pipeline",
        Grpc(
            "ModelStreamInfer",
            (
                {
                    **_grpc_add_sub(model_name="pipeline"),
                    "inputs": [
                        {"name": "A", "datatype": "FP32", "shape": [1, 4]},
                        {"name": "B", "datatype": "FP32", "shape": [1, 4]},
                    ],
                },
            ),
        ),
    )


# Requests whose model refuses them (an unknown model, an unknown version, one with no ready
# version) and whose inputs are bad too: tritonserver looks the model up before it reads the
# inputs, so the model's error is the answer. (model, version, what the case id calls it)
REFUSED_MODELS = (("unknown_model", "", "unknown model"), ("add_sub", "7", "add_sub version 7"))
_PAST_END = struct.pack("<I", 2) + b"ab" + struct.pack("<I", 50) + b"c"


def _shm_input(grpc: bool = False) -> dict[str, Any]:
    region: dict[str, Any] = {"shared_memory_region": "nope", "shared_memory_byte_size": 16}
    if grpc:
        region = {
            "shared_memory_region": {"string_param": "nope"},
            "shared_memory_byte_size": {"int64_param": 16},
        }
    return {"name": "IN", "datatype": "FP32", "shape": [1, 4], "parameters": region}


def http_bad_inputs(model: str, version: str) -> Iterator[tuple[str, Http]]:
    """(what is bad, the request) for HTTP, JSON and binary."""
    path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/infer"
    short = {"inputs": [{"name": "IN", "shape": [1, 4], "datatype": "FP32", "data": [1.0]}]}
    yield "too little data", Http("POST", path, short)
    sized = {"name": "IN", "shape": [1, 4], "datatype": "FP32"}
    header = json_bytes({"inputs": [{**sized, "parameters": {"binary_data_size": 12}}]})
    length = ("Inference-Header-Content-Length", str(len(header)))
    yield "byte size mismatch", Http("POST", path, header + b"\0" * 12, (length,))
    strings = {"name": "IN", "shape": [2], "datatype": "BYTES"}
    size = {"binary_data_size": len(_PAST_END)}
    header = json_bytes({"inputs": [{**strings, "parameters": size}]})
    length = ("Inference-Header-Content-Length", str(len(header)))
    yield "bytes prefix past data", Http("POST", path, header + _PAST_END, (length,))
    region = {"inputs": [_shm_input()]}
    yield "unknown shm region", Http("POST", path, region)
    words = ("Inference-Header-Content-Length", "ten")
    yield "header length words", Http("POST", path, header + _PAST_END, (words,))


def grpc_bad_inputs(model: str, version: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """(what is bad, the request) for gRPC ModelInfer and ModelStreamInfer."""
    named = {"model_name": model, "model_version": version}
    sized = {"inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, 4]}]}
    yield "byte size mismatch", {**named, **sized, "raw_input_contents": [b64(b"\0" * 12)]}
    strings = {"inputs": [{"name": "IN", "datatype": "BYTES", "shape": [2]}]}
    yield "bytes prefix past data", {**named, **strings, "raw_input_contents": [b64(_PAST_END)]}
    yield "unknown shm region", {**named, "inputs": [_shm_input(grpc=True)]}


def refused_models(
    models: tuple[tuple[str, str, str], ...] = REFUSED_MODELS,
) -> Iterator[Case]:
    for model, version, called in models:
        for bad, request in http_bad_inputs(model, version):
            yield Case(f"http infer {called}, {bad}", request)
        for bad, body in grpc_bad_inputs(model, version):
            yield Case(f"grpc infer {called}, {bad}", Grpc("ModelInfer", (body,)))
            yield Case(f"grpc stream {called}, {bad}", Grpc("ModelStreamInfer", (body,)))


def decoupled_over_unary() -> Iterator[Case]:
    """A decoupled model over a unary call: refused for that (its transaction policy) before
    its inputs are read, as tritonserver checks it."""
    for bad, request in http_bad_inputs("repeat", ""):
        yield Case(f"http infer repeat {bad} (decoupled over unary)", request)
    for bad, body in grpc_bad_inputs("repeat", ""):
        yield Case(f"grpc infer repeat {bad} (decoupled over unary)", Grpc("ModelInfer", (body,)))


def shared_memory() -> Iterator[Case]:
    for kind in ("systemsharedmemory", "cudasharedmemory"):
        base = f"/v2/{kind}"
        yield Case(f"http GET {base}/status", Http("GET", f"{base}/status"))
        yield Case(f"http GET {base}/region/nope/status", Http("GET", f"{base}/region/nope/status"))
        yield Case(
            f"http POST {base}/region/nope/unregister",
            Http("POST", f"{base}/region/nope/unregister"),
        )
        yield Case(f"http POST {base}/unregister", Http("POST", f"{base}/unregister"))
    yield Case(
        "http register system shm missing key",
        Http(
            "POST",
            "/v2/systemsharedmemory/region/r1/register",
            {"key": "/edge-differential-missing", "offset": 0, "byte_size": 64},
        ),
    )
    yield Case(
        "http register system shm no key",
        Http("POST", "/v2/systemsharedmemory/region/r1/register", {"offset": 0, "byte_size": 64}),
    )
    yield Case(
        "http register system shm not json",
        Http("POST", "/v2/systemsharedmemory/region/r1/register", b"nope"),
    )
    yield Case(
        "http register cuda shm",
        Http(
            "POST",
            "/v2/cudasharedmemory/region/c1/register",
            {"raw_handle": {"b64": b64(b"\0" * 64)}, "device_id": 0, "byte_size": 64},
        ),
    )
    yield Case("grpc SystemSharedMemoryStatus", Grpc("SystemSharedMemoryStatus"))
    yield Case(
        "grpc SystemSharedMemoryStatus nope", Grpc("SystemSharedMemoryStatus", ({"name": "nope"},))
    )
    yield Case(
        "grpc SystemSharedMemoryRegister missing key",
        Grpc(
            "SystemSharedMemoryRegister",
            ({"name": "r1", "key": "/edge-differential-missing", "byte_size": 64},),
        ),
    )
    yield Case(
        "grpc SystemSharedMemoryUnregister nope",
        Grpc("SystemSharedMemoryUnregister", ({"name": "nope"},)),
    )
    yield Case("grpc CudaSharedMemoryStatus", Grpc("CudaSharedMemoryStatus"))
    yield Case(
        "grpc CudaSharedMemoryRegister",
        Grpc(
            "CudaSharedMemoryRegister",
            ({"name": "c1", "raw_handle": b64(b"\0" * 64), "device_id": 0, "byte_size": 64},),
        ),
    )
    yield Case(
        "http infer add_sub unknown shm region",
        _infer(
            "add_sub",
            {
                "inputs": [
                    {
                        "name": "INPUT0",
                        "shape": [1, 4],
                        "datatype": "FP32",
                        "parameters": {
                            "shared_memory_region": "nope",
                            "shared_memory_byte_size": 16,
                        },
                    },
                    {"name": "INPUT1", "shape": [1, 4], "datatype": "FP32", "data": _F4},
                ]
            },
        ),
    )


def trace_and_log() -> Iterator[Case]:
    yield Case("http GET /v2/trace/setting", Http("GET", "/v2/trace/setting"))
    yield Case("http GET add_sub trace setting", Http("GET", "/v2/models/add_sub/trace/setting"))
    yield Case(
        "http GET unknown_model trace setting",
        Http("GET", "/v2/models/unknown_model/trace/setting"),
    )
    for body in (
        {"trace_level": ["TIMESTAMPS"]},
        {"trace_level": ["BOGUS"]},
        {"bogus_key": "1"},
        {"trace_rate": "abc"},
        {"trace_rate": "5"},
        {"log_frequency": "2"},
        {"trace_level": ["OFF"]},
        {"trace_rate": None},
    ):
        yield Case(f"http POST /v2/trace/setting {body}", Http("POST", "/v2/trace/setting", body))
    yield Case("http GET /v2/trace/setting after", Http("GET", "/v2/trace/setting"))
    yield Case("grpc TraceSetting", Grpc("TraceSetting"))
    yield Case("grpc TraceSetting add_sub", Grpc("TraceSetting", ({"model_name": "add_sub"},)))
    yield Case("http GET /v2/logging", Http("GET", "/v2/logging"))
    for body in (
        {"log_verbose_level": 1},
        {"log_verbose_level": -1},
        {"log_info": "yes"},
        {"bogus": True},
        {"log_format": "ISO8601"},
        {"log_format": "nope"},
        {"log_verbose_level": 0},
        {"log_format": "default"},
    ):
        yield Case(f"http POST /v2/logging {body}", Http("POST", "/v2/logging", body))
    yield Case("grpc LogSettings", Grpc("LogSettings"))


def _load(name: str, body: Any = None) -> Http:
    return Http("POST", f"/v2/repository/models/{name}/load", body)


def model_control() -> Iterator[Case]:
    index = Http("POST", "/v2/repository/index", {})
    yield Case("http index", index)
    yield Case("http index ready", Http("POST", "/v2/repository/index", {"ready": True}))
    yield Case("http index ready not bool", Http("POST", "/v2/repository/index", {"ready": "x"}))
    yield Case("http GET index (wrong method)", Http("GET", "/v2/repository/index"))
    yield Case("grpc RepositoryIndex", Grpc("RepositoryIndex"))
    yield Case(
        "http unload identity_int32", Http("POST", "/v2/repository/models/identity_int32/unload")
    )
    yield Case("http index after unload", index)
    yield Case(
        "http GET identity_int32 ready after unload", Http("GET", "/v2/models/identity_int32/ready")
    )
    yield Case("http GET identity_int32 after unload", Http("GET", "/v2/models/identity_int32"))
    yield Case(
        "http GET identity_int32 stats after unload", Http("GET", "/v2/models/identity_int32/stats")
    )
    yield Case(
        "http infer identity_int32 after unload",
        _infer(
            "identity_int32",
            {"inputs": [{"name": "IN", "shape": [1], "datatype": "INT32", "data": [1]}]},
        ),
    )
    yield from refused_models((("identity_int32", "", "identity_int32 after unload"),))
    yield Case(
        "grpc ModelReady identity_int32 after unload",
        Grpc("ModelReady", ({"name": "identity_int32"},)),
    )
    yield Case("http load identity_int32", _load("identity_int32"))
    yield Case("http load unknown_model", _load("unknown_model"))
    yield Case(
        "http load identity_int32 bad override",
        _load("identity_int32", {"parameters": {"config": "{not json"}}),
    )
    yield Case(
        "http load identity_int32 file without config",
        _load("identity_int32", {"parameters": {"file:1/model.py": b64(b"x")}}),
    )
    yield Case("http load identity_int32 not json", _load("identity_int32", b"nope"))
    no_version = {
        "backend": "python",
        "input": [{"name": "IN", "data_type": "TYPE_INT32", "dims": [-1]}],
        "output": [{"name": "OUT", "data_type": "TYPE_INT32", "dims": [-1]}],
        "version_policy": {"specific": {"versions": [5]}},  # the folder holds version 1
    }
    yield Case(
        "http load identity_int32 policy matches no version",
        _load("identity_int32", {"parameters": {"config": json.dumps(no_version)}}),
    )
    yield Case(
        "http GET identity_int32 after a failed load", Http("GET", "/v2/models/identity_int32")
    )
    yield Case(
        "http unload unknown_model", Http("POST", "/v2/repository/models/unknown_model/unload")
    )
    yield Case("http load identity_int32 again", _load("identity_int32"))
    yield Case(
        "grpc RepositoryModelUnload unknown_model",
        Grpc("RepositoryModelUnload", ({"model_name": "unknown_model"},)),
    )
    yield Case(
        "grpc RepositoryModelLoad unknown_model",
        Grpc("RepositoryModelLoad", ({"model_name": "unknown_model"},)),
    )
    yield Case("http index at end", index)


def statistics_after_traffic() -> Iterator[Case]:
    for name in KNOWN:
        yield Case(f"http stats {name} after traffic", Http("GET", f"/v2/models/{name}/stats"))
    yield Case("http stats all after traffic", Http("GET", "/v2/models/stats"))


def run_by_one_server_only() -> Iterator[Case]:
    """Requests that one server runs and the other refuses, by a declared difference: sent
    after the statistics and metrics, so that those compare the counts of the same traffic."""
    yield Case(
        "http infer add_sub duplicate output",
        _infer("add_sub", _add_sub_json(outputs=[{"name": "OUTPUT0"}, {"name": "OUTPUT0"}])),
    )
    yield Case(
        "http infer identity_int32 data out of range",
        _infer(
            "identity_int32",
            {"inputs": [{"name": "IN", "shape": [1], "datatype": "INT32", "data": [2**40]}]},
        ),
    )


def no_inputs(names: tuple[str, ...] = ("source", "bare")) -> Iterator[Case]:
    """Python models that take no inputs (one with no config.pbtxt at all): served, and asked
    with no inputs over both protocols."""
    for name in names:
        base = f"/v2/models/{name}"
        yield Case(f"http GET {base} (no inputs)", Http("GET", base))
        yield Case(f"http GET {base}/config (no inputs)", Http("GET", base + "/config"))
        yield Case(f"http infer {name} no inputs", _infer(name, {"inputs": []}))
        yield Case(f"http infer {name} no inputs key", _infer(name, {}))
        yield Case(
            f"http infer {name} no inputs, output OUT",
            _infer(name, {"inputs": [], "outputs": [{"name": "OUT"}]}),
        )
        request = {"name": name, "version": ""}
        for method in ("ModelMetadata", "ModelConfig"):
            yield Case(f"grpc {method} {name} (no inputs)", Grpc(method, (request,)))
        yield Case(f"grpc infer {name} no inputs", Grpc("ModelInfer", ({"model_name": name},)))
        yield Case(
            f"grpc stream {name} no inputs", Grpc("ModelStreamInfer", ({"model_name": name},))
        )


def corpus() -> list[Case]:
    cases = [
        *health(),
        *per_model(),
        *http_inference(),
        *sequences(),
        *grpc_inference(),
        *refused_models(),
        *decoupled_over_unary(),
        *no_inputs(),
        *shared_memory(),
        *trace_and_log(),
        *statistics_after_traffic(),
        *metrics(),
        *run_by_one_server_only(),
        # A batching model asked with no inputs: refused by both in the same words, counted by
        # tritonserver as a failure (its Python backend refuses it), here not (declared).
        *no_inputs(("source_batched",)),
        *model_control(),
    ]
    ids = [case.id for case in cases]
    assert len(ids) == len(set(ids)), "case ids must be unique"
    return cases


def control_mode_cases(mode: str) -> list[Case]:
    """What a server in model control mode `mode` answers to model control."""
    return [
        Case(f"{mode}: http load identity_int32", _load("identity_int32")),
        Case(
            f"{mode}: http unload identity_int32",
            Http("POST", "/v2/repository/models/identity_int32/unload"),
        ),
        Case(f"{mode}: http load unknown_model", _load("unknown_model")),
        Case(f"{mode}: http index", Http("POST", "/v2/repository/index", {})),
        Case(
            f"{mode}: grpc RepositoryModelLoad",
            Grpc("RepositoryModelLoad", ({"model_name": "identity_int32"},)),
        ),
        Case(
            f"{mode}: grpc RepositoryModelUnload",
            Grpc("RepositoryModelUnload", ({"model_name": "identity_int32"},)),
        ),
        Case(f"{mode}: grpc RepositoryIndex", Grpc("RepositoryIndex")),
    ]


def repeated_repository_cases() -> list[Case]:
    """What a server given the same repository twice serves: its models, once each."""
    return [
        Case("twice: http index", Http("POST", "/v2/repository/index", {})),
        Case("twice: grpc RepositoryIndex", Grpc("RepositoryIndex")),
        Case(
            "twice: http GET identity_int32 ready", Http("GET", "/v2/models/identity_int32/ready")
        ),
    ]


def metrics() -> Iterator[Case]:
    from tests.differential.harness import Metrics

    yield Case("metrics families and counters after traffic", Metrics())
