"""Send one case to a server and reduce its answer to what the comparison looks at.

HTTP cases go out raw (`http.client`), so that the status line, the content type and the body
compare; gRPC cases go through the generated stubs, so that the code and the details compare.
Volatile fields (times, durations, versions of the software) are normalised away.
"""

from __future__ import annotations

import base64
import http.client
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf import json_format
from tritonclient.grpc import service_pb2, service_pb2_grpc

JSON = Any


@dataclass(frozen=True)
class Http:
    """A raw HTTP request: `body` is bytes as given, or JSON-encoded when it is not bytes."""

    method: str
    path: str
    body: Any = None
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Grpc:
    """A unary gRPC call (`requests` has one message) or a ModelStreamInfer stream (several)."""

    method: str
    requests: tuple[JSON, ...] = ({},)


@dataclass(frozen=True)
class Metrics:
    """GET /metrics on the metrics port: the `nv_*` series' names and labels, and the values of
    the request counters (which known traffic fixes)."""


@dataclass(frozen=True)
class Case:
    id: str
    request: Http | Grpc | Metrics
    # a check of the answer beyond equality: what the case is about (None: the answer itself)
    reduce: Callable[[JSON], JSON] | None = field(default=None, compare=False)


_VOLATILE_KEYS = {"last_inference", "timestamp"}
_DURATION = re.compile(r"^(ns|.*_ns)$")


def normalise(value: JSON) -> JSON:
    """Times and durations become markers: zero stays 0, anything else becomes "N"."""
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if key in _VOLATILE_KEYS:
                out[key] = "T" if item not in (0, "0", None) else 0
            elif _DURATION.match(key) and isinstance(item, (int, str)):
                out[key] = "N" if int(item) else 0
            else:
                out[key] = normalise(item)
        return out
    if isinstance(value, list):
        return [normalise(item) for item in value]
    return value


def _http_body(response: http.client.HTTPResponse, raw: bytes) -> JSON:
    header_length = response.getheader("Inference-Header-Content-Length")
    if header_length is not None:
        cut = int(header_length)
        return {"json": normalise(_json_or_text(raw[:cut])), "binary": raw[cut:].hex()}
    return normalise(_json_or_text(raw))


def _json_or_text(raw: bytes) -> JSON:
    try:
        return json.loads(raw) if raw else ""
    except ValueError:
        return raw.decode(errors="replace")


def send_http(address: str, request: Http) -> JSON:
    host, port = address.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    body = request.body
    if body is not None and not isinstance(body, bytes):
        body = json.dumps(body).encode()
    try:
        connection.request(request.method, request.path, body=body, headers=dict(request.headers))
        response = connection.getresponse()
        raw = response.read()
    finally:
        connection.close()
    content_type = (response.getheader("Content-Type") or "").split(";")[0]
    body = _http_body(response, raw)
    if isinstance(body, dict) and set(body) == {"error"}:
        # an error's content type is tritonserver's accident (text/plain on some routes,
        # application/json on others, the same JSON body on both): not compared
        return {"status": response.status, "body": body}
    return {"status": response.status, "type": content_type, "body": body}


_STREAM = "ModelStreamInfer"


def _message(method: str, kind: str) -> Any:
    prefix = "ModelInfer" if method == _STREAM else method
    return getattr(service_pb2, f"{prefix}{kind}")


def send_grpc(channel: grpc.Channel, request: Grpc) -> JSON:
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    messages = [
        json_format.ParseDict(body, _message(request.method, "Request")())
        for body in request.requests
    ]
    call = getattr(stub, request.method)
    try:
        if request.method == _STREAM:
            answers = [_stream_answer(answer) for answer in call(iter(messages), timeout=30)]
            return {"code": "OK", "stream": answers}
        answer = call(messages[0], timeout=30)
    except grpc.RpcError as error:
        return {"code": error.code().name, "details": error.details()}
    return {"code": "OK", "body": normalise(_to_dict(answer))}


def _stream_answer(answer: Any) -> JSON:
    out = {"error": answer.error_message}
    if answer.HasField("infer_response"):
        out["response"] = normalise(_to_dict(answer.infer_response))
    return out


def _to_dict(message: Any) -> JSON:
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


_SERIES = re.compile(r"^(nv_[a-z_]+)(?:\{(.*)\})? (\S+)$")
_COUNTED = (
    "nv_inference_request_success",
    "nv_inference_request_failure",
    "nv_inference_count",
    "nv_inference_exec_count",
)


def read_metrics(address: str) -> JSON:
    text = send_http(address, Http("GET", "/metrics"))["body"]
    series: dict[str, JSON] = {}
    for line in str(text).splitlines():
        match = _SERIES.match(line)
        if not match:
            continue
        family, labels, value = match.groups()
        pairs = sorted(re.findall(r'(\w+)="([^"]*)"', labels or ""))
        keys = ",".join(key for key, _ in pairs)
        if family in _COUNTED:
            series[f"{family}{{{','.join(f'{k}={v}' for k, v in pairs)}}}"] = float(value)
        else:
            series.setdefault(f"{family}{{{keys}}}", "present")
    return series


@dataclass(frozen=True)
class Target:
    """One server's addresses."""

    http: str
    metrics: str
    channel: grpc.Channel


def answer(case: Case, target: Target) -> JSON:
    request = case.request
    if isinstance(request, Http):
        result = send_http(target.http, request)
    elif isinstance(request, Grpc):
        result = send_grpc(target.channel, request)
    else:
        result = read_metrics(target.metrics)
    return case.reduce(result) if case.reduce else result


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def walk(answers: dict[str, JSON], other: dict[str, JSON]) -> Iterator[str]:
    """The case ids whose answers differ."""
    for key, value in answers.items():
        if other.get(key) != value:
            yield key
