"""A BLS call to a decoupled model holds a bounded number of responses (issue 31, item 10).

The server sent every response of the called model to the calling model's process as fast as
they came, where they waited in an unbounded queue until the model iterated: a model that
reads slowly, or reads one and stops, grew by everything the called model sent (1.8 MB/s in
the tester's run) and kept it. Now the process grants the server room as it takes responses
(a window of 32), and the server holds the called model back meanwhile, as its own streams do.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.serverproc import ServerProcess

ELEMENTS = 16384  # 64 KiB of FP32 a response
COUNT = 2000  # 125 MiB in all: what the calling process held before the bound

PRODUCER = """\
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            count = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy().ravel()[0])
            block = np.ones(ELEMENTS, dtype=np.float32)
            for i in range(count):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", block * i)]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
""".replace("ELEMENTS", str(ELEMENTS))

PRODUCER_CONFIG = """\
name: "producer"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "N", data_type: TYPE_INT32, dims: [ 1 ] } ]
output [ { name: "OUT", data_type: TYPE_FP32, dims: [ ELEMENTS ] } ]
""".replace("ELEMENTS", str(ELEMENTS))

# Reads one response, then waits until its own memory grew by 64 MiB (what the old server
# made it hold) or 4 s passed, notes the growth, then reads the rest and counts them.
CALLER = """\
import time

import numpy as np
import triton_python_backend_utils as pb_utils


def rss_bytes():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            n = pb_utils.get_input_tensor_by_name(request, "N").as_numpy()
            call = pb_utils.InferenceRequest(
                model_name="producer", requested_output_names=["OUT"],
                inputs=[pb_utils.Tensor("N", n)])
            stream = iter(call.exec(decoupled=True))
            first = next(stream)
            before = rss_bytes()
            deadline = time.monotonic() + 4
            while time.monotonic() < deadline and rss_bytes() - before < (64 << 20):
                time.sleep(0.05)
            grown = rss_bytes() - before
            count, total = 1, float(first.output_tensors()[0].as_numpy()[0])
            for response in stream:
                if response.has_error():
                    raise pb_utils.TritonModelException(response.error().message())
                if response.output_tensors():
                    count += 1
                    total += float(response.output_tensors()[0].as_numpy()[0])
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("GROWN", np.array([grown], dtype=np.int64)),
                pb_utils.Tensor("COUNT", np.array([count], dtype=np.int64)),
                pb_utils.Tensor("TOTAL", np.array([total], dtype=np.float64)),
            ]))
        return responses
"""

CALLER_CONFIG = """\
name: "caller"
backend: "python"
max_batch_size: 0
input [ { name: "N", data_type: TYPE_INT32, dims: [ 1 ] } ]
output [
  { name: "GROWN", data_type: TYPE_INT64, dims: [ 1 ] },
  { name: "COUNT", data_type: TYPE_INT64, dims: [ 1 ] },
  { name: "TOTAL", data_type: TYPE_FP64, dims: [ 1 ] }
]
"""


@pytest.fixture(scope="module")
def proc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("bls_bound")
    for name, source, config in (
        ("producer", PRODUCER, PRODUCER_CONFIG),
        ("caller", CALLER, CALLER_CONFIG),
    ):
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.py").write_text(source)
        (root / name / "config.pbtxt").write_text(config)
    server = ServerProcess(root, log_path=tmp_path_factory.mktemp("bls_bound_logs") / "s.log")
    try:
        server.wait_ready(timeout_s=120)
        yield server
    finally:
        server.stop()


def test_a_slow_bls_reader_holds_a_bounded_number_of_responses(proc: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(proc.http_url, network_timeout=120)
    inp = httpclient.InferInput("N", [1], "INT32")
    inp.set_data_from_numpy(np.array([COUNT], dtype=np.int32))
    result = client.infer("caller", [inp])
    grown = int(result.as_numpy("GROWN")[0])
    # 32 responses of 64 KiB are 2 MiB; the old server sent all 2,000 (125 MiB) at once.
    assert grown < 24 << 20, f"the calling process grew by {grown >> 20} MiB"
    # Every response arrived, in order, none lost to the window.
    assert int(result.as_numpy("COUNT")[0]) == COUNT
    assert float(result.as_numpy("TOTAL")[0]) == sum(range(COUNT))
