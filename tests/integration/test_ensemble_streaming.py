"""An ensemble whose decoupled step is followed by an ordinary step streams: each response
goes out as soon as the steps after the decoupled one are done for it, in order (Triton's
L0_decoupled sequence_repeat; a generate -> detokenize pipeline). And an ensemble's own
statistics count its executions, as Triton's ensemble scheduler does: one per successful
request, of batch size max(1, batch)."""

from __future__ import annotations

import queue
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto
from prometheus_client.parser import text_string_to_metric_families

from configs.generate import identity_model, save
from tests.serverproc import ServerProcess

# A decoupled Python model: IN = [count, gap_ms] -> `count` responses `gap_ms` apart, the i-th
# SEQ = [i] and SENT = [the server's time.time() when it sent it].
PACED = """\
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            count, gap_ms = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().tolist()
            sender = request.get_response_sender()
            for i in range(count):
                if i:
                    time.sleep(gap_ms / 1000)
                seq = pb_utils.Tensor("SEQ", np.array([i], np.int32))
                sent = pb_utils.Tensor("SENT", np.array([time.time()], np.float64))
                sender.send(pb_utils.InferenceResponse([seq, sent]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""
PACED_CONFIG = """\
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
instance_group [ { count: 2, kind: KIND_CPU } ]  # two requests stream side by side
input [ { name: "IN", data_type: TYPE_INT32, dims: [ 2 ] } ]
output [
  { name: "SEQ", data_type: TYPE_INT32, dims: [ 1 ] },
  { name: "SENT", data_type: TYPE_FP64, dims: [ 1 ] }
]
"""
# paced -> identity (ONNX): OUT is SEQ after the identity step; SENT straight from paced.
PACED_ENSEMBLE = """\
name: "ens_paced"
platform: "ensemble"
input [ { name: "IN", data_type: TYPE_INT32, dims: [ 2 ] } ]
output [
  { name: "OUT", data_type: TYPE_INT32, dims: [ 1 ] },
  { name: "SENT", data_type: TYPE_FP64, dims: [ 1 ] }
]
ensemble_scheduling { step [
  { model_name: "py_paced", model_version: -1,
    input_map { key: "IN" value: "IN" }
    output_map [ { key: "SEQ" value: "MID" }, { key: "SENT" value: "SENT" } ] },
  { model_name: "id_int", model_version: -1,
    input_map { key: "INPUT0" value: "MID" } output_map { key: "OUTPUT0" value: "OUT" } }
] }
"""
ID_CONFIG = """\
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: {mbs}
input [ {{ name: "INPUT0", data_type: {dtype}, dims: [ {n} ] }} ]
output [ {{ name: "OUTPUT0", data_type: {dtype}, dims: [ {n} ] }} ]
"""
# A plain (not decoupled) ensemble that batches: one identity step.
PLAIN_ENSEMBLE = """\
name: "ens_plain"
platform: "ensemble"
max_batch_size: 8
input [ { name: "IN", data_type: TYPE_FP32, dims: [ 3 ] } ]
output [ { name: "OUT", data_type: TYPE_FP32, dims: [ 3 ] } ]
ensemble_scheduling { step [
  { model_name: "id_fp32", model_version: -1,
    input_map { key: "INPUT0" value: "IN" } output_map { key: "OUTPUT0" value: "OUT" } }
] }
"""


def _identity(root: Path, name: str, mbs: int, n: int, onnx_type: int, dtype: str) -> None:
    shape: list[int | str] = ["batch", n] if mbs else [n]
    save(identity_model(onnx_type, shape), root / name / "1" / "model.onnx")
    (root / name / "config.pbtxt").write_text(
        ID_CONFIG.format(name=name, mbs=mbs, n=n, dtype=dtype)
    )


def _write(root: Path, name: str, config: str, source: str = "") -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(config)
    if source:
        (root / name / "1" / "model.py").write_text(source)


@pytest.fixture(scope="module")
def stream_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    base = tmp_path_factory.mktemp("ensemble_streaming")
    root = base / "models"
    _identity(root, "id_int", 0, 1, TensorProto.INT32, "TYPE_INT32")
    _identity(root, "id_fp32", 8, 3, TensorProto.FLOAT, "TYPE_FP32")
    _write(root, "py_paced", PACED_CONFIG, PACED)
    _write(root, "ens_paced", PACED_ENSEMBLE)
    _write(root, "ens_plain", PLAIN_ENSEMBLE)
    proc = ServerProcess(root, log_path=base / "server.log")
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()


def _stream(
    server: ServerProcess, requests: list[tuple[str, int, int]], pause_s: float = 0.0
) -> dict[str, list[tuple[int, float, float]]]:
    """Send (request id, count, gap_ms) requests on one gRPC stream, `pause_s` apart; each
    id's responses as (OUT, SENT, the client's time.time() on arrival), until its final flag."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    results: queue.Queue[tuple[Any, Any, float]] = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error, time.time())))
    got: dict[str, list[tuple[int, float, float]]] = {rid: [] for rid, _, _ in requests}
    try:
        for n, (rid, count, gap_ms) in enumerate(requests):
            if n:
                time.sleep(pause_s)
            inp = grpcclient.InferInput("IN", [2], "INT32")
            inp.set_data_from_numpy(np.array([count, gap_ms], np.int32))
            client.async_stream_infer(
                "ens_paced", [inp], request_id=rid, enable_empty_final_response=True
            )
        open_ids = set(got)
        while open_ids:
            result, error, arrived = results.get(timeout=60)
            assert error is None, error
            response = result.get_response()
            if response.parameters["triton_final_response"].bool_param:
                assert result.as_numpy("OUT") is None
                open_ids.discard(response.id)
                continue
            out, sent = result.as_numpy("OUT"), result.as_numpy("SENT")
            got[response.id].append((int(out[0]), float(sent[0]), arrived))
    finally:
        client.stop_stream()
    return got


