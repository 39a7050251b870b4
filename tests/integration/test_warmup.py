"""Model warm-up runs before a version reports ready, and a failing sample fails the load."""

from __future__ import annotations

import tritonclient.http as httpclient

from tests.serverproc import ServerProcess


def test_warm_up_runs_before_ready_and_is_not_counted(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    assert client.is_model_ready("warmed")
    log = server.log()
    zeros = log.index("model 'warmed' version 1: warm-up 'zeros' done (2 runs on 1 instances")
    from_file = log.index("model 'warmed' version 1: warm-up 'from_file' done")
    ready = log.index("model 'warmed' version 1 is READY")
    assert zeros < from_file < ready
    stats = client.get_inference_statistics("warmed")["model_stats"][0]
    assert stats["execution_count"] == 0  # warm-up is not traffic


def test_warm_up_with_a_missing_file_fails_the_load_with_the_reason(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    assert not client.is_model_ready("warmup_missing_file")
    index = {e["name"]: e for e in client.get_model_repository_index()}
    reason = index["warmup_missing_file"]["reason"]
    assert index["warmup_missing_file"]["state"] == "UNAVAILABLE"
    assert "warm-up sample 'from_file' input 'INPUT0'" in reason
    assert "warmup/absent.bin" in reason
