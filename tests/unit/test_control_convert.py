"""The control service's typed results on the wire: one converter per protocol.

HTTP: the exact bytes of Triton's JSON objects (field order included, as this server has always
sent them). gRPC: the message equals what protobuf's own JSON mapping makes of that JSON, so
both protocols say the same thing, and Triton-specific details hold (zero durations present,
no "build" field, "" for an index row without a version).
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from google.protobuf import json_format
from google.protobuf.message import Message

from appliance.common.protocol import model_config_pb2 as mc
from appliance.common.protocol import service_pb2 as pb
from appliance.frontends.grpc import convert as grpc_convert
from appliance.frontends.http import convert as http_convert
from appliance.ops.logs import LogState
from appliance.services.results import (
    BatchStatistics,
    CudaSharedMemoryRegion,
    IndexRow,
    InferStatistics,
    ModelMetadata,
    ModelStatistics,
    ServerMetadata,
    StatisticDuration,
    SystemSharedMemoryRegion,
    TensorMetadata,
    TraceSettings,
)

ZERO = StatisticDuration()


def same_as_json(message: Message, doc: Any, empty: Message) -> None:
    """`message` is what protobuf's JSON mapping makes of `doc`, byte for byte."""
    parsed = json_format.ParseDict(doc, empty, ignore_unknown_fields=True)
    assert message == parsed
    assert message.SerializeToString(deterministic=True) == parsed.SerializeToString(
        deterministic=True
    )


def test_server_metadata() -> None:
    result = ServerMetadata("triton", "0.1.0", ("statistics", "trace"), {"python": "3.10.12"})
    body = orjson.dumps(http_convert.server_metadata(result))
    assert body == (
        b'{"name":"triton","version":"0.1.0","extensions":["statistics","trace"],'
        b'"build":{"python":"3.10.12"}}'
    )
    message = grpc_convert.server_metadata(result)
    assert message == pb.ServerMetadataResponse(
        name="triton", version="0.1.0", extensions=["statistics", "trace"]
    )
    same_as_json(message, orjson.loads(body), pb.ServerMetadataResponse())


def test_model_metadata() -> None:
    result = ModelMetadata(
        name="simple",
        versions=(1, 3),
        platform="onnxruntime_onnx",
        inputs=(TensorMetadata("INPUT0", "INT32", (-1, 16)),),
        outputs=(TensorMetadata("OUTPUT0", "BYTES", (-1, 2, 3)),),
    )
    doc = http_convert.model_metadata(result)
    assert orjson.dumps(doc) == (
        b'{"name":"simple","versions":["1","3"],"platform":"onnxruntime_onnx",'
        b'"inputs":[{"name":"INPUT0","datatype":"INT32","shape":[-1,16]}],'
        b'"outputs":[{"name":"OUTPUT0","datatype":"BYTES","shape":[-1,2,3]}]}'
    )
    message = grpc_convert.model_metadata(result)
    assert list(message.versions) == ["1", "3"]
    assert list(message.inputs[0].shape) == [-1, 16]
    same_as_json(message, doc, pb.ModelMetadataResponse())


def test_model_metadata_of_a_model_without_inputs() -> None:
    result = ModelMetadata("empty", (1,), "python", (), ())
    doc = http_convert.model_metadata(result)
    assert doc == {"name": "empty", "versions": ["1"], "platform": "python", "inputs": [],
                   "outputs": []}
    same_as_json(grpc_convert.model_metadata(result), doc, pb.ModelMetadataResponse())


def test_model_config_keeps_every_field_and_int64_as_numbers() -> None:
    config = mc.ModelConfig(name="simple", platform="onnxruntime_onnx", max_batch_size=8)
    config.input.add(name="INPUT0", data_type=mc.TYPE_INT32, dims=[16])
    doc = http_convert.model_config(config)
    assert doc["name"] == "simple"
    assert doc["max_batch_size"] == 8
    assert doc["input"][0]["dims"] == [16]  # int64: a number, not protobuf's "16"
    assert doc["input"][0]["data_type"] == "TYPE_INT32"
    assert doc["input"][0]["optional"] is False  # defaults written, as Triton does


