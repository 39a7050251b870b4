"""A sequence stays on one model instance from START to END (Triton's sequence slots): a
stateful Python model with `count: 2` keeps each sequence's running sum in the instance."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient

from tests.serverproc import ServerProcess

STATEFUL = """\
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    \"\"\"OUTPUT: this instance's running sum for the row's CORRID; PID: the instance.\"\"\"

    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            start = pb_utils.get_input_tensor_by_name(request, "START").as_numpy().ravel()
            corrid = pb_utils.get_input_tensor_by_name(request, "CORRID").as_numpy().ravel()
            out = np.zeros_like(x)
            for row, value in enumerate(x.ravel()):
                key = int(corrid[row])
                if start[row]:
                    self.sums[key] = 0
                self.sums[key] = self.sums.get(key, -1000000) + int(value)
                out.ravel()[row] = self.sums[key]
            pid = np.full(x.shape, os.getpid(), dtype=np.int32)
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUTPUT", out), pb_utils.Tensor("PID", pid)]))
        return responses
"""

CONFIG = """\
name: "{name}"
backend: "python"
max_batch_size: {mbs}
input [ {{ name: "INPUT", data_type: TYPE_INT32, dims: [ 1 ] }} ]
output [
  {{ name: "OUTPUT", data_type: TYPE_INT32, dims: [ 1 ] }},
  {{ name: "PID", data_type: TYPE_INT32, dims: [ 1 ] }}
]
instance_group [ {{ count: 2, kind: KIND_CPU }} ]
sequence_batching {{
  {strategy}
  max_sequence_idle_microseconds: 10000000
  control_input [
    {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "CORRID" control [ {{ kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 }} ] }}
  ]
}}
"""

MODELS = {
    "stateful_direct": (0, "direct { }"),
    "stateful_batched": (4, "direct { }"),
    "stateful_oldest": (4, "oldest { max_candidate_sequences: 3 }"),
}


@pytest.fixture(scope="module")
def seq_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("sequence_instances")
    for name, (mbs, strategy) in MODELS.items():
        (root / "models" / name / "1").mkdir(parents=True)
        (root / "models" / name / "1" / "model.py").write_text(STATEFUL)
        (root / "models" / name / "config.pbtxt").write_text(
            CONFIG.format(name=name, mbs=mbs, strategy=strategy)
        )
    proc = ServerProcess(root / "models", log_path=root / "server.log")
    with proc:
        yield proc


def _input(module: Any, value: int, batching: bool) -> list[Any]:
    shape = [1, 1] if batching else [1]
    tensor = module.InferInput("INPUT", shape, "INT32")
    tensor.set_data_from_numpy(np.full(shape, value, dtype=np.int32))
    return [tensor]


@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("module", [httpclient, grpcclient])
def test_interleaved_sequences_keep_their_instance(
    seq_server: ServerProcess, module: Any, model: str
) -> None:
    url = seq_server.http_url if module is httpclient else seq_server.grpc_url
    client = module.InferenceServerClient(url)
    batching = MODELS[model][0] > 0
    base = 5000 if module is httpclient else 6000
    seqs = {base + i: [i + 1, 10 * (i + 1), 100 * (i + 1), 1000 * (i + 1)] for i in range(2)}
    sums: dict[int, list[int]] = {sid: [] for sid in seqs}
    pids: dict[int, set[int]] = {sid: set() for sid in seqs}
    for step in range(4):
        for sid, values in seqs.items():
            result = client.infer(
                model,
                _input(module, values[step], batching),
                sequence_id=sid,
                sequence_start=step == 0,
                sequence_end=step == 3,
            )
            sums[sid].append(int(result.as_numpy("OUTPUT").ravel()[0]))
            pids[sid].add(int(result.as_numpy("PID").ravel()[0]))
    for sid, values in seqs.items():
        assert sums[sid] == list(np.cumsum(values))
        assert len(pids[sid]) == 1  # one instance for the whole sequence
    assert len(set().union(*pids.values())) == 2  # two sequences: one on each instance


@pytest.mark.parametrize("model", list(MODELS))
async def test_concurrent_sequences_beyond_the_slots_wait_and_stay_correct(
    seq_server: ServerProcess, model: str
) -> None:
    """More sequences than slots (2 with direct and max_batch_size 0): the others wait for a
    slot; every sequence still runs on one instance with its own sum."""
    client = grpcaio.InferenceServerClient(seq_server.grpc_url)
    batching = MODELS[model][0] > 0

    async def sequence(sid: int) -> tuple[list[int], set[int]]:
        sums, pids = [], set()
        for step in range(5):
            result = await client.infer(
                model,
                _input(grpcaio, sid % 100 + step, batching),
                sequence_id=sid,
                sequence_start=step == 0,
                sequence_end=step == 4,
            )
            sums.append(int(result.as_numpy("OUTPUT").ravel()[0]))
            pids.add(int(result.as_numpy("PID").ravel()[0]))
        return sums, pids

    try:
        results = await asyncio.gather(*(sequence(7000 + i) for i in range(8)))
    finally:
        await client.close()
    for i, (sums, pids) in enumerate(results):
        assert sums == list(np.cumsum([i + step for step in range(5)]))
        assert len(pids) == 1
