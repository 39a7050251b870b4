"""Overload with large request bodies (issue 17, item 14): many clients sending 1 MiB requests
back to back to a model that cannot keep up. Admitted requests are answered within about
--max-queue-wait-ms plus an execution, counted from their arrival (reading the body included);
the excess is refused with 503 before its body is read; health checks stay fast.

Before the fix every refused request had its whole body read and decoded first, every
connection's body was read at once, and admission saw only the scheduler's queue: admitted
requests waited seconds past the bound and /v2/health/ready took hundreds of milliseconds.
"""

from __future__ import annotations

import http.client
import json
import logging
import statistics
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2, service_pb2_grpc

from configs.generate import matmul_chain_model, save

log = logging.getLogger(__name__)

WIDTH = 512  # INPUT0 is [512, 512] FP32: a 1 MiB body
CONFIG = f"""\
name: "wide"
platform: "onnxruntime_onnx"
max_batch_size: 0
input [ {{ name: "INPUT0", data_type: TYPE_FP32, dims: [ {WIDTH}, {WIDTH} ] }} ]
output [ {{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ {WIDTH}, {WIDTH} ] }} ]
instance_group [ {{ count: 1, kind: KIND_CPU }} ]
"""
BOUND_S = 0.5
CLIENTS = 96
STEPS = 12  # about 40 ms per request on one core
LOAD_S = 6.0


def _request() -> tuple[bytes, dict[str, str]]:
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "datatype": "FP32",
                    "shape": [WIDTH, WIDTH],
                    "parameters": {"binary_data_size": WIDTH * WIDTH * 4},
                }
            ],
            "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
        }
    ).encode()
    body = header + np.full((WIDTH, WIDTH), 0.5, np.float32).tobytes()
    return body, {
        "Inference-Header-Content-Length": str(len(header)),
        "Content-Type": "application/octet-stream",
    }


@dataclass
class Results:
    admitted: list[float] = field(default_factory=list)  # seconds
    refused: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    health: list[float] = field(default_factory=list)


