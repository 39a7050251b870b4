"""Fuzz targets: each takes arbitrary bytes and must end in a result or an expected, precise
error (ApplianceError, or ValueError where a parser documents it); anything else is a finding.

Targets read their structure from the bytes with a small reader, so that atheris (coverage-
guided) and hypothesis (random bytes) drive the same code.
"""

from __future__ import annotations

import contextlib
import hashlib
import struct
from collections.abc import Callable
from pathlib import Path

from appliance.common.errors import ApplianceError
from appliance.common.limits import RequestLimits
from appliance.common.model_config import parse_config_text, validate_config
from appliance.common.protocol import service_pb2 as pb
from appliance.common.serialization import decode_bytes
from appliance.frontends.grpc.codec import decode_request as grpc_decode
from appliance.frontends.http.codec import decode_request as http_decode
from appliance.repository.s3 import RemoteObject, S3Location, group_objects
from appliance.services.shared_memory import SharedMemoryRegistry
from fuzz.documents import fleet_report, labels, ledger, manifest, rollout_document
from fuzz.http_framing import http_framing
from fuzz.wire import grpc_control, grpc_stream, shm_registry

LIMITS = RequestLimits()


class Reader:
    """Consumes fuzz bytes as small integers and byte strings."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def byte(self) -> int:
        if self.pos >= len(self.data):
            return 0
        self.pos += 1
        return self.data[self.pos - 1]

    def take(self, n: int) -> bytes:
        chunk = self.data[self.pos : self.pos + n]
        self.pos += len(chunk)
        return chunk

    def text(self, most: int) -> str:
        return self.take(self.byte() % (most + 1)).decode("utf-8", "replace")

    def rest(self) -> bytes:
        return self.take(len(self.data))


def http_json(data: bytes) -> None:
    """An infer body that is JSON only (no binary part)."""
    with contextlib.suppress(ApplianceError):
        http_decode(data, None, "m", "", SharedMemoryRegistry(), LIMITS)


def http_binary(data: bytes) -> None:
    """An infer body with a JSON header of a fuzzed length followed by binary tensor data."""
    reader = Reader(data)
    header = str(int.from_bytes(reader.take(2), "little") - 8)  # also negative lengths
    with contextlib.suppress(ApplianceError):
        http_decode(reader.rest(), header, "m", "", SharedMemoryRegistry(), LIMITS)


def bytes_tensor(data: bytes) -> None:
    """The BYTES decoder: a declared element count, then length-prefixed elements."""
    (count,) = struct.unpack("<I", data[:4].ljust(4, b"\0"))
    with contextlib.suppress(ApplianceError):
        decode_bytes(data[4:], count, "fuzz")


def grpc_request(data: bytes) -> None:
    """A ModelInferRequest as grpcio would hand it over, converted to the core's request."""
    try:
        message = pb.ModelInferRequest.FromString(data)
    except Exception:  # not a message: grpcio refuses it before our code runs
        return
    with contextlib.suppress(ApplianceError):
        grpc_decode(message, SharedMemoryRegistry(), LIMITS)


def config_pbtxt(data: bytes) -> None:
    """config.pbtxt text: parsed, then validated on its own (no model file)."""
    text = data.decode("utf-8", "replace")
    with contextlib.suppress(ApplianceError):
        config = parse_config_text(text, "config.pbtxt")
        validate_config(config, Path("/models") / (config.name or "m"))


def s3_listing(data: bytes) -> None:
    """An S3 listing (keys, sizes, etags) grouped into models and versions."""
    reader = Reader(data)
    prefix = reader.text(6)
    objects: list[RemoteObject] = []
    while reader.pos < len(data) and len(objects) < 32:
        key = reader.text(40)
        objects.append(RemoteObject(key, reader.byte(), reader.text(8), float(reader.byte())))
    models = group_objects(prefix, objects)
    for name, model in models.items():
        if not name or "/" in name or name in (".", ".."):
            raise AssertionError(f"model name {name!r} from a listing")
        if any(version < 0 for version in model.versions):
            raise AssertionError(f"negative version in {model!r}")
        paths = [*model.files, *(rel for files in model.versions.values() for rel in files)]
        for rel in paths:  # files are written to <store>/<name>/<rel>: must stay inside
            if rel.startswith("/") or {".", ".."} & set(rel.split("/")):
                raise AssertionError(f"model '{name}': file {rel!r} escapes its folder")
    with contextlib.suppress(ValueError):
        S3Location.parse("s3://" + reader.text(40))


TARGETS: dict[str, Callable[[bytes], None]] = {
    "http_json": http_json,
    "http_binary": http_binary,
    "http_framing": http_framing,
    "bytes": bytes_tensor,
    "grpc": grpc_request,
    "grpc_stream": grpc_stream,
    "grpc_control": grpc_control,
    "shm_registry": shm_registry,
    "config": config_pbtxt,
    "manifest": manifest,
    "rollout": rollout_document,
    "ledger": ledger,
    "labels": labels,
    "fleet_report": fleet_report,
    "s3": s3_listing,
}
CORPUS = Path(__file__).parent / "corpus"


def corpus(name: str) -> list[Path]:
    """The target's corpus files in the repository (fuzz/corpus/<name>/): seeds, and the
    inputs the long runs found (findings, once fixed, and new coverage), minimized."""
    folder = CORPUS / name
    return sorted(p for p in folder.iterdir() if p.is_file()) if folder.is_dir() else []