def _statistics() -> ModelStatistics:
    return ModelStatistics(
        name="simple",
        version=1,
        last_inference_ms=1700000000123,
        inference_count=6,
        execution_count=2,
        inference_stats=InferStatistics(
            success=StatisticDuration(3, 3000),
            fail=ZERO,
            queue=StatisticDuration(3, 300),
            compute_input=StatisticDuration(3, 30),
            compute_infer=StatisticDuration(3, 2000),
            compute_output=StatisticDuration(3, 20),
            cache_hit=ZERO,
            cache_miss=ZERO,
        ),
        batch_stats=(
            BatchStatistics(2, StatisticDuration(1, 10), StatisticDuration(1, 900),
                            StatisticDuration(1, 5)),
            BatchStatistics(4, StatisticDuration(1, 12), StatisticDuration(1, 1000),
                            StatisticDuration(1, 6)),
        ),
    )


def test_statistics() -> None:
    doc = http_convert.statistics([_statistics()])
    assert orjson.dumps(doc) == (
        b'{"model_stats":[{"name":"simple","version":"1","last_inference":1700000000123,'
        b'"inference_count":6,"execution_count":2,"inference_stats":{'
        b'"success":{"count":3,"ns":3000},"fail":{"count":0,"ns":0},'
        b'"queue":{"count":3,"ns":300},"compute_input":{"count":3,"ns":30},'
        b'"compute_infer":{"count":3,"ns":2000},"compute_output":{"count":3,"ns":20},'
        b'"cache_hit":{"count":0,"ns":0},"cache_miss":{"count":0,"ns":0}},'
        b'"response_stats":{},"batch_stats":['
        b'{"batch_size":2,"compute_input":{"count":1,"ns":10},'
        b'"compute_infer":{"count":1,"ns":900},"compute_output":{"count":1,"ns":5}},'
        b'{"batch_size":4,"compute_input":{"count":1,"ns":12},'
        b'"compute_infer":{"count":1,"ns":1000},"compute_output":{"count":1,"ns":6}}],'
        b'"memory_usage":[]}]}'
    )
    message = grpc_convert.statistics([_statistics()])
    stats = message.model_stats[0]
    assert (stats.version, stats.last_inference, stats.inference_count) == ("1", 1700000000123, 6)
    # A zero duration is still present, as in Triton's answers ("fail {}").
    assert stats.inference_stats.HasField("fail")
    assert stats.inference_stats.HasField("cache_hit")
    assert [b.batch_size for b in stats.batch_stats] == [2, 4]
    same_as_json(message, doc, pb.ModelStatisticsResponse())


def test_statistics_of_nothing() -> None:
    assert http_convert.statistics([]) == {"model_stats": []}
    assert grpc_convert.statistics([]) == pb.ModelStatisticsResponse()


def test_repository_index() -> None:
    rows = [
        IndexRow("broken", 1, "UNAVAILABLE", "cannot load"),
        IndexRow("never_loaded", None, "", ""),
        IndexRow("simple", 1, "READY", ""),
        IndexRow("unloaded", None, "UNAVAILABLE", "unloaded"),
    ]
    doc = http_convert.repository_index(rows)
    assert orjson.dumps(doc) == (
        b'[{"name":"broken","version":"1","state":"UNAVAILABLE","reason":"cannot load"},'
        b'{"name":"never_loaded"},'  # a name alone, as tritonserver lists a model never loaded
        b'{"name":"simple","version":"1","state":"READY"},'  # no empty reason, as tritonserver
        b'{"name":"unloaded","state":"UNAVAILABLE","reason":"unloaded"}]'
    )
    message = grpc_convert.repository_index(rows)
    assert [(m.name, m.version, m.state) for m in message.models] == [
        ("broken", "1", "UNAVAILABLE"),
        ("never_loaded", "", ""),
        ("simple", "1", "READY"),
        ("unloaded", "", "UNAVAILABLE"),
    ]
    same_as_json(message, {"models": doc}, pb.RepositoryIndexResponse())


