"""tritonserver flags that were accepted and ignored, acting on a CPU device:
--model-load-retry-count (a failed version's load tried again), --metrics-config
summary_latencies / summary_quantiles (Triton's nv_inference_*_summary_us), --host-policy (an
instance's cores and NUMA node), --grpc-max-response-pool-size (a decoupled request's
responses waiting for its client)."""

from __future__ import annotations

import os
import platform
import signal
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from appliance.common.host_policy import format_cores
from bench.common import process_tree
from configs.generate import SIMPLE_CONFIG, save, simple_model
from tests.integration.models import write_py_flood
from tests.serverproc import ServerProcess

FLAKY_CONFIG = """\
name: "{name}"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ 4 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 4 ] } ]
"""
# Fails its first FAILURES initialize() calls; each call is counted in the file `tries`.
FLAKY = """\
from pathlib import Path

import triton_python_backend_utils as pb_utils

TRIES = Path(__file__).parent / "tries"
FAILURES = {failures}


class TritonPythonModel:
    def initialize(self, args):
        tries = len(TRIES.read_text()) if TRIES.exists() else 0
        TRIES.write_text("x" * (tries + 1))
        if tries < FAILURES:
            raise RuntimeError(f"the sensor is not up yet (try {{tries + 1}})")

    def execute(self, requests):
        outputs = [pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() for r in requests]
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", o)]) for o in outputs]
"""


def _flaky(root: Path, name: str, failures: int) -> Path:
    folder = root / name
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(FLAKY_CONFIG.replace("{name}", name))
    (folder / "1" / "model.py").write_text(FLAKY.format(failures=failures))
    return folder / "1" / "tries"


@pytest.mark.parametrize(("retries", "ready"), [(0, False), (2, True)])
def test_model_load_retry_count_tries_a_failed_load_again(
    tmp_path: Path, retries: int, ready: bool
) -> None:
    root = tmp_path / "models"
    late = _flaky(root, "py_late", failures=2)  # up on its third try
    never = _flaky(root, "py_never", failures=100)
    flags = ("--model-control-mode=explicit", "--load-model=*", "--strict-readiness=false")
    if retries:
        flags += (f"--model-load-retry-count={retries}",)
    with ServerProcess(root, *flags, log_path=tmp_path / "server.log") as server:
        client = httpclient.InferenceServerClient(server.http_url)
        assert client.is_model_ready("py_late") is ready
        assert not client.is_model_ready("py_never")
        # Each failed load tried 1 + N times, no more; a load that succeeds stops trying.
        assert len(late.read_text()) == (3 if ready else 1)
        assert len(never.read_text()) == 1 + retries
        if retries:
            assert "retrying: 2 more tries, --model-load-retry-count" in server.log()


SUMMARIES = (
    "nv_inference_request_summary_us",
    "nv_inference_queue_summary_us",
    "nv_inference_compute_input_summary_us",
    "nv_inference_compute_infer_summary_us",
    "nv_inference_compute_output_summary_us",
)


def _summary_samples(server: ServerProcess) -> dict[str, dict[str, float]]:
    """Each summary family of model 'simple': {quantile or '_count' / '_sum': value}."""
    url = f"http://127.0.0.1:{server.metrics_port}/metrics"
    with urllib.request.urlopen(url) as resp:
        text = resp.read().decode()
    found: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        if family.name not in SUMMARIES:
            continue
        assert family.type == "summary"
        for sample in family.samples:
            if sample.labels.get("model") != "simple":
                continue
            assert sample.labels["version"] == "1"
            key = sample.labels.get("quantile") or sample.name[len(family.name) :]
            found.setdefault(family.name, {})[key] = sample.value
    return found


