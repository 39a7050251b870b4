"""Sequence slots: a sequence stays on one instance from START to END, as in Triton.

Instances here keep each sequence's running sum in themselves (as a stateful Python model
does), so a request that reached another instance would get a wrong sum."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from appliance.common.errors import InvalidInput
from appliance.runtime.specs import sequence_spec
from appliance.scheduling.instances import InstanceWorker, Job
from appliance.scheduling.sequence import SequenceError, SequenceScheduler
from appliance.scheduling.stats import ModelStats
from edge_backends.api import InstanceBase

CONFIG = """
name: "stateful" max_batch_size: {mbs}
sequence_batching {{
  {strategy}
  max_sequence_idle_microseconds: 5000000
  control_input [
    {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START int32_false_true: [0, 1] }} ] }},
    {{ name: "CORRID" control [ {{ kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 }} ] }}
  ]
}}
"""


class InstanceState(InstanceBase):
    """OUT = this instance's running sum for the row's CORRID; records (instance, CORRID)."""

    def __init__(self, name: str, log: list[tuple[str, int]], gate: threading.Event) -> None:
        self.name = name
        self.log = log
        self.gate = gate
        self.sums: dict[int, int] = {}

    def execute(self, inputs: Any, output_names: Any) -> dict[str, np.ndarray]:
        self.gate.wait(5)
        out = np.zeros_like(inputs["X"])
        for row, (corrid, start) in enumerate(
            zip(inputs["CORRID"].ravel(), inputs["START"].ravel(), strict=True)
        ):
            key = int(corrid)
            self.log.append((self.name, key))
            self.sums[key] = (0 if start else self.sums[key]) + int(inputs["X"].ravel()[row])
            out.ravel()[row] = self.sums[key]
        return {"OUT": out}

    def close(self) -> None:
        pass


def job(sid: int | str, x: int, batching: bool, start: bool = False, end: bool = False) -> Job:
    j = Job(
        inputs={"X": np.array([[x]] if batching else [x], dtype=np.int32)},
        batch_size=1,
        shape_key=((1,),),
        output_names=("OUT",),
        future=asyncio.get_running_loop().create_future(),
    )
    j.sequence_id, j.sequence_start, j.sequence_end = sid, start, end
    return j


def scheduler(
    instances: int, mbs: int, strategy: str = "", gate: threading.Event | None = None
) -> tuple[SequenceScheduler, list[tuple[str, int]]]:
    log: list[tuple[str, int]] = []
    if gate is None:
        gate = threading.Event()
        gate.set()
    config = text_format.Parse(CONFIG.format(mbs=mbs, strategy=strategy), mc.ModelConfig())
    workers = [
        InstanceWorker(f"i{n}", InstanceState(f"i{n}", log, gate), mbs > 0)
        for n in range(instances)
    ]
    sched = SequenceScheduler(
        "model 'stateful' version 1", workers, sequence_spec(config, 100), ModelStats()
    )
    sched.start()
    return sched, log


async def run_sequence(
    sched: SequenceScheduler, sid: int, values: list[int], batching: bool
) -> list[int]:
    sums = []
    for step, value in enumerate(values):
        j = job(sid, value, batching, start=step == 0, end=step == len(values) - 1)
        result = await sched.submit(j)
        sums.append(int(result["OUT"].ravel()[0]))
        await asyncio.sleep(0)
    return sums


@pytest.mark.parametrize(("mbs", "strategy"), [(0, ""), (4, ""), (4, "oldest { }")])
async def test_each_sequence_runs_on_one_instance(mbs: int, strategy: str) -> None:
    sched, log = scheduler(2, mbs, strategy)
    values = {sid: [sid % 10 + step for step in range(6)] for sid in range(101, 109)}
    results = await asyncio.gather(
        *(run_sequence(sched, sid, v, mbs > 0) for sid, v in values.items())
    )
    for sums, v in zip(results, values.values(), strict=True):
        assert sums == list(np.cumsum(v))
    for sid in values:
        assert len({name for name, key in log if key == sid}) == 1, sid
    assert {name for name, _ in log} == {"i0", "i1"}  # the sequences spread over both
    await sched.stop(1, "was unloaded")
    sched.release(1)


async def test_a_sequence_without_a_free_slot_waits_for_one() -> None:
    """Two instances with one slot each (max_batch_size 0): a third sequence waits in the
    backlog until a sequence ends, then takes its slot."""
    sched, log = scheduler(2, 0)
    a = await sched.submit(job(1, 1, False, start=True))
    b = await sched.submit(job(2, 10, False, start=True))
    third = asyncio.ensure_future(sched.submit(job(3, 100, False, start=True)))
    await asyncio.sleep(0.05)
    assert not third.done()  # no slot: the backlog
    assert int(a["OUT"][0]) == 1
    assert int(b["OUT"][0]) == 10
    ended = await sched.submit(job(2, 5, False, end=True))
    assert int(ended["OUT"][0]) == 15
    assert int((await third)["OUT"][0]) == 100
    slot_of = {key: name for name, key in log}
    assert slot_of[3] == slot_of[2] != slot_of[1]
    more = await sched.submit(job(1, 2, False, end=True))
    assert int(more["OUT"][0]) == 3
    await sched.stop(1, "was unloaded")
    sched.release(1)


async def test_triton_texts_for_requests_a_sequence_model_refuses() -> None:
    sched, _ = scheduler(1, 4)
    too_many = job(7, 1, True, start=True)
    too_many.batch_size = 2
    with pytest.raises(
        InvalidInput,
        match="inference request to model 'stateful' must specify batch-size 1 due to "
        "requirements of sequence batcher",
    ):
        await sched.submit(too_many)
    with pytest.raises(
        InvalidInput,
        match="sequence batching control 'CORRID' data-type is 'BYTES', but model 'stateful' "
        "expects 'UINT64'",
    ):
        await sched.submit(job("seven", 1, True, start=True))
    with pytest.raises(
        SequenceError,
        match="inference request for sequence 8 to model 'stateful' must specify the START "
        "flag on the first request of the sequence",
    ):
        await sched.submit(job(8, 1, True))
    await sched.stop(1, "was unloaded")
    sched.release(1)


async def test_after_its_end_a_sequence_needs_a_new_start() -> None:
    sched, _ = scheduler(1, 4)
    await sched.submit(job(9, 1, True, start=True, end=True))
    with pytest.raises(SequenceError, match="must specify the START flag"):
        await sched.submit(job(9, 1, True))
    again = await sched.submit(job(9, 4, True, start=True))
    assert int(again["OUT"].ravel()[0]) == 4
    restarted = await sched.submit(job(9, 6, True, start=True))  # a conflict: starts afresh
    assert int(restarted["OUT"].ravel()[0]) == 6
    await sched.stop(1, "was unloaded")
    sched.release(1)
