"""Queue behaviours Triton's L0_model_queue relies on: a full queue refused in tritonserver's
words, `priority_levels` up to UINT64_MAX, and a failed ensemble request counted on the
ensemble's own failure metric (reason OTHER) as well as on its step's (REJECTED)."""

from __future__ import annotations

import re
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.serverproc import ServerProcess

U64_MAX = 2**64 - 1
MODULES = [httpclient, grpcclient]
IDS = ["http", "grpc"]


def _identity(name: str, delay_ms: int, batching: str) -> str:
    return f"""\
name: "{name}"
backend: "identity"
max_batch_size: 1
input [ {{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 1 ] }} ]
instance_group [ {{ count: 1, kind: KIND_CPU }} ]
parameters [ {{ key: "execute_delay_ms", value: {{ string_value: "{delay_ms}" }} }} ]
{batching}
"""


ENSEMBLE = """\
name: "ensemble_small_queue"
platform: "ensemble"
max_batch_size: 1
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ 1 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 1 ] } ]
ensemble_scheduling { step [ {
  model_name: "step_small_queue" model_version: -1
  input_map { key: "INPUT0" value: "INPUT0" }
  output_map { key: "OUTPUT0" value: "OUTPUT0" }
} ] }
"""


def _repository(root: Path) -> Path:
    models = root / "models"
    configs = {
        "small_queue": _identity(
            "small_queue", 600, "dynamic_batching { default_queue_policy { max_queue_size: 1 } }"
        ),
        "step_small_queue": _identity(
            "step_small_queue",
            600,
            "dynamic_batching { default_queue_policy { max_queue_size: 1 } }",
        ),
        "u64_levels": _identity(
            "u64_levels",
            400,
            f"dynamic_batching {{ priority_levels: {U64_MAX} default_priority_level: {U64_MAX} "
            "priority_queue_policy { key: 1 value { max_queue_size: 4 } } }",
        ),
        "ensemble_small_queue": ENSEMBLE,
    }
    for name, config in configs.items():
        (models / name / "1").mkdir(parents=True)  # identity: the version folder stays empty
        (models / name / "config.pbtxt").write_text(config)
    return models


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("triton_qa_queues")
    # A fixed queue-wait bound far above the waits here: only the queue policies refuse.
    proc = ServerProcess(_repository(root), "--max-queue-wait-ms=60000", log_path=root / "log")
    with proc:
        yield proc


def _infer(module: Any, server: ServerProcess, model: str, value: float, **kw: Any) -> Any:
    tensor = module.InferInput("INPUT0", [1, 1], "FP32")
    tensor.set_data_from_numpy(np.array([[value]], dtype=np.float32))
    return server.client(module).infer(model, [tensor], **kw)


def _at_once(calls: list[Any], gap_s: float = 0.0) -> list[Any]:
    """Start the calls `gap_s` apart, each on its thread; results or exceptions, in order."""
    results: list[Any] = [None] * len(calls)
    finished: list[int] = []

    def run(i: int) -> None:
        try:
            results[i] = calls[i]()
        except Exception as exc:  # returned to the test
            results[i] = exc
        finished.append(i)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
        time.sleep(gap_s)
    for thread in threads:
        thread.join(60)
    results.append(finished)
    return results


def _failures(server: ServerProcess, model: str) -> dict[str, int]:
    """nv_inference_request_failure of `model` by reason, read off the metrics endpoint as
    Triton's tests read it: `name{model="m",reason="R",version="1"} N`, no `_total`."""
    url = f"http://127.0.0.1:{server.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as answer:
        text = answer.read().decode()
    pattern = (
        rf'^nv_inference_request_failure\{{model="{model}",reason="(\w+)",version="1"\}} (\d+)$'
    )
    return {reason: int(count) for reason, count in re.findall(pattern, text, re.M)}


@pytest.mark.parametrize("module", MODULES, ids=IDS)
def test_a_full_queue_is_refused_in_tritons_words(server: ServerProcess, module: Any) -> None:
    """One runs, one waits (max_queue_size 1), the others: UNAVAILABLE `Exceeds maximum queue
    size` (L0_model_queue test_max_queue_size), our explanation after it."""
    results = _at_once([lambda: _infer(module, server, "small_queue", 1.0)] * 4, gap_s=0.05)
    refused = [r for r in results[:4] if isinstance(r, InferenceServerException)]
    served = [r for r in results[:4] if not isinstance(r, Exception)]
    assert len(served) == 2, results
    assert len(refused) == 2, results
    for error in refused:
        assert error.status() in ("503", "StatusCode.UNAVAILABLE"), error
        assert error.message().startswith("Exceeds maximum queue size: "), error
        assert "max_queue_size 1" in error.message(), error


@pytest.mark.parametrize("module", MODULES, ids=IDS)
def test_priority_levels_up_to_uint64_max(server: ServerProcess, module: Any) -> None:
    """`priority_levels: 18446744073709551615` loads (was refused: over 256) and priority 1
    passes requests queued at priority UINT64_MAX (the default level here)."""
    assert server.client(module).is_model_ready("u64_levels")
    calls = [
        lambda: _infer(module, server, "u64_levels", 0.0),  # runs at once
        lambda: _infer(module, server, "u64_levels", 1.0, priority=U64_MAX),
        lambda: _infer(module, server, "u64_levels", 2.0),  # the default level: UINT64_MAX
        lambda: _infer(module, server, "u64_levels", 3.0, priority=1),
    ]
    results = _at_once(calls, gap_s=0.1)
    for i, result in enumerate(results[:4]):
        assert not isinstance(result, Exception), result
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), [[float(i)]])
    finished = results[4]
    assert finished[:2] == [0, 3], finished  # priority 1 went ahead of the two queued before


def test_a_failed_ensemble_request_is_counted_on_the_ensemble(server: ServerProcess) -> None:
    """The step's queue (max_queue_size 1) refuses: the step counts REJECTED, the ensemble
    OTHER, twice per failed request, as tritonserver (L0_model_queue test_policy_reject expects
    4 for 2 failed ensemble requests)."""
    before_ensemble = _failures(server, "ensemble_small_queue")
    before_step = _failures(server, "step_small_queue")
    assert "OTHER" in before_ensemble, before_ensemble
    assert "REJECTED" in before_step, before_step
    results = _at_once(
        [lambda: _infer(grpcclient, server, "ensemble_small_queue", 1.0)] * 4, gap_s=0.05
    )
    refused = [r for r in results[:4] if isinstance(r, InferenceServerException)]
    assert len(refused) == 2, results
    for error in refused:
        assert "Exceeds maximum queue size" in error.message(), error
    after_ensemble = _failures(server, "ensemble_small_queue")
    after_step = _failures(server, "step_small_queue")
    # Twice per failed request, as tritonserver (its run's end and its error response).
    assert after_ensemble["OTHER"] - before_ensemble["OTHER"] == 4, after_ensemble
    assert after_ensemble.get("REJECTED", 0) == before_ensemble.get("REJECTED", 0)
    assert after_step["REJECTED"] - before_step["REJECTED"] == 2, after_step