def _client(host: str, port: int, until: float, out: Results, lock: threading.Lock) -> None:
    """Back to back on one keep-alive connection, as a client that retries at once does."""
    body, headers = _request()
    conn = http.client.HTTPConnection(host, port, timeout=30)
    while time.monotonic() < until:
        started = time.monotonic()
        try:
            conn.request("POST", "/v2/models/wide/infer", body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
        except OSError as exc:  # a reset instead of an answer is a failure of the server
            with lock:
                out.errors.append(f"{type(exc).__name__}: {exc}")
            conn.close()
            conn = http.client.HTTPConnection(host, port, timeout=30)
            continue
        took = time.monotonic() - started
        with lock:
            if resp.status == 200:
                out.admitted.append(took)
            elif resp.status == 503 and b"overloaded" in data:
                out.refused.append(took)
            else:
                out.errors.append(f"{resp.status} {data[:200]!r}")
    conn.close()


def _health(host: str, port: int, until: float, out: Results) -> None:
    conn = http.client.HTTPConnection(host, port, timeout=30)
    while time.monotonic() < until:
        started = time.monotonic()
        conn.request("GET", "/v2/health/ready")
        resp = conn.getresponse()
        resp.read()
        assert resp.status == 200
        out.health.append(time.monotonic() - started)
        time.sleep(0.02)
    conn.close()


def _service_time(host: str, port: int) -> float:
    """The model's time per request, alone (the median of a few)."""
    body, headers = _request()
    conn = http.client.HTTPConnection(host, port, timeout=30)
    times = []
    for _ in range(6):
        started = time.monotonic()
        conn.request("POST", "/v2/models/wide/infer", body=body, headers=headers)
        resp = conn.getresponse()
        resp.read()
        assert resp.status == 200
        times.append(time.monotonic() - started)
    conn.close()
    return statistics.median(times[1:])


def _execution_s(http_url: str) -> float:
    """The model's mean execution time so far, as the server measured it (statistics)."""
    with urllib.request.urlopen(f"http://{http_url}/v2/models/wide/stats") as resp:
        stats = json.loads(resp.read())["model_stats"][0]["inference_stats"]
    parts = ("compute_input", "compute_infer", "compute_output")
    return sum(stats[k]["ns"] for k in parts) / max(1, stats["compute_infer"]["count"]) / 1e9


def _p(values: list[float], q: float) -> float:
    return float(np.percentile(values, q))


def test_large_bodies_under_overload(start_server, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    save(matmul_chain_model(WIDTH, STEPS, WIDTH), repo / "wide" / "1" / "model.onnx")
    (repo / "wide" / "config.pbtxt").write_text(CONFIG)
    proc = start_server(repo, f"--max-queue-wait-ms={int(BOUND_S * 1000)}")
    host, port = proc.http_url.split(":")
    service_s = _service_time(host, int(port))

    out = Results()
    lock = threading.Lock()
    until = time.monotonic() + LOAD_S
    threads = [
        threading.Thread(target=_client, args=(host, int(port), until, out, lock))
        for _ in range(CLIENTS)
    ]
    threads.append(threading.Thread(target=_health, args=(host, int(port), until, out)))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # An execution under the load: the machine's other work slows the model down too.
    execution_s = max(service_s, _execution_s(proc.http_url))

    summary = (
        f"service {service_s * 1000:.0f} ms, {execution_s * 1000:.0f} ms under load; "
        f"admitted {len(out.admitted)} p50/p90/p99 "
        f"{_p(out.admitted, 50) * 1000:.0f}/{_p(out.admitted, 90) * 1000:.0f}/"
        f"{_p(out.admitted, 99) * 1000:.0f} ms; refused {len(out.refused)} p50/p99 "
        f"{_p(out.refused, 50) * 1000:.0f}/{_p(out.refused, 99) * 1000:.0f} ms; health "
        f"{len(out.health)} p50/p99 {_p(out.health, 50) * 1000:.1f}/"
        f"{_p(out.health, 99) * 1000:.1f} ms; errors {len(out.errors)} {out.errors[:3]}"
    )
    log.info(summary)
    # Every client got an answer: refused bodies are read off the connection, not reset.
    assert not out.errors, summary
    assert out.refused, summary
    assert len(out.admitted) >= 10, summary
    # Admitted requests: the bound plus about one execution, counted from their arrival, with
    # margins for a 2-core machine loaded by others too, where executions vary widely (measured
    # p90 0.7-1.1 s at load average 3-10, 2 s at 11; before the fix 3.9-5 s).
    assert _p(out.admitted, 90) < BOUND_S + 8 * execution_s + 0.5, summary
    # Refused without waiting for the work ahead: measured p50 80-150 ms, about the time the
    # client takes to send its body while 95 others send theirs; that scales with the
    # machine's load as the model does (p50 510 ms with executions at 116 ms, four busy
    # processes beside the test).
    assert _p(out.refused, 50) < max(0.5, 6 * execution_s), summary
    # Health stays off the busy path: measured p50 3-5 ms, p99 20-140 ms at load average 3-8
    # (other processes included), p50 5-19 ms, p99 0.4 s at 9; before the fix p50 65-350 ms,
    # p99 0.3-6 s.
    assert _p(out.health, 50) < 0.03, summary
    assert _p(out.health, 99) < 0.5, summary

SLEEPY = """\
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        time.sleep(0.3)
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
            for r in requests]
"""
SLEEPY_CONFIG = """\
name: "sleepy"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ 4 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 4 ] } ]
"""


def _pending(metrics_port: int) -> float:
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    with urllib.request.urlopen(url) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith('nv_inference_pending_request_count{model="sleepy"'):
                return float(line.split()[-1])
    return 0.0


def test_a_refused_request_is_refused_before_its_body_is_read(
    start_server, tmp_path: Path
) -> None:
    """Admission is decided from the model in the URL (HTTP) or before decoding (gRPC): a
    request the model has no room for gets 503 / UNAVAILABLE, whatever its body holds; before,
    its body was read and decoded first (here: 400 / INVALID_ARGUMENT for a broken body)."""
    repo = tmp_path / "repo"
    (repo / "sleepy" / "1").mkdir(parents=True)
    (repo / "sleepy" / "1" / "model.py").write_text(SLEEPY)
    (repo / "sleepy" / "config.pbtxt").write_text(SLEEPY_CONFIG)
    proc = start_server(repo, "--max-queue-wait-ms=100")
    client = httpclient.InferenceServerClient(proc.http_url, concurrency=2)
    inp = httpclient.InferInput("INPUT0", [4], "FP32")
    inp.set_data_from_numpy(np.ones(4, np.float32))
    for _ in range(2):  # the scheduler learns that a request takes 300 ms
        client.infer("sleepy", [inp])
    # One running and one waiting (always admitted): 600 ms of work, over the 100 ms bound.
    busy = [client.async_infer("sleepy", [inp]) for _ in range(2)]
    deadline = time.monotonic() + 5
    while _pending(proc.metrics_port) < 1:
        assert time.monotonic() < deadline, "the second request never queued"
        time.sleep(0.01)

    host, port = proc.http_url.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    conn.request(
        "POST",
        "/v2/models/sleepy/infer",
        body=b"\xff" * 100_000,  # neither JSON nor a binary header: a 400 if it were read
        headers={"Inference-Header-Content-Length": "50", "Content-Type": "application/json"},
    )
    resp = conn.getresponse()
    body = resp.read()
    assert resp.status == 503, body
    assert b"overloaded" in body
    # The body was read off the connection: it serves the next request.
    conn.request("GET", "/v2/health/ready")
    assert conn.getresponse().status == 200
    conn.close()

    with grpc.insecure_channel(proc.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        request = service_pb2.ModelInferRequest(model_name="sleepy")
        tensor = request.inputs.add(name="INPUT0", datatype="FP32")
        tensor.shape.extend([4])
        request.raw_input_contents.append(b"\0" * 5)  # 5 bytes for 16: INVALID_ARGUMENT if read
        with pytest.raises(grpc.RpcError) as refused:
            stub.ModelInfer(request, timeout=10)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, refused.value.details()
    assert "overloaded" in (refused.value.details() or "")
    for handle in busy:
        assert handle.get_result().as_numpy("OUTPUT0").tolist() == [1.0] * 4
