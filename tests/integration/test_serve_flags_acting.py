"""tritonserver flags that were accepted and ignored, acting on a CPU device:
--model-load-retry-count (a failed version's load tried again), --metrics-config
summary_latencies / summary_quantiles (Triton's nv_inference_*_summary_us)."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families

from configs.generate import SIMPLE_CONFIG, save, simple_model
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
