"""Behaviours of the request path Triton's own qa suites check (L0_optional_input,
L0_input_validation, L0_http, L0_parameters), found by running them against this server:
requests batched only with requests that give the same inputs, the batcher's configured delay
never refused as overload, and Triton's texts for refused requests."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from appliance.scheduling.instances import Job
from appliance.scheduling.policy import queue_wait_bound_ns
from appliance.scheduling.queues import RequestQueue
from tests.serverproc import ServerProcess

# Both inputs optional; requests wait up to 200 ms for others to batch with.
OPTIONAL_MIX = """\
name: "optional_mix"
backend: "identity"
max_batch_size: 4
input [
  { name: "INPUT0", data_type: TYPE_FP32, dims: [ 2 ], optional: true },
  { name: "INPUT1", data_type: TYPE_FP32, dims: [ 2 ], optional: true }
]
output [
  { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 2 ] },
  { name: "OUTPUT1", data_type: TYPE_FP32, dims: [ 2 ] }
]
dynamic_batching { max_queue_delay_microseconds: 200000 }
"""

# A lone request waits the whole 3 s delay for a batch of 4 that never fills.
LONG_DELAY = """\
name: "long_delay"
backend: "identity"
max_batch_size: 4
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ 1 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 1 ] } ]
dynamic_batching { preferred_batch_size: [ 4 ], max_queue_delay_microseconds: 3000000 }
"""

# Three inputs, the last optional (Triton's input_optional has three required and one).
SOME_OPTIONAL = """\
name: "{name}"
backend: "identity"
max_batch_size: 0
input [
  {{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 1 ] }},
  {{ name: "INPUT1", data_type: TYPE_FP32, dims: [ 1 ] }},
  {{ name: "INPUT2", data_type: TYPE_FP32, dims: [ 1 ]{optional} }}
]
output [
  {{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 1 ] }},
  {{ name: "OUTPUT1", data_type: TYPE_FP32, dims: [ 1 ] }},
  {{ name: "OUTPUT2", data_type: TYPE_FP32, dims: [ 1 ] }}
]
"""

# Any length of vector: a classification of more than 1,000,000 elements is refused.
VECTOR = """\
name: "vector"
backend: "identity"
max_batch_size: 0
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
"""

MODULES = [httpclient, grpcclient]
IDS = ["http", "grpc"]


def _repository(root: Path) -> Path:
    models = root / "models"
    configs = {
        "optional_mix": OPTIONAL_MIX,
        "long_delay": LONG_DELAY,
        "some_optional": SOME_OPTIONAL.format(name="some_optional", optional=", optional: true"),
        "all_required": SOME_OPTIONAL.format(name="all_required", optional=""),
        "vector": VECTOR,
    }
    for name, config in configs.items():
        (models / name / "1").mkdir(parents=True)  # the identity backend has no model file
        (models / name / "config.pbtxt").write_text(config)
    return models


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("triton_qa_core")
    proc = ServerProcess(_repository(root), log_path=root / "server.log")
    with proc:
        yield proc


def _input(module: Any, name: str, data: np.ndarray) -> Any:
    tensor = module.InferInput(name, list(data.shape), "FP32")
    tensor.set_data_from_numpy(data)
    return tensor


def _concurrently(calls: list[Any]) -> list[Any]:
    """Run the calls at once, each on its thread; their results (or exceptions) in order."""
    results: list[Any] = [None] * len(calls)

    def run(i: int) -> None:
        try:
            results[i] = calls[i]()
        except Exception as exc:  # returned to the test
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return results


@pytest.mark.parametrize("module", MODULES, ids=IDS)
def test_requests_with_different_optional_inputs_are_not_batched_together(
    server: ServerProcess, module: Any
) -> None:
    """L0_optional_input test_optional_mix_inputs: before, one batch held both and the
    model's outputs could not be split back (500 `internal error (KeyError)`)."""
    a = np.array([[1.0, 2.0]], dtype=np.float32)
    b = np.array([[3.0, 4.0]], dtype=np.float32)

    def infer(inputs: list[Any]) -> Any:  # a client of its own on each thread
        return server.client(module).infer("optional_mix", inputs)

    results = _concurrently(
        [
            lambda: infer([_input(module, "INPUT0", a)]),
            lambda: infer([_input(module, "INPUT1", b)]),
        ]
    )
    for result in results:
        assert not isinstance(result, Exception), result
    zeros = np.zeros((1, 2), dtype=np.float32)  # the identity backend's for a missing input
    np.testing.assert_array_equal(results[0].as_numpy("OUTPUT0"), a)
    np.testing.assert_array_equal(results[0].as_numpy("OUTPUT1"), zeros)
    np.testing.assert_array_equal(results[1].as_numpy("OUTPUT1"), b)
    np.testing.assert_array_equal(results[1].as_numpy("OUTPUT0"), zeros)

    # The same inputs given in another order still batch together (one execution of 2).
    stats_before = _executions(server, "optional_mix")
    both = [_input(module, "INPUT0", a), _input(module, "INPUT1", b)]
    results = _concurrently(
        [
            lambda: infer(both),
            lambda: infer(both[::-1]),
        ]
    )
    for result in results:
        assert not isinstance(result, Exception), result
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), b)
    after = _executions(server, "optional_mix")
    assert (after[0] - stats_before[0], after[1] - stats_before[1]) == (1, 2)


def _executions(server: ServerProcess, model: str) -> tuple[int, int]:
    stats = server.client(httpclient).get_inference_statistics(model)["model_stats"][0]
    return int(stats["execution_count"]), int(stats["inference_count"])


