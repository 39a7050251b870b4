"""The HTTP ceiling: aiohttp on uvloop (as the server runs), KServe v2 routes, nothing else.

    python -m bench.ceiling_http --model-repository DIR --models simple,squeezenet_onnx --port P \
        [--simple-compute numpy|ort]

Answers POST /v2/models/<m>[/versions/<v>]/infer with JSON tensors or Triton's binary tensor
extension, computed by bench.ceiling_models (numpy add/sub for `simple`, raw ONNX Runtime inline
on the loop for the ONNX models; `--simple-compute ort` runs `simple`'s model.onnx through ONNX
Runtime as well, as the server does: a reference for ORT's own cost, not the ceiling issue 20
measures against), plus the routes perf_analyzer and tritonclient read: health,
server metadata, model metadata, config, readiness and statistics (inference_count only). No
validation beyond what decoding needs, no limits, no scheduling, no access log: the least an
aiohttp server can do per request, so the server's throughput over this one's is its own cost.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from aiohttp import web

from bench.ceiling_models import SIMPLE_COMPUTES, Arrays, BadRequest, CeilingModel, load_models

HEADER_LENGTH = "Inference-Header-Content-Length"
MODELS = web.AppKey("models", dict)
MAX_BODY_BYTES = 2**30  # a JSON SqueezeNet request is ~3 MB; aiohttp's default allows 1 MiB


def error(status: int, message: str) -> web.Response:
    return web.Response(
        status=status, body=orjson.dumps({"error": message}), content_type="application/json"
    )


def json_response(data: Any) -> web.Response:
    return web.Response(body=orjson.dumps(data), content_type="application/json")


def decode_inputs(model: CeilingModel, header: dict[str, Any], binary: memoryview) -> Arrays:
    inputs: Arrays = {}
    offset = 0
    for spec in header["inputs"]:
        dtype = model.inputs[spec["name"]].dtype
        size = (spec.get("parameters") or {}).get("binary_data_size")
        if size is None:
            array = np.asarray(spec["data"], dtype=dtype)
        else:
            array = np.frombuffer(binary, dtype, size // dtype.itemsize, offset)
            offset += size
        inputs[spec["name"]] = array.reshape(spec["shape"])
    return inputs


def wants_binary(header: dict[str, Any], outputs: Arrays) -> dict[str, bool]:
    """Output name -> binary, for the outputs to send (all of them when none are named)."""
    default = bool((header.get("parameters") or {}).get("binary_data_output", False))
    named = header.get("outputs")
    if not named:
        return dict.fromkeys(outputs, default)
    return {o["name"]: bool((o.get("parameters") or {}).get("binary_data", default)) for o in named}


def encode(
    model: CeilingModel, header: dict[str, Any], outputs: Arrays
) -> tuple[bytes, int | None]:
    """The response body and, when it carries binary tensors, its JSON header's length."""
    chosen = wants_binary(header, outputs)
    described, blobs = [], []
    for name, binary in chosen.items():
        array = outputs[name]
        out: dict[str, Any] = {
            "name": name,
            "datatype": model.outputs[name].datatype,
            "shape": list(array.shape),
        }
        if binary:
            blob = array.tobytes()
            out["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            out["data"] = array.ravel().tolist()
        described.append(out)
    reply: dict[str, Any] = {"model_name": model.name, "model_version": "1", "outputs": described}
    if "id" in header:
        reply["id"] = header["id"]
    head = orjson.dumps(reply)
    if not blobs:
        return head, None
    return b"".join((head, *blobs)), len(head)


def model_of(request: web.Request) -> CeilingModel | None:
    models: dict[str, CeilingModel] = request.app[MODELS]
    return models.get(request.match_info["model"])


async def infer(request: web.Request) -> web.Response:
    model = model_of(request)
    if model is None:
        return error(404, f"unknown model '{request.match_info['model']}'")
    body = await request.read()
    length = request.headers.get(HEADER_LENGTH)
    try:
        if length is None:
            header, binary = orjson.loads(body), memoryview(b"")
        else:
            split = int(length)
            header, binary = orjson.loads(body[:split]), memoryview(body)[split:]
        inputs = decode_inputs(model, header, binary)
        reply, head_length = encode(model, header, model.compute(inputs))
    except (ValueError, KeyError, TypeError, BadRequest) as exc:
        return error(400, f"bad request: {exc}")
    if head_length is None:
        return web.Response(body=reply, content_type="application/json")
    return web.Response(
        body=reply,
        headers={HEADER_LENGTH: str(head_length), "Content-Type": "application/octet-stream"},
    )


async def ok(_: web.Request) -> web.Response:
    return web.Response()


async def model_ready(request: web.Request) -> web.Response:
    return web.Response(status=200 if model_of(request) else 400)


async def server_metadata(_: web.Request) -> web.Response:
    return json_response({"name": "ceiling-aiohttp", "version": "0", "extensions": []})


async def model_metadata(request: web.Request) -> web.Response:
    model = model_of(request)
    return json_response(model.metadata()) if model else error(404, "unknown model")


async def model_config(request: web.Request) -> web.Response:
    model = model_of(request)
    return json_response(model.config_dict()) if model else error(404, "unknown model")


async def model_stats(request: web.Request) -> web.Response:
    model = model_of(request)
    if model is None:
        return error(404, "unknown model")
    count = model.inference_count
    stats = {"name": model.name, "version": "1", "inference_count": count, "execution_count": count}
    return json_response({"model_stats": [stats]})


def build_app(models: dict[str, CeilingModel]) -> web.Application:
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app[MODELS] = models
    app.router.add_get("/v2/health/live", ok)
    app.router.add_get("/v2/health/ready", ok)
    app.router.add_get("/v2", server_metadata)
    for prefix in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
        app.router.add_post(prefix + "/infer", infer)
        app.router.add_get(prefix, model_metadata)
        app.router.add_get(prefix + "/config", model_config)
        app.router.add_get(prefix + "/ready", model_ready)
        app.router.add_get(prefix + "/stats", model_stats)
    return app


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ceiling_http")
    parser.add_argument("--model-repository", type=Path, required=True)
    parser.add_argument("--models", required=True, help="comma-separated model names")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument(
        "--simple-compute",
        choices=SIMPLE_COMPUTES,
        default="numpy",
        help="compute `simple` with numpy (the ceiling) or ONNX Runtime on its model.onnx",
    )
    args = parser.parse_args(argv)
    models = load_models(args.model_repository, args.models.split(","), args.simple_compute)
    try:
        import uvloop
    except ImportError:
        pass
    else:
        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    web.run_app(build_app(models), host=args.host, port=args.port, access_log=None, print=None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
