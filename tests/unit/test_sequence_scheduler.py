"""The sequence batcher with a gated in-process model: order, state, batching, controls."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from appliance.runtime.specs import sequence_spec
from appliance.scheduling.instances import InstanceWorker, Job
from appliance.scheduling.sequence import SequenceError, SequenceScheduler
from appliance.scheduling.stats import ModelStats
from edge_backends.api import InstanceBase

CONFIG = """
name: "sum" max_batch_size: 8
sequence_batching {
  max_sequence_idle_microseconds: 50000
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [0, 1] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END fp32_false_true: [0, 1] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_STRING } ] }
  ]
  state [ { input_name: "S_IN" output_name: "S_OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
}
"""


class RunningSum(InstanceBase):
    """OUT = (START ? 0 : S_IN) + X; records each batch's rows and CORRIDs."""

    def __init__(self, gate: threading.Event) -> None:
        self.gate = gate
        self.batches: list[list[bytes]] = []

    def execute(self, inputs: Any, output_names: Any) -> dict[str, np.ndarray]:
        self.gate.wait(5)
        self.batches.append([bytes(c) for c in inputs["CORRID"].ravel()])
        assert inputs["END"].dtype == np.float32
        out = inputs["S_IN"] * (1 - inputs["START"]) + inputs["X"]
        return {"OUT": out, "S_OUT": out}

    def close(self) -> None:
        pass


def job(sid: int | str, x: int, start: bool = False, end: bool = False) -> Job:
    j = Job(
        inputs={"X": np.array([[x]], dtype=np.int32)},
        batch_size=1,
        shape_key=((1,),),
        output_names=("OUT",),
        future=asyncio.get_running_loop().create_future(),
    )
    j.sequence_id, j.sequence_start, j.sequence_end = sid, start, end
    return j


def scheduler(gate: threading.Event) -> tuple[SequenceScheduler, RunningSum]:
    model = RunningSum(gate)
    config = text_format.Parse(CONFIG, mc.ModelConfig())
    sched = SequenceScheduler(
        "model 'sum' version 1",
        [InstanceWorker("w", model, True)],
        sequence_spec(config, max_waiting=100),
        ModelStats(),
    )
    sched.start()
    return sched, model


async def test_requests_of_different_sequences_share_a_batch_in_order() -> None:
    gate = threading.Event()
    sched, model = scheduler(gate)
    first = asyncio.ensure_future(sched.submit(job("a", 1, start=True)))  # occupies the instance
    await asyncio.sleep(0.01)
    queued = [
        asyncio.ensure_future(sched.submit(job("a", 2))),
        asyncio.ensure_future(sched.submit(job("b", 10, start=True))),
        asyncio.ensure_future(sched.submit(job("c", 100, start=True))),
        asyncio.ensure_future(sched.submit(job("a", 3, end=True))),
    ]
    await asyncio.sleep(0.01)
    gate.set()
    results = [int(r["OUT"][0, 0]) for r in await asyncio.gather(first, *queued)]
    assert results == [1, 3, 10, 100, 6]  # a's running sum survives the batches in between
    assert model.batches[1] == [b"a", b"b", b"c"]  # one row per sequence, a's next in order
    assert model.batches[2] == [b"a"]
    await sched.stop(1, "was unloaded")
    sched.release(1)


async def test_unknown_and_idle_sequences_are_refused() -> None:
    gate = threading.Event()
    gate.set()
    sched, _ = scheduler(gate)
    start_flag = "must specify the START flag on the first request of the sequence"
    with pytest.raises(SequenceError, match=f"sequence zzz to model 'sum' {start_flag}"):
        await sched.submit(job("zzz", 1))
    await sched.submit(job("s9", 1, start=True))
    await asyncio.sleep(0.2)  # max_sequence_idle_microseconds is 50 ms
    with pytest.raises(SequenceError, match=f"sequence s9 to model 'sum' {start_flag}"):
        await sched.submit(job("s9", 1))
    await sched.stop(1, "was unloaded")
    sched.release(1)
