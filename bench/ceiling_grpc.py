"""The gRPC ceilings: Triton's GRPCInferenceService (tritonclient's generated stubs) doing nothing
but the protocol, as a grpc.aio servicer on uvloop (as the server runs) or as the synchronous
`grpc.server` with a thread pool.

    python -m bench.ceiling_grpc --mode aio|sync [--threads 64] --model-repository DIR \
        --models simple,squeezenet_onnx --port P [--simple-compute numpy|ort]

ModelInfer and ModelStreamInfer take raw_input_contents and answer raw_output_contents, computed
by bench.ceiling_models (numpy add/sub for `simple`, raw ONNX Runtime in the handler for the ONNX
models; `--simple-compute ort` runs `simple`'s model.onnx through ONNX Runtime as well, as the
server does: a reference for ORT's own cost, not the ceiling issue 20 measures against);
ServerLive/Ready, ModelReady, ServerMetadata, ModelMetadata, ModelConfig and
ModelStatistics (inference_count only) answer what perf_analyzer and tritonclient read. No
validation beyond decoding, no limits, no scheduling.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncIterator, Iterator, Sequence
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from tritonclient.grpc import service_pb2, service_pb2_grpc

from bench.ceiling_models import SIMPLE_COMPUTES, BadRequest, CeilingModel, load_models

MODES = ("aio", "sync")
# A stream holds a pool thread for its life: 8 threads hung perf_analyzer --streaming at c=8
# (its statistics calls between windows found no thread). For unary `simple` calls 8 and 64
# threads measured the same (3,000-3,900 infer/s at c=8 and c=32, within the noise).
DEFAULT_THREADS = 64
MAX_MESSAGE_BYTES = 2**31 - 1


class UnknownModel(Exception):
    pass


class Answers:
    """The responses, as plain functions of the request (shared by both servicers)."""

    def __init__(self, models: dict[str, CeilingModel]) -> None:
        self.models = models

    def model(self, name: str) -> CeilingModel:
        try:
            return self.models[name]
        except KeyError:
            raise UnknownModel(f"unknown model '{name}'") from None

    def infer(self, request: Any) -> Any:
        model = self.model(request.model_name)
        try:
            return self._infer(model, request)
        except (ValueError, KeyError, TypeError) as exc:
            raise BadRequest(f"bad request: {exc!r}") from exc

    def _infer(self, model: CeilingModel, request: Any) -> Any:
        inputs = {
            t.name: np.frombuffer(raw, model.inputs[t.name].dtype).reshape(tuple(t.shape))
            for t, raw in zip(request.inputs, request.raw_input_contents, strict=True)
        }
        outputs = model.compute(inputs)
        names = [o.name for o in request.outputs] or list(outputs)
        reply = service_pb2.ModelInferResponse(
            model_name=model.name, model_version="1", id=request.id
        )
        for name in names:
            array = outputs[name]
            reply.outputs.add(name=name, datatype=model.outputs[name].datatype, shape=array.shape)
            reply.raw_output_contents.append(array.tobytes())
        return reply

    def metadata(self, request: Any) -> Any:
        model = self.model(request.name)
        meta = model.metadata()
        return service_pb2.ModelMetadataResponse(
            name=model.name,
            versions=meta["versions"],
            platform=model.platform,
            inputs=[service_pb2.ModelMetadataResponse.TensorMetadata(**t) for t in meta["inputs"]],
            outputs=[
                service_pb2.ModelMetadataResponse.TensorMetadata(**t) for t in meta["outputs"]
            ],
        )

    def config(self, request: Any) -> Any:
        return service_pb2.ModelConfigResponse(config=self.model(request.name).config)

    def statistics(self, request: Any) -> Any:
        names = [request.name] if request.name else list(self.models)
        stats = []
        for name in names:
            count = self.model(name).inference_count
            stats.append(
                service_pb2.ModelStatistics(
                    name=name, version="1", inference_count=count, execution_count=count
                )
            )
        return service_pb2.ModelStatisticsResponse(model_stats=stats)

    def server_metadata(self) -> Any:
        return service_pb2.ServerMetadataResponse(name="ceiling-grpc", version="0")

    def model_ready(self, request: Any) -> Any:
        return service_pb2.ModelReadyResponse(ready=request.name in self.models)


class SyncServicer(service_pb2_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    """For grpc.server: each call on a pool thread."""

    def __init__(self, answers: Answers) -> None:
        self.answers = answers

    def _answer(self, method: Any, request: Any, context: Any) -> Any:
        try:
            return method(request)
        except UnknownModel as exc:
            context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
        except BadRequest as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))

    def ServerLive(self, request: Any, context: Any) -> Any:
        return service_pb2.ServerLiveResponse(live=True)

    def ServerReady(self, request: Any, context: Any) -> Any:
        return service_pb2.ServerReadyResponse(ready=True)

    def ModelReady(self, request: Any, context: Any) -> Any:
        return self.answers.model_ready(request)

    def ServerMetadata(self, request: Any, context: Any) -> Any:
        return self.answers.server_metadata()

    def ModelMetadata(self, request: Any, context: Any) -> Any:
        return self._answer(self.answers.metadata, request, context)

    def ModelConfig(self, request: Any, context: Any) -> Any:
        return self._answer(self.answers.config, request, context)

    def ModelStatistics(self, request: Any, context: Any) -> Any:
        return self._answer(self.answers.statistics, request, context)

    def ModelInfer(self, request: Any, context: Any) -> Any:
        return self._answer(self.answers.infer, request, context)

    def ModelStreamInfer(self, requests: Iterator[Any], context: Any) -> Iterator[Any]:
        for request in requests:
            try:
                reply = self.answers.infer(request)
            except (UnknownModel, BadRequest) as exc:
                yield service_pb2.ModelStreamInferResponse(error_message=str(exc))
            else:
                yield service_pb2.ModelStreamInferResponse(infer_response=reply)


class AioServicer(service_pb2_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    """For grpc.aio.server: each call a coroutine on the event loop (the model runs inline)."""

    def __init__(self, answers: Answers) -> None:
        self.answers = answers

    async def _answer(self, method: Any, request: Any, context: Any) -> Any:
        try:
            return method(request)
        except UnknownModel as exc:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
        except BadRequest as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))

    async def ServerLive(self, request: Any, context: Any) -> Any:
        return service_pb2.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, context: Any) -> Any:
        return service_pb2.ServerReadyResponse(ready=True)

    async def ModelReady(self, request: Any, context: Any) -> Any:
        return self.answers.model_ready(request)

    async def ServerMetadata(self, request: Any, context: Any) -> Any:
        return self.answers.server_metadata()

    async def ModelMetadata(self, request: Any, context: Any) -> Any:
        return await self._answer(self.answers.metadata, request, context)

    async def ModelConfig(self, request: Any, context: Any) -> Any:
        return await self._answer(self.answers.config, request, context)

    async def ModelStatistics(self, request: Any, context: Any) -> Any:
        return await self._answer(self.answers.statistics, request, context)

    async def ModelInfer(self, request: Any, context: Any) -> Any:
        return await self._answer(self.answers.infer, request, context)

    async def ModelStreamInfer(self, requests: AsyncIterator[Any], context: Any) -> Any:
        async for request in requests:
            try:
                reply = self.answers.infer(request)
            except (UnknownModel, BadRequest) as exc:
                yield service_pb2.ModelStreamInferResponse(error_message=str(exc))
            else:
                yield service_pb2.ModelStreamInferResponse(infer_response=reply)


OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.so_reuseport", 0),
]


def serve_sync(answers: Answers, address: str, threads: int) -> None:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=threads), options=OPTIONS)
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(SyncServicer(answers), server)
    server.add_insecure_port(address)
    server.start()
    server.wait_for_termination()


async def serve_aio(answers: Answers, address: str) -> None:
    server = grpc.aio.server(options=OPTIONS)
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(AioServicer(answers), server)
    server.add_insecure_port(address)
    await server.start()
    await server.wait_for_termination()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ceiling_grpc")
    parser.add_argument("--mode", choices=MODES, required=True)
    parser.add_argument("--threads", type=int, default=DEFAULT_THREADS, help="sync pool size")
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
    answers = Answers(models)
    address = f"{args.host}:{args.port}"
    if args.mode == "sync":
        serve_sync(answers, address, args.threads)
        return 0
    try:
        import uvloop
    except ImportError:
        pass
    else:
        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    asyncio.run(serve_aio(answers, address))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