def seeds() -> dict[str, list[bytes]]:
    """A few valid inputs per target, so that coverage-guided runs start past the parsers."""
    header = (
        b'{"inputs":[{"name":"INPUT0","datatype":"BYTES","shape":[1,2],'
        b'"parameters":{"binary_data_size":9}}],"outputs":[{"name":"OUTPUT0"}]}'
    )
    blob = struct.pack("<I", 1) + b"a" + struct.pack("<I", 0)
    message = pb.ModelInferRequest(model_name="m", id="1")
    tensor = message.inputs.add(name="INPUT0", datatype="INT32", shape=[1, 2])
    tensor.contents.int_contents.extend([1, 2])
    return {
        "http_json": [
            b'{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1,2],"data":[1.5,2]}],'
            b'"parameters":{"binary_data_output":true},"id":"x"}'
        ],
        "http_binary": [(len(header) + 8).to_bytes(2, "little") + header + blob],
        "bytes": [struct.pack("<I", 2) + blob],
        "grpc": [message.SerializeToString()],
        "config": [
            b'name: "m"\nbackend: "onnxruntime"\nmax_batch_size: 8\n'
            b'input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ -1, 3 ] } ]\n'
            b'output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1, 3 ] } ]\n'
            b"dynamic_batching { max_queue_delay_microseconds: 100 }\n"
        ],
        "s3": [b"\x05repo/\x14repo/m/1/model.onnx\x05\x02e1\x00\x13repo/m/config.pbtxt\x01"],
        **_more_seeds(header, blob, message),
    }


def _framed(*messages: bytes) -> bytes:
    return b"".join(len(m).to_bytes(2, "little") + m for m in messages)


def _more_seeds(
    header: bytes, blob: bytes, message: pb.ModelInferRequest
) -> dict[str, list[bytes]]:
    import gzip
    import json

    infer = b'{"inputs":[{"name":"INPUT0","datatype":"INT32","shape":[1,2],"data":[1,2]}]}'
    binary = header + blob
    zipped = gzip.compress(b'{"x": 1}')
    load = pb.RepositoryModelLoadRequest(model_name="m")
    load.parameters["config"].string_param = '{"max_batch_size": 4}'
    pin = pb.RepositoryModelLoadRequest(model_name="m")
    pin.parameters["pin_version"].int64_param = 3
    unload = pb.RepositoryModelUnloadRequest(model_name="m")
    unload.parameters["unload_dependents"].bool_param = True
    shm = pb.SystemSharedMemoryRegisterRequest(name="r", key="/nothere", offset=0, byte_size=64)
    logs = pb.LogSettingsRequest()
    logs.settings["log_verbose_level"].uint32_param = 1
    trace = pb.TraceSettingRequest()
    trace.settings["trace_rate"].value.append("10")
    stream = message.SerializeToString()
    manifest_text = b"%s  model.onnx\n" % hashlib.sha256(b"weights").hexdigest().encode()
    rollout = {
        "format": 1,
        "model": "m",
        "revision": 1,
        "target": 2,
        "baseline": 1,
        "stage": 0,
        "stages": [{"percent": 10}, {"labels": {"site": "berlin"}}],
        "probation": {"window_requests": 100, "max_error_rate": 0.01, "max_latency_ratio": 1.5},
        "halt": {"max_failed_share": 0.2, "min_verdicts": 2, "rollback": True},
    }
    ledger = {
        "last_good": 2,
        "pinned": None,
        "rollout": 3,
        "failed": {"3": {"stage": "load", "reason": "bad", "content": "files:x", "at": "t"}},
    }
    report = {
        "format": 1,
        "device": "dev-1",
        "labels": {"site": "berlin"},
        "time": "t",
        "server_version": "0.1",
        "last_poll": None,
        "last_poll_ok": True,
        "models": {
            "m": {
                "serving": [1, 2],
                "rollout_revision": 2,
                "target": 2,
                "in_stage": True,
                "probation": "running",
                "requests": 5,
            }
        },
    }
    return {
        "http_framing": [
            b"\x80POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
            % (len(infer), infer),
            b"\x40POST /v2/models/m/versions/1/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n"
            b"Inference-Header-Content-Length: %d\r\n\r\n%s" % (len(binary), len(header), binary),
            b"\x20POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            b'5\r\n{"inp\r\n0\r\n\r\nGET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n',
            b"\x10POST /v2/repository/index HTTP/1.1\r\nHost: x\r\nContent-Encoding: gzip\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(zipped), zipped),
            b"\x90POST /v2/models/refused/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc"
            b"GET /v2 HTTP/1.0\r\nHost: x\r\n\r\n",
        ],
        "grpc_stream": [_framed(stream, stream)],
        "grpc_control": [
            bytes([i]) + m.SerializeToString()
            for i, m in ((0, load), (0, pin), (1, unload), (2, shm), (8, logs), (9, trace))
        ],
        "shm_registry": [
            b"\x01\x00"
            + bytes(4)
            + (8).to_bytes(8, "little") * 2
            + (16).to_bytes(8, "little")
            + (24).to_bytes(8, "little")
            + b"\x00\x02\x03\x00"
            + bytes(24)
        ],
        "manifest": [len(manifest_text).to_bytes(2, "little") + manifest_text + bytes(64)],
        "rollout": [json.dumps(rollout).encode()],
        "ledger": [json.dumps(ledger).encode()],
        "labels": [b"\x03cat\ndog\nbird\n\nfish\n"],
        "fleet_report": [json.dumps(report).encode()],
    }
