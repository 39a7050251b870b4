"""An ensemble whose decoupled producer is ten times faster than its consumer, for minutes:
the server's memory with `max_inflight_requests` (issue 38).

    python -m bench.ensemble_backpressure [--seconds 120] [--limit 4] [--kib 256]

The producer (a decoupled Python model) sends responses of `--kib` KiB as fast as it can;
the consumer (a Python model that batches) takes 10 ms per request it is given, so without a
bound the responses would pile up in front of it. One gRPC stream asks the ensemble for
endless responses (a new request whenever one ends) for `--seconds`; the server's RSS is
sampled every second after a 10 s warm-up. Prints the RSS at the start and end of the
measured window, its peak, the responses per second and the largest batch the consumer saw
(its requests in flight: at most `--limit`), as one JSON line at the end.

tests/integration/test_ensemble_backpressure.py runs the same repository for seconds.
"""

from __future__ import annotations

import argparse
import json
import queue
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import rss_mib

PRODUCER = """\
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            count, elements = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().tolist()
            sender = request.get_response_sender()
            data = pb_utils.Tensor("DATA", np.ones(elements, np.float32))
            for i in range(count):
                if request.is_cancelled():
                    break
                seq = pb_utils.Tensor("SEQ", np.array([i], np.int32))
                sender.send(pb_utils.InferenceResponse([data, seq]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""
PRODUCER_CONFIG = """\
name: "bp_produce"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "IN", data_type: TYPE_INT32, dims: [ 2 ] } ]
output [
  { name: "DATA", data_type: TYPE_FP32, dims: [ -1 ] },
  { name: "SEQ", data_type: TYPE_INT32, dims: [ 1 ] }
]
"""
# 10 ms per request it is given, batched or not: SEEN is how many requests its batch held.
CONSUMER = """\
import time

import numpy as np
import triton_python_backend_utils as pb_utils

CONSUME_S = 0.010


class TritonPythonModel:
    def execute(self, requests):
        time.sleep(CONSUME_S * len(requests))
        seen = pb_utils.Tensor("SEEN", np.array([[len(requests)]], np.int32))
        responses = []
        for request in requests:
            seq = pb_utils.get_input_tensor_by_name(request, "SEQ").as_numpy()
            responses.append(pb_utils.InferenceResponse([seen, pb_utils.Tensor("SEQ_OUT", seq)]))
        return responses
