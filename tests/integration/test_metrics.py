"""Prometheus metrics on the metrics port, checked against the statistics API."""

from __future__ import annotations

import urllib.request

import numpy as np
import pytest
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from tests.serverproc import ServerProcess


def scrape(server: ServerProcess) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics") as resp:
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = resp.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def test_inference_metrics_match_the_statistics(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    inp = httpclient.InferInput("INPUT0", [2, 3], "INT16")
    inp.set_data_from_numpy(np.ones((2, 3), np.int16))
    for _ in range(3):
        client.infer("identity_int16", [inp])
    bad = httpclient.InferInput("INPUT0", [2, 3], "INT32")
    bad.set_data_from_numpy(np.ones((2, 3), np.int32))
    with pytest.raises(InferenceServerException, match="data-type is 'INT32'"):
        client.infer("identity_int16", [bad])
    stats = client.get_inference_statistics("identity_int16")["model_stats"][0]
    samples = scrape(server)
    labels = (("model", "identity_int16"), ("version", "1"))
    assert (
        samples[("nv_inference_request_success_total", labels)]
        == stats["inference_stats"]["success"]["count"]
    )
    assert samples[("nv_inference_request_success_total", labels)] >= 3
    other = tuple(sorted((*labels, ("reason", "OTHER"))))
    # a request its checks refuse is no failure, as in tritonserver (it never reached the model)
    assert samples.get(("nv_inference_request_failure_total", other), 0) == 0
    assert samples[("nv_inference_count_total", labels)] == stats["inference_count"]
    assert samples[("nv_inference_exec_count_total", labels)] == stats["execution_count"]
    assert samples[("nv_inference_compute_infer_duration_us_total", labels)] == (
        stats["inference_stats"]["compute_infer"]["ns"] // 1000
    )
    assert samples[("nv_inference_pending_request_count", labels)] == 0
    assert 0.0 <= samples[("nv_cpu_utilization", ())] <= 1.0
    assert samples[("nv_cpu_memory_total_bytes", ())] > samples[("nv_cpu_memory_used_bytes", ())]


def test_metrics_can_be_turned_off(start_server, model_repository) -> None:  # type: ignore[no-untyped-def]
    proc = start_server(model_repository, "--allow-metrics=false")
    assert "Started Metrics Service" not in proc.log()
    assert "Started HTTPService" in proc.log()


def test_latency_histogram_behind_metrics_config(start_server, model_repository) -> None:  # type: ignore[no-untyped-def]
    proc = start_server(
        model_repository,
        "--metrics-config=histogram_latencies=true",
        "--metrics-config",
        "summary_latencies=true",
        "--metrics-config=counter_latencies=false",
    )
    client = httpclient.InferenceServerClient(proc.http_url)
    inp = httpclient.InferInput("INPUT0", [1, 4], "FP64")
    inp.set_data_from_numpy(np.zeros((1, 4), np.float64))
    for _ in range(5):
        client.infer("identity_fp64", [inp])
    samples = scrape(proc)
    labels = (("model", "identity_fp64"), ("version", "1"))
    count = samples[("nv_inference_first_response_histogram_ms_count", labels)]
    assert count == 5
    inf = tuple(sorted((*labels, ("le", "+Inf"))))
    assert samples[("nv_inference_first_response_histogram_ms_bucket", inf)] == 5
    assert samples[("nv_inference_first_response_histogram_ms_sum", labels)] > 0
    assert samples[("nv_inference_request_summary_us_count", labels)] == 5
    assert "--metrics-config summary_latencies" not in proc.log()
    assert "--metrics-config counter_latencies is a tritonserver flag" in proc.log()