def test_trace_settings() -> None:
    result = TraceSettings("/tmp/trace.json", ("TIMESTAMPS",), "10", "-1", "0", "triton")
    doc = http_convert.trace_settings(result)
    assert orjson.dumps(doc) == (
        b'{"trace_file":"/tmp/trace.json","trace_level":["TIMESTAMPS"],"trace_rate":"10",'
        b'"trace_count":"-1","log_frequency":"0","trace_mode":"triton"}'
    )
    message = grpc_convert.trace_settings(result)
    assert {key: list(value.value) for key, value in message.settings.items()} == {
        "trace_file": ["/tmp/trace.json"],
        "trace_level": ["TIMESTAMPS"],
        "trace_rate": ["10"],
        "trace_count": ["-1"],
        "log_frequency": ["0"],
        "trace_mode": ["triton"],
    }


@pytest.mark.parametrize("levels", [(), ("OFF",), ("TIMESTAMPS", "OFF")])
def test_trace_levels_are_lists_on_both_protocols(levels: tuple[str, ...]) -> None:
    result = TraceSettings("", levels, "1000", "-1", "0", "triton")
    assert http_convert.trace_settings(result)["trace_level"] == list(levels)
    assert list(grpc_convert.trace_settings(result).settings["trace_level"].value) == list(levels)


def test_log_settings() -> None:
    state = LogState(log_info=False, log_verbose_level=2, log_format="ISO8601")
    doc = http_convert.log_settings(state)
    assert orjson.dumps(doc) == (
        b'{"log_file":"","log_info":false,"log_warning":true,"log_error":true,'
        b'"log_verbose_level":2,"log_format":"ISO8601"}'
    )
    settings = grpc_convert.log_settings(state).settings
    chosen = {key: value.WhichOneof("parameter_choice") for key, value in settings.items()}
    assert chosen == {
        "log_file": "string_param",
        "log_info": "bool_param",
        "log_warning": "bool_param",
        "log_error": "bool_param",
        "log_verbose_level": "uint32_param",
        "log_format": "string_param",
    }
    assert settings["log_info"].bool_param is False
    assert settings["log_verbose_level"].uint32_param == 2
    assert settings["log_format"].string_param == "ISO8601"


def test_system_shared_memory_status() -> None:
    regions = [
        SystemSharedMemoryRegion("input", "/in_key", 0, 64),
        SystemSharedMemoryRegion("output", "/out_key", 4096, 32),
    ]
    doc = http_convert.system_shared_memory_status(regions)
    assert orjson.dumps(doc) == (
        b'[{"name":"input","key":"/in_key","offset":0,"byte_size":64},'
        b'{"name":"output","key":"/out_key","offset":4096,"byte_size":32}]'
    )
    message = grpc_convert.system_shared_memory_status(regions)
    assert sorted(message.regions) == ["input", "output"]
    output = message.regions["output"]
    assert (output.name, output.key, output.offset, output.byte_size) == (
        "output", "/out_key", 4096, 32
    )
    assert grpc_convert.system_shared_memory_status([]) == pb.SystemSharedMemoryStatusResponse()


def test_cuda_shared_memory_status() -> None:
    regions = [CudaSharedMemoryRegion("gpu_in", 1, 256)]
    doc = http_convert.cuda_shared_memory_status(regions)
    assert orjson.dumps(doc) == b'[{"name":"gpu_in","device_id":1,"byte_size":256}]'
    region = grpc_convert.cuda_shared_memory_status(regions).regions["gpu_in"]
    assert (region.name, region.device_id, region.byte_size) == ("gpu_in", 1, 256)
    assert http_convert.cuda_shared_memory_status([]) == []
