"""Fuzz targets: each takes arbitrary bytes and must end in a result or an expected, precise
error (ApplianceError, or ValueError where a parser documents it); anything else is a finding.

Targets read their structure from the bytes with a small reader, so that atheris (coverage-
guided) and hypothesis (random bytes) drive the same code.
"""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Callable
from pathlib import Path

from appliance.errors import ApplianceError
from appliance.frontends.grpc.codec import decode_request as grpc_decode
from appliance.frontends.http.codec import decode_request as http_decode
from appliance.limits import RequestLimits
from appliance.model_config import parse_config_text, validate_config
from appliance.protocol import service_pb2 as pb
from appliance.repository.s3 import RemoteObject, S3Location, group_objects
from appliance.serialization import decode_bytes
from appliance.services.shared_memory import SharedMemoryRegistry

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
    "bytes": bytes_tensor,
    "grpc": grpc_request,
    "config": config_pbtxt,
    "s3": s3_listing,
}


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
    }