@pytest.mark.parametrize("module", MODULES, ids=IDS)
def test_a_request_waiting_for_the_configured_batch_delay_is_not_overloaded(
    server: ServerProcess, module: Any
) -> None:
    """L0_optional_input's 5 s max_queue_delay: a lone request waits the whole delay for a
    batch that never fills. Before, once the model had executed, the default bound (1 s)
    refused it: 503 `overloaded: waited 1252 ms`."""
    client = server.client(module)
    # A full preferred batch runs at once and teaches the scheduler the model's time.
    full = np.arange(4, dtype=np.float32).reshape(4, 1)
    started = time.monotonic()
    np.testing.assert_array_equal(
        client.infer("long_delay", [_input(module, "INPUT0", full)]).as_numpy("OUTPUT0"), full
    )
    assert time.monotonic() - started < 2.5
    alone = np.array([[7.0]], dtype=np.float32)
    started = time.monotonic()
    result = client.infer("long_delay", [_input(module, "INPUT0", alone)])
    waited = time.monotonic() - started
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), alone)
    assert 2.9 <= waited < 10, waited


def test_the_default_bound_adds_the_batch_delay_and_a_grown_bound_extends_deadlines() -> None:
    """The rules behind the test above, with numbers (pure functions and the queue)."""
    second = 1_000_000_000
    assert queue_wait_bound_ns(second, 16, 20e6, 3 * second) == 4 * second
    assert queue_wait_bound_ns(second, 16, 250e6, 3 * second) == 7 * second
    assert queue_wait_bound_ns(second, 0, 250e6, 3 * second) == second  # a fixed bound
    # A deadline set under a shorter bound: the queue asks again and keeps the job queued
    # until the later deadline the scheduler gives from the bound in force now.
    queue = RequestQueue("m", 0, 0, {}, 10)
    queued = Job(
        inputs={},
        batch_size=1,
        shape_key=(),
        output_names=(),
        future=asyncio.Future(loop=asyncio.new_event_loop()),
    )
    queue.push(queued, 0, 0, now=0, overdue_at=36 * second)
    assert queue.overdue(40 * second, lambda job: 80 * second) == []
    assert len(queue) == 1
    assert queue.overdue(79 * second) == []
    assert queue.overdue(80 * second, lambda job: 0) == [queued]
    assert len(queue) == 0


@pytest.mark.parametrize("module", MODULES, ids=IDS)
def test_an_output_requested_twice_is_refused(server: ServerProcess, module: Any) -> None:
    """L0_http test_duplicate_output_names (and L0_grpc's): before, 200."""
    client = server.client(module)
    inputs = [_input(module, "INPUT0", np.ones(3, dtype=np.float32))]
    outputs = [module.InferRequestedOutput("OUTPUT0"), module.InferRequestedOutput("OUTPUT0")]
    with pytest.raises(InferenceServerException) as caught:
        client.infer("vector", inputs, outputs=outputs)
    assert "output 'OUTPUT0' already exists in request" in str(caught.value)
    assert caught.value.status() == (
        "400" if module is httpclient else "StatusCode.INVALID_ARGUMENT"
    )
    # Once is fine.
    result = client.infer("vector", inputs, outputs=outputs[:1])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.ones(3, dtype=np.float32))


@pytest.mark.parametrize("module", MODULES, ids=IDS)
@pytest.mark.parametrize(
    ("model", "given", "expected"),
    [
        (
            "all_required",
            ["INPUT0"],
            "expected 3 inputs but got 1 inputs for model 'all_required'. Got input(s) "
            "['INPUT0'], but missing required input(s) ['INPUT1','INPUT2']. Please provide "
            "all required input(s).",
        ),
        (
            "some_optional",
            [],
            "expected number of inputs between 2 and 3 but got 0 inputs for model "
            "'some_optional'. Got input(s) [], but missing required input(s) "
            "['INPUT0','INPUT1']. Please provide all required input(s).",
        ),
        (
            "some_optional",
            ["INPUT2", "INPUT0"],
            "expected number of inputs between 2 and 3 but got 2 inputs for model "
            "'some_optional'. Got input(s) ['INPUT0','INPUT2'], but missing required input(s) "
            "['INPUT1']. Please provide all required input(s).",
        ),
    ],
)
def test_missing_inputs_in_tritons_words(
    server: ServerProcess, module: Any, model: str, given: list[str], expected: str
) -> None:
    """L0_input_validation InputValTest: the count names the optional inputs' range, and the
    lists are written as Triton writes them (before: `expected 3 inputs`, `['INPUT1', ...]`)."""
    client = server.client(module)
    inputs = [_input(module, name, np.ones(1, dtype=np.float32)) for name in given]
    with pytest.raises(InferenceServerException) as caught:
        client.infer(model, inputs)
    assert expected in str(caught.value)
    assert caught.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")


@pytest.mark.parametrize("module", MODULES, ids=IDS)
def test_classification_of_a_huge_output_is_refused(server: ServerProcess, module: Any) -> None:
    """L0_parameters class_count_test test_classification_output_tensor_too_large: more than
    1,000,000 elements asked for as a classification: 400 (before: sorted and answered)."""
    client = server.client(module)
    huge = [_input(module, "INPUT0", np.ones(1_000_001, dtype=np.float32))]
    top = [module.InferRequestedOutput("OUTPUT0", class_count=2)]
    with pytest.raises(InferenceServerException) as caught:
        client.infer("vector", huge, outputs=top)
    assert "classification output tensor too large" in str(caught.value)
    assert caught.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")
    # At the limit it is classified.
    limit = np.zeros(1_000_000, dtype=np.float32)
    limit[7] = 5.0
    result = client.infer("vector", [_input(module, "INPUT0", limit)], outputs=top).as_numpy(
        "OUTPUT0"
    )
    assert result[0] == b"5.000000:7"