"""
CONSUMER_CONFIG = """\
name: "bp_consume"
backend: "python"
max_batch_size: 64
dynamic_batching { }
input [
  { name: "DATA", data_type: TYPE_FP32, dims: [ -1 ] },
  { name: "SEQ", data_type: TYPE_INT32, dims: [ 1 ] }
]
output [
  { name: "SEEN", data_type: TYPE_INT32, dims: [ 1 ] },
  { name: "SEQ_OUT", data_type: TYPE_INT32, dims: [ 1 ] }
]
"""
ENSEMBLE_CONFIG = """\
name: "bp_pipeline"
platform: "ensemble"
max_batch_size: 0
input [ {{ name: "IN", data_type: TYPE_INT32, dims: [ 2 ] }} ]
output [
  {{ name: "SEEN", data_type: TYPE_INT32, dims: [ 1 ] }},
  {{ name: "SEQ", data_type: TYPE_INT32, dims: [ 1 ] }}
]
ensemble_scheduling {{
  max_inflight_requests: {limit}
  step [
    {{ model_name: "bp_produce", model_version: -1,
      input_map {{ key: "IN" value: "IN" }}
      output_map [ {{ key: "DATA" value: "DATA" }}, {{ key: "SEQ" value: "SEQ_MID" }} ] }},
    {{ model_name: "bp_consume", model_version: -1,
      input_map [ {{ key: "DATA" value: "DATA" }}, {{ key: "SEQ" value: "SEQ_MID" }} ]
      output_map [ {{ key: "SEEN" value: "SEEN" }}, {{ key: "SEQ_OUT" value: "SEQ" }} ] }}
  ]
}}
"""
PIPELINE = "bp_pipeline"


def write_repository(root: Path, limit: int) -> Path:
    """The producer, the consumer and the ensemble with max_inflight_requests `limit`."""
    for name, config, source in (
        ("bp_produce", PRODUCER_CONFIG, PRODUCER),
        ("bp_consume", CONSUMER_CONFIG, CONSUMER),
        (PIPELINE, ENSEMBLE_CONFIG.format(limit=limit), ""),
    ):
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(config)
        if source:
            (root / name / "1" / "model.py").write_text(source)
    return root


def hwm_mib(pid: int) -> float:
    """The peak resident memory of one process so far (VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


class Stream:
    """One gRPC stream to the pipeline: requests of `count` responses of `elements` floats."""

    def __init__(self, grpc_url: str) -> None:
        import tritonclient.grpc as grpcclient

        self._grpc = grpcclient
        self.results: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.client = grpcclient.InferenceServerClient(grpc_url)
        self.client.start_stream(callback=lambda result, error: self.results.put((result, error)))

    def request(self, count: int, elements: int) -> None:
        tensor = self._grpc.InferInput("IN", [2], "INT32")
        tensor.set_data_from_numpy(np.array([count, elements], np.int32))
        self.client.async_stream_infer(PIPELINE, [tensor], enable_empty_final_response=True)

    def responses(self, timeout_s: float = 60.0) -> tuple[list[int], int]:
        """One request's responses: the sequence numbers in order, and the largest SEEN."""
        seqs, peak = [], 0
        while True:
            result, error = self.results.get(timeout=timeout_s)
            if error is not None:
                raise RuntimeError(str(error))
            final = result.get_response().parameters["triton_final_response"].bool_param
            if result.as_numpy("SEQ") is not None:
                seqs.append(int(result.as_numpy("SEQ")[0]))
                peak = max(peak, int(result.as_numpy("SEEN")[0]))
            if final:
                return seqs, peak

    def close(self) -> None:
        self.client.stop_stream()
        self.client.close()


def main() -> None:
    from bench.server import start_server, stop_server, wait_ready

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--limit", type=int, default=4, help="max_inflight_requests")
    parser.add_argument("--kib", type=int, default=256, help="each produced response's size")
    args = parser.parse_args()
    elements = args.kib * 1024 // 4
    count = 200  # responses per request
    with tempfile.TemporaryDirectory() as tmp:
        repository = write_repository(Path(tmp) / "models", args.limit)
        server = start_server(repository, None, Path(tmp) / "server.log")
        try:
            wait_ready(server)
            pid = server.proc.pid
            stream = Stream(server.grpc_url)
            warm_end = time.monotonic() + 10.0
            while time.monotonic() < warm_end:
                stream.request(count, elements)
                stream.responses()
            start_rss, start_hwm = rss_mib(pid), hwm_mib(pid)
            samples, peak_seen, responses = [start_rss], 0, 0
            started = time.monotonic()
            end = started + args.seconds
            next_sample = started + 1.0
            while time.monotonic() < end:
                stream.request(count, elements)
                seqs, peak = stream.responses()
                if seqs != list(range(count)):
                    raise RuntimeError(f"responses out of order or missing: {seqs[:10]}...")
                responses += len(seqs)
                peak_seen = max(peak_seen, peak)
                if time.monotonic() >= next_sample:
                    samples.append(rss_mib(pid))
                    next_sample += 1.0
            elapsed = time.monotonic() - started
            stream.close()
            result = {
                "seconds": round(elapsed, 1),
                "limit": args.limit,
                "kib": args.kib,
                "responses_per_s": round(responses / elapsed, 1),
                "rss_start_mib": round(start_rss, 1),
                "rss_end_mib": round(samples[-1], 1),
                "rss_peak_mib": round(max(samples), 1),
                "hwm_growth_mib": round(hwm_mib(pid) - start_hwm, 1),
                "largest_consumer_batch": peak_seen,
            }
            print(f"server RSS {start_rss:.1f} -> {samples[-1]:.1f} MiB over {elapsed:.0f} s")
            print(json.dumps(result))
        finally:
            stop_server(server)


if __name__ == "__main__":
    main()