def test_responses_stream_through_a_step_after_a_decoupled_step(
    stream_server: ServerProcess,
) -> None:
    """4 responses 400 ms apart: the first reaches the client before the decoupled model
    sends its last (before the fix, every response waited for the decoupled step's end)."""
    got = _stream(stream_server, [("r", 4, 400)])["r"]
    assert [out for out, _, _ in got] == [0, 1, 2, 3]  # in order, each through the identity
    sent = [s for _, s, _ in got]
    assert sent == sorted(sent)
    first_arrived, last_sent = got[0][2], sent[-1]
    assert first_arrived < last_sent, (first_arrived - last_sent, got)
    # Each response arrives after it was sent: the clocks compared are one machine's.
    assert all(arrived >= s for _, s, arrived in got)


def test_two_requests_on_one_stream_interleave(stream_server: ServerProcess) -> None:
    """Two requests 200 ms apart, 3 responses 600 ms apart each: their responses stream
    side by side, each request's in order (Triton's L0_decoupled test_response_order)."""
    got = _stream(stream_server, [("a", 3, 600), ("b", 3, 600)], pause_s=0.2)
    for rid in ("a", "b"):
        assert [out for out, _, _ in got[rid]] == [0, 1, 2]
    # b's first response reached the client before a sent its last one.
    assert got["b"][0][2] < got["a"][-1][1]


def test_a_decoupled_request_with_no_responses_still_ends(stream_server: ServerProcess) -> None:
    assert _stream(stream_server, [("none", 0, 0)]) == {"none": []}


def _metrics(server: ServerProcess, model: str) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics") as resp:
        text = resp.read().decode()
    wanted = {("model", model), ("version", "1")}
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if set(sample.labels.items()) == wanted:
                samples[sample.name] = sample.value
    return samples


@pytest.mark.parametrize("module", [httpclient, grpcclient])
def test_an_ensemble_counts_its_executions(stream_server: ServerProcess, module: Any) -> None:
    """Each successful request is one execution of batch size max(1, batch): requests of
    batch 1, 1 and 2 make 3 executions, 4 inferences, batch_stats {1: 2, 2: 1}; the metrics
    say the same."""
    url = stream_server.http_url if module is httpclient else stream_server.grpc_url
    client = module.InferenceServerClient(url)

    def stats() -> dict[str, Any]:
        if module is grpcclient:
            got = client.get_inference_statistics("ens_plain", "1", as_json=True)
        else:
            got = client.get_inference_statistics("ens_plain", "1")
        return dict(got["model_stats"][0])

    def sizes(model_stats: dict[str, Any]) -> dict[int, int]:
        return {
            int(b["batch_size"]): int(b["compute_infer"]["count"])
            for b in model_stats.get("batch_stats", [])
        }

    before = stats()
    for batch in (1, 1, 2):
        x = np.arange(3 * batch, dtype=np.float32).reshape(batch, 3)
        inp = module.InferInput("IN", [batch, 3], "FP32")
        inp.set_data_from_numpy(x)
        np.testing.assert_array_equal(client.infer("ens_plain", [inp]).as_numpy("OUT"), x)
    after = stats()
    # gRPC's JSON leaves zero counts out (proto3).
    assert int(after.get("execution_count", 0)) - int(before.get("execution_count", 0)) == 3
    assert int(after.get("inference_count", 0)) - int(before.get("inference_count", 0)) == 4
    grown = sizes(after)
    for size, count in sizes(before).items():
        grown[size] -= count
    assert grown == {1: 2, 2: 1}
    assert int(after["last_inference"]) > 0
    success = after["inference_stats"]["success"]
    assert int(success["count"]) - int(before["inference_stats"]["success"].get("count", 0)) == 3
    samples = _metrics(stream_server, "ens_plain")
    assert samples["nv_inference_exec_count_total"] == int(after["execution_count"])
    assert samples["nv_inference_count_total"] == int(after["inference_count"])
    assert samples["nv_inference_request_success_total"] == int(success["count"])


def test_a_decoupled_ensemble_counts_one_execution_per_request(
    stream_server: ServerProcess,
) -> None:
    client = httpclient.InferenceServerClient(stream_server.http_url)
    before = client.get_inference_statistics("ens_paced", "1")["model_stats"][0]
    _stream(stream_server, [("x", 2, 0), ("y", 1, 0)])
    after = client.get_inference_statistics("ens_paced", "1")["model_stats"][0]
    assert after["execution_count"] - before.get("execution_count", 0) == 2
    assert after["inference_count"] - before.get("inference_count", 0) == 2
