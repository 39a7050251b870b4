"""`triton_python_backend_utils` without a server: helpers, ModelConfig, tensors, requests,
the custom-metric store and how /metrics writes a model's families."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from appliance.frontends.metrics import exposition
from appliance.services.metrics import CustomMetricsCollector, InferenceCollector
from edge_backends.api import CustomMetricFamily, InstanceBase, MetricSample
from edge_backends.python import triton_python_backend_utils as pb_utils
from edge_backends.python.custom_metrics import MetricError, MetricStore, answer


def test_config_helpers() -> None:
    config = {
        "input": [{"name": "IN", "data_type": "TYPE_INT32", "dims": [1]}],
        "output": [{"name": "OUT", "data_type": "TYPE_FP16", "dims": [-1]}],
        "model_transaction_policy": {"decoupled": True},
    }
    assert pb_utils.using_decoupled_model_transaction_policy(config) is True
    assert pb_utils.using_decoupled_model_transaction_policy({}) is False
    assert pb_utils.get_input_config_by_name(config, "IN") == config["input"][0]
    assert pb_utils.get_output_config_by_name(config, "IN") is None
    assert pb_utils.triton_string_to_numpy("TYPE_FP16") is np.float16
    assert pb_utils.triton_string_to_numpy("TYPE_STRING") is np.object_
    assert pb_utils.triton_to_numpy_type(8) is np.int32
    assert pb_utils.numpy_to_triton_type(np.float32) == 11
    assert pb_utils.numpy_to_triton_type(np.bytes_) == 13


def test_bytes_tensor_serialization_round_trip() -> None:
    tensor = np.array([[b"a", b""], ["text", b"\x00\xff"]], dtype=np.object_)
    encoded = pb_utils.serialize_byte_tensor(tensor)
    assert encoded[:5] == b"\x01\x00\x00\x00a"
    decoded = pb_utils.deserialize_bytes_tensor(encoded)
    assert decoded.tolist() == [b"a", b"", b"text", b"\x00\xff"]
    assert pb_utils.serialize_byte_tensor(np.array([], dtype=np.object_)) == ()
    assert pb_utils.serialize_byte_tensor(np.zeros(2, np.float32)) is None


def test_model_config_extends_and_refuses_conflicts() -> None:
    config = pb_utils.ModelConfig(
        '{"name": "m", "max_batch_size": 8, "input": '
        '[{"name": "A", "data_type": "TYPE_FP32", "dims": [4]}]}'
    )
    config.add_input({"name": "A", "data_type": "TYPE_FP32", "dims": [4], "optional": True})
    config.add_input({"name": "B", "data_type": "TYPE_INT8", "dims": [2]})
    config.add_output({"name": "Y", "data_type": "TYPE_FP32", "dims": [4]})
    assert [i["name"] for i in config.as_dict()["input"]] == ["A", "B"]
    assert config.as_dict()["input"][0]["optional"] is True
    with pytest.raises(ValueError, match="configuration expects datatype TYPE_FP32"):
        config.add_input({"name": "A", "data_type": "TYPE_INT32", "dims": [4]})
    with pytest.raises(ValueError, match="the model expects dims"):
        config.add_output({"name": "Y", "data_type": "TYPE_FP32", "dims": [5]})
    with pytest.raises(ValueError, match="contains property other than"):
        config.add_output({"name": "Z", "data_type": "TYPE_FP32", "dims": [1], "optional": 1})
    with pytest.raises(ValueError, match="is missing 'dims' property"):
        config.add_input({"name": "C", "data_type": "TYPE_FP32"})
    with pytest.raises(ValueError, match="configuration specified max_batch_size 8"):
        config.set_max_batch_size(4)
    config.set_dynamic_batching()
    config.set_model_transaction_policy({"decoupled": False})
    with pytest.raises(ValueError, match="trying to change decoupled property"):
        config.set_model_transaction_policy({"decoupled": True})
    sequence = pb_utils.ModelConfig({"name": "s", "sequence_batching": {}})
    with pytest.raises(ValueError, match="scheduling_choice as 'sequence_batching'"):
        sequence.set_dynamic_batching()


def test_tensor_dlpack_round_trip_on_cpu() -> None:
    source = pb_utils.Tensor("X", np.arange(6, dtype=np.float32).reshape(2, 3))
    back = pb_utils.Tensor.from_dlpack("Y", source.to_dlpack())
    np.testing.assert_array_equal(back.as_numpy(), source.as_numpy())
    assert back.name() == "Y"
    assert back.is_cpu()
    assert back.triton_dtype() == 11
    from_object = pb_utils.Tensor.from_dlpack("Z", source)  # an object with __dlpack__
    np.testing.assert_array_equal(from_object.as_numpy(), source.as_numpy())
    with pytest.raises(pb_utils.TritonModelException, match="not contiguous"):
        pb_utils.Tensor.from_dlpack("T", np.arange(6).reshape(2, 3).T)


def test_requests_and_responses_as_the_binding_builds_them() -> None:
    request = pb_utils.InferenceRequest(
        model_name=b"add_sub",
        inputs=[pb_utils.Tensor("X", np.array(["a"]))],
        requested_output_names=["Y"],
        correlation_id="seq-1",
        flags=pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START,
        parameters={"key": "value", "n": 3, "on": True},
    )
    assert request._model_name == "add_sub"
    assert request.inputs()[0].as_numpy().dtype == np.object_
    assert request.parameters() == '{"key": "value", "n": 3, "on": true}'
    assert request.correlation_id() == "seq-1"
    with pytest.raises(pb_utils.TritonModelException, match="values bool, int or str"):
        pb_utils.InferenceRequest(model_name="m", parameters={"bad": 1.5})
    with pytest.raises(pb_utils.TritonModelException, match="Correlation ID"):
        pb_utils.InferenceRequest(model_name="m", correlation_id=1.5)  # type: ignore[arg-type]
    with pytest.raises(pb_utils.TritonModelException, match="only inside a model"):
        request.exec()
    with pytest.raises(pb_utils.TritonModelException, match="only inside a model"):
        pb_utils.MetricFamily("m", "d", pb_utils.MetricFamily.GAUGE)
    response = pb_utils.InferenceResponse(error=pb_utils.TritonError("nope"), parameters={"a": 1})
    assert response.has_error()
    assert response.error().code() == pb_utils.TritonError.INTERNAL
    assert response.parameters() == '{"a": 1}'
    assert pb_utils.TritonError("x", pb_utils.TritonError.CANCELLED).code() == 7
    assert pb_utils.Logger.WARNING == pb_utils.LogLevel.WARNING


def test_metric_store_shares_families_and_checks_use() -> None:
    store = MetricStore()
    first: dict[str, int] = {}
    second: dict[str, int] = {}
    answer(store, first, "metric_family", ("hits", "Hits", 0))
    answer(store, second, "metric_family", ("hits", "Hits", 0))  # another instance: shared
    key = answer(store, first, "metric_new", ("hits", {"model": "m"}, None))
    assert answer(store, second, "metric_new", ("hits", {"model": "m"}, None)) == key
    answer(store, first, "metric_op", ("hits", key, "increment", 2.0))
    assert answer(store, second, "metric_op", ("hits", key, "increment", 3.0)) == 5.0
    with pytest.raises(MetricError, match="already exists as a counter"):
        answer(store, first, "metric_family", ("hits", "Hits", 1))
    with pytest.raises(MetricError, match="invalid metric name"):
        answer(store, first, "metric_family", ("9lives", "", 0))
    with pytest.raises(MetricError, match="Unexpected buckets found"):
        answer(store, first, "metric_new", ("hits", {}, [1.0]))
    answer(store, first, "metric_family", ("sizes", "Sizes", 2))
    with pytest.raises(MetricError, match="Missing required buckets"):
        answer(store, first, "metric_new", ("sizes", {}, None))
    sizes = answer(store, first, "metric_new", ("sizes", {}, [1.0, 10.0]))
    for value in (0.5, 1.0, 3.0, 30.0):
        answer(store, first, "metric_op", ("sizes", sizes, "observe", value))
    (histogram,) = store.snapshot(["sizes"])
    assert histogram.samples[0].buckets == ((1.0, 2), (10.0, 3))
    assert (histogram.samples[0].count, histogram.samples[0].sum) == (4, 34.5)
    store.release_family("hits")
    assert [f.name for f in store.snapshot(["hits"])] == ["hits"]  # the other still holds it
    store.release_family("hits")
    assert store.snapshot(["hits"]) == []


class _Reporting(InstanceBase):
    def __init__(self, families: list[CustomMetricFamily]) -> None:
        self._families = families

    def execute(self, inputs, output_names):  # type: ignore[no-untyped-def]
        return {}

    def close(self) -> None:
        pass

    def custom_metrics(self) -> list[CustomMetricFamily]:
        return self._families


def test_exposition_writes_a_models_counter_as_triton_does() -> None:
    counter = CustomMetricFamily(
        "requests_process_latency_ns",
        "Cumulative time spent processing requests",
        "counter",
        (MetricSample((("model", "custom_metrics"), ("version", "1")), value=1234.0),),
    )
    clash = CustomMetricFamily("nv_inference_count", "mine", "gauge", (MetricSample((), 1.0),))
    served = SimpleNamespace(instances=(_Reporting([counter, clash]), _Reporting([counter])))
    registry = CollectorRegistry(auto_describe=False)
    registry.register(InferenceCollector(lambda: []))
    registry.register(CustomMetricsCollector(lambda: [served]))  # type: ignore[list-item]
    text = exposition(registry).decode()
    assert "# HELP requests_process_latency_ns Cumulative time spent processing requests\n" in text
    assert "# TYPE requests_process_latency_ns counter\n" in text
    assert 'requests_process_latency_ns{model="custom_metrics",version="1"} 1234\n' in text
    assert text.count("# TYPE requests_process_latency_ns counter") == 1  # shared: once
    assert "mine" not in text  # a model's family named like the server's is left out
    assert "# TYPE nv_inference_count counter\n" in text  # the server's own, as Triton's


def test_instances_report_no_custom_metrics_by_default() -> None:
    assert _Reporting([]).custom_metrics() == []
    assert InstanceBase.custom_metrics(_Reporting([])) == ()