@pytest.mark.parametrize(
    ("flags", "quantiles"),
    [
        ((), None),
        (("--metrics-config=summary_latencies=true",), ["0.5", "0.9", "0.95", "0.99", "0.999"]),
        (
            (
                "--metrics-config=summary_latencies=true",
                "--metrics-config=summary_quantiles=0.5:0.05,0.99:0.001",
            ),
            ["0.5", "0.99"],
        ),
    ],
)
def test_summary_latencies_adds_tritons_summaries(
    tmp_path: Path, flags: tuple[str, ...], quantiles: list[str] | None
) -> None:
    root = tmp_path / "models"
    save(simple_model(), root / "simple" / "1" / "model.onnx")
    (root / "simple" / "config.pbtxt").write_text(SIMPLE_CONFIG)
    with ServerProcess(root, *flags, log_path=tmp_path / "server.log") as server:
        client = httpclient.InferenceServerClient(server.http_url)
        inputs = [httpclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
        for tensor in inputs:
            tensor.set_data_from_numpy(np.ones((1, 16), np.int32))
        for _ in range(7):
            client.infer("simple", inputs)
        found = _summary_samples(server)
        assert "--metrics-config summary_" not in server.log()  # not reported ignored
    if quantiles is None:
        assert found == {}
        return
    assert sorted(found) == sorted(SUMMARIES)
    for name, samples in found.items():
        assert sorted(k for k in samples if not k.startswith("_")) == quantiles, name
        assert samples["_count"] == 7, name
        assert samples["_sum"] >= 0, name
    request = found["nv_inference_request_summary_us"]
    assert 0 < request["0.5"] <= request[quantiles[-1]] <= request["_sum"]
    compute = found["nv_inference_compute_infer_summary_us"]
    assert 0 < compute["0.5"] <= request[quantiles[-1]]


def test_a_bad_summary_quantile_is_refused(tmp_path: Path) -> None:
    server = ServerProcess(
        tmp_path,
        "--metrics-config=summary_quantiles=0.5-0.05",
        log_path=tmp_path / "server.log",
    )
    try:
        assert server.proc.wait(60) != 0
    finally:
        server.stop()  # a server that started anyway is not left running
    assert "summary_quantiles expects QUANTILE:ERROR" in server.log()


# ---- --host-policy -------------------------------------------------------------------------

# Reports where its process runs: its memory policy (mode, first word of the node mask; -1: no
# get_mempolicy on this machine) and the cores it may run on.
WHEREAMI = """\
import ctypes
import os
import platform

import numpy as np
import triton_python_backend_utils as pb_utils

GET_MEMPOLICY = {"x86_64": 239, "aarch64": 236}


def mempolicy():
    number = GET_MEMPOLICY.get(platform.machine())
    if number is None:
        return -1, 0
    libc = ctypes.CDLL(None, use_errno=True)
    mode, mask = ctypes.c_int(), (ctypes.c_ulong * 16)()
    call = (ctypes.c_long(number), ctypes.byref(mode), mask, ctypes.c_ulong(1024), None, 0)
    if libc.syscall(*call[:5], ctypes.c_ulong(0)) != 0:
        raise OSError(ctypes.get_errno(), "get_mempolicy")
    return mode.value, mask[0]


class TritonPythonModel:
    def execute(self, requests):
        out = np.array([*mempolicy(), *sorted(os.sched_getaffinity(0))], dtype=np.int64)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", out)]) for _ in requests]
"""
WHEREAMI_CONFIG = """\
name: "{name}"
backend: "python"
max_batch_size: 0
input [ { name: "IN", data_type: TYPE_INT64, dims: [ 1 ] } ]
output [ { name: "OUT", data_type: TYPE_INT64, dims: [ -1 ] } ]
{groups}
"""
MPOL_BIND = 2
NUMA = Path("/sys/devices/system/node/node0").is_dir() and platform.machine() in (
    "x86_64",
    "aarch64",
)


def _whereami(client: httpclient.InferenceServerClient, model: str) -> tuple[int, int, set[int]]:
    tensor = httpclient.InferInput("IN", [1], "INT64")
    tensor.set_data_from_numpy(np.zeros(1, np.int64))
    out = client.infer(model, [tensor]).as_numpy("OUT").tolist()
    return out[0], out[1], set(out[2:])


def _thread_cores(pid: int) -> list[str]:
    """Cpus_allowed_list of each thread of the process."""
    lists = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        for line in (task / "status").read_text().splitlines():
            if line.startswith("Cpus_allowed_list:"):
                lists.append(line.split()[1])
    return lists


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to bind to one")
def test_host_policy_binds_an_instances_cores_and_memory_node(tmp_path: Path) -> None:
    """Instances under policy 'cpu' (a KIND_CPU group's default name, as in Triton) run on the
    policy's core with their memory bound to node 0: a Python model's process and an ONNX
    model's instance thread; one whose group names a policy no flag gives is not bound, nor is
    the server's main thread (the loading threads are put back)."""
    allowed = os.sched_getaffinity(0)
    core = max(allowed)
    root = tmp_path / "models"
    for name, groups in (
        ("bound", ""),
        ("free", 'instance_group [ { kind: KIND_CPU, host_policy: "elsewhere" } ]'),
    ):
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.py").write_text(WHEREAMI)
        config = WHEREAMI_CONFIG.replace("{name}", name).replace("{groups}", groups)
        (root / name / "config.pbtxt").write_text(config)
    save(simple_model(), root / "simple" / "1" / "model.onnx")
    (root / "simple" / "config.pbtxt").write_text(SIMPLE_CONFIG)
    flags = [f"--host-policy=cpu,cpu-cores={core}-{core}"]
    if NUMA:
        flags.append("--host-policy=cpu,numa-node=0")
    with ServerProcess(root, *flags, log_path=tmp_path / "server.log") as server:
        client = httpclient.InferenceServerClient(server.http_url)
        mode, mask, cores = _whereami(client, "bound")
        assert cores == {core}
        if NUMA:
            assert (mode, mask) == (MPOL_BIND, 1)
        mode, mask, cores = _whereami(client, "free")
        assert cores == allowed
        assert mode in (0, -1)  # MPOL_DEFAULT
        inputs = [httpclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
        for tensor in inputs:
            tensor.set_data_from_numpy(np.ones((1, 16), np.int32))
        client.infer("simple", inputs)
        threads = _thread_cores(server.proc.pid)
        assert str(core) in threads  # the ONNX instance's thread (and its runtime's threads)
        main = Path(f"/proc/{server.proc.pid}/status").read_text()
        assert f"Cpus_allowed_list:\t{format_cores(allowed)}" in main
        assert "--host-policy" not in server.log()  # not reported ignored
        # Over gRPC (whose thread lane would run a short model on a handler thread) and
        # after its process died: the restarted process is bound as the first was.
        grpc_client = grpcclient.InferenceServerClient(server.grpc_url)
        tensor = grpcclient.InferInput("IN", [1], "INT64")
        tensor.set_data_from_numpy(np.zeros(1, np.int64))
        for _ in range(40):
            assert set(grpc_client.infer("bound", [tensor]).as_numpy("OUT")[2:]) == {core}
        victims = [
            pid
            for pid in process_tree(server.proc.pid)[1:]
            if f"Cpus_allowed_list:\t{core}\n" in Path(f"/proc/{pid}/status").read_text()
        ]
        assert len(victims) == 1, victims
        os.kill(victims[0], signal.SIGKILL)
        for _ in range(20):
            try:
                answer = grpc_client.infer("bound", [tensor]).as_numpy("OUT")
                break
            except InferenceServerException:  # the execution the death interrupted
                time.sleep(0.2)
        else:
            raise AssertionError("the model was not restarted")
        assert set(answer[2:]) == {core}


# ---- --grpc-max-response-pool-size ---------------------------------------------------------

def _sent_before_reading(server: ServerProcess, count: int, size: int) -> int:
    """How many of `count` responses the model sent while its client read nothing for 2 s."""
    request = service_pb2.ModelInferRequest(model_name="stamped")
    request.inputs.add(name="IN", datatype="INT64", shape=[2])
    request.raw_input_contents.append(np.array([count, size], np.int64).tobytes())
    done = threading.Event()

    def requests() -> Iterator[service_pb2.ModelInferRequest]:
        yield request
        done.wait(60)

    options = [("grpc.max_receive_message_length", 64 << 20)]
    with grpc.insecure_channel(server.grpc_url, options=options) as channel:
        stream = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer(
            requests(), timeout=120
        )
        try:
            time.sleep(2)  # the model sends what the bounds let through, then waits
            reading = time.monotonic_ns()
            stamps = []
            for message in stream:
                assert not message.error_message, message.error_message
                response = message.infer_response
                stamps.append(int(np.frombuffer(response.raw_output_contents[1], np.int64)[0]))
                if len(stamps) == count:
                    break
        finally:
            done.set()
            stream.cancel()
    return sum(stamp < reading for stamp in stamps)


def test_grpc_max_response_pool_size_holds_a_decoupled_model_back_sooner(tmp_path: Path) -> None:
    """Responses of 256 KiB to a client that reads nothing for 2 s: the model gets as far
    ahead as the request's own bound (the flag: 2, then 50), plus the stream's (64 responses
    waiting for the client) and HTTP/2's buffers, the same for both; every response arrives
    either way."""
    root = tmp_path / "models"
    write_py_flood(root, "stamped")
    sent = {}
    for pool in (2, 50):
        flag = f"--grpc-max-response-pool-size={pool}"
        with ServerProcess(root, flag, log_path=tmp_path / "server.log") as server:
            sent[pool] = _sent_before_reading(server, 300, 256 << 10)
            assert "--grpc-max-response-pool-size" not in server.log()  # not ignored
    assert sent[2] < sent[50] < 300, sent
    assert sent[50] - sent[2] >= 48 - 15, sent  # the bounds' difference, give or take
