"""The sequence batcher with a gated in-process model: order, state, batching, controls."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from appliance.common.errors import ErrorCode
from appliance.runtime.specs import sequence_spec
from appliance.scheduling.instances import InstanceWorker, Job
from appliance.scheduling.sequence import (
    SequenceCancelled,
    SequenceError,
    SequenceScheduler,
    SequenceTimeout,
)
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


def scheduler(
    gate: threading.Event, config_text: str = CONFIG
) -> tuple[SequenceScheduler, RunningSum]:
    model = RunningSum(gate)
    config = text_format.Parse(config_text, mc.ModelConfig())
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


def oldest(delay_us: int) -> str:
    """CONFIG with the oldest strategy: 8 candidate sequences, preferred batch size 4."""
    strategy = (
        "oldest { max_candidate_sequences: 8 preferred_batch_size: [ 4 ] "
        f"max_queue_delay_microseconds: {delay_us} }}"
    )
    return CONFIG.replace("sequence_batching {", "sequence_batching { " + strategy)


async def test_oldest_strategy_runs_a_preferred_batch_of_sequences_at_once() -> None:
    gate = threading.Event()
    gate.set()
    sched, model = scheduler(gate, oldest(60_000_000))  # a minute's delay: never reached here
    starts = [asyncio.ensure_future(sched.submit(job(f"s{i}", i, start=True))) for i in range(4)]
    results = [int(r["OUT"][0, 0]) for r in await asyncio.gather(*starts)]
    assert results == [0, 1, 2, 3]
    # Triton's dynamic batcher of the oldest strategy: the four sequences' first requests wait
    # for each other and run as one batch of the preferred size (not 1 then 3).
    assert model.batches == [[b"s0", b"s1", b"s2", b"s3"]]
    await sched.stop(1, "was unloaded")
    sched.release(1)


async def test_oldest_strategy_waits_up_to_its_delay_for_a_batch() -> None:
    gate = threading.Event()
    gate.set()
    sched, model = scheduler(gate, oldest(50_000))  # 50 ms
    starts = [asyncio.ensure_future(sched.submit(job(f"s{i}", i, start=True))) for i in range(3)]
    await asyncio.gather(*starts)
    # Three of the preferred four: they run together once the oldest has waited 50 ms.
    assert model.batches == [[b"s0", b"s1", b"s2"]]
    # The next requests of the same sequences batch again, past the preferred size's wait.
    nexts = [asyncio.ensure_future(sched.submit(job(f"s{i}", 10, end=True))) for i in range(3)]
    assert [int(r["OUT"][0, 0]) for r in await asyncio.gather(*nexts)] == [10, 11, 12]
    assert model.batches[1] == [b"s0", b"s1", b"s2"]
    await sched.stop(1, "was unloaded")
    sched.release(1)


async def test_direct_strategy_runs_at_once() -> None:
    gate = threading.Event()
    gate.set()
    sched, model = scheduler(gate)
    assert (await sched.submit(job("d", 5, start=True)))["OUT"][0, 0] == 5
    assert model.batches == [[b"d"]]
    await sched.stop(1, "was unloaded")
    sched.release(1)


GROWING = """
name: "grow" max_batch_size: 4
sequence_batching {
  state [ { input_name: "S_IN" output_name: "S_OUT" data_type: TYPE_INT32 dims: [ -1 ] } ]
}
"""


class Growing(InstanceBase):
    """OUT = S_OUT = concat(S_IN, X) along the state's variable dimension; records each
    batch's state lengths."""

    def __init__(self, gate: threading.Event) -> None:
        self.gate = gate
        self.lengths: list[list[int]] = []

    def execute(self, inputs: Any, output_names: Any) -> dict[str, np.ndarray]:
        self.gate.wait(5)
        self.lengths.append([inputs["S_IN"].shape[1]] * inputs["S_IN"].shape[0])
        out = np.concatenate([inputs["S_IN"], inputs["X"]], axis=1)
        return {"OUT": out, "S_OUT": out}

    def close(self) -> None:
        pass


async def test_a_variable_state_starts_as_one_zero_and_batches_only_with_its_shape() -> None:
    gate = threading.Event()
    model = Growing(gate)
    config = text_format.Parse(GROWING, mc.ModelConfig())
    sched = SequenceScheduler(
        "model 'grow' version 1",
        [InstanceWorker("w", model, True)],
        sequence_spec(config, max_waiting=100),
        ModelStats(),
    )
    sched.start()
    gate.set()
    first = await sched.submit(job("a", 1, start=True))
    assert first["OUT"].tolist() == [[0, 1]]  # the -1 dimension starts as 1, zeros
    gate.clear()
    held = asyncio.ensure_future(sched.submit(job("c", 9, start=True)))  # holds the instance
    await asyncio.sleep(0.01)
    a = asyncio.ensure_future(sched.submit(job("a", 2, end=True)))  # state [0, 1]
    b = asyncio.ensure_future(sched.submit(job("b", 3, start=True, end=True)))  # state [0]
    await asyncio.sleep(0.01)
    gate.set()
    assert (await a)["OUT"].tolist() == [[0, 1, 2]]
    assert (await b)["OUT"].tolist() == [[0, 3]]
    await held
    # Rows whose states differ in shape run in separate batches (never one of [2] and [1]).
    assert sorted(model.lengths[2:]) == [[1], [2]]
    await sched.stop(1, "was unloaded")
    sched.release(1)


async def test_a_cancelled_queued_request_ends_its_sequence_and_cancels_the_rest() -> None:
    gate = threading.Event()
    sched, model = scheduler(gate)
    running = asyncio.ensure_future(sched.submit(job("s", 1, start=True)))
    await asyncio.sleep(0.01)
    second = asyncio.ensure_future(sched.submit(job("s", 2)))
    third = asyncio.ensure_future(sched.submit(job("s", 3)))
    last = asyncio.ensure_future(sched.submit(job("s", 4, end=True)))
    other = asyncio.ensure_future(sched.submit(job("t", 10, start=True, end=True)))
    await asyncio.sleep(0.01)
    third.cancel()
    await asyncio.sleep(0)
    # Triton: the sequence ends at the cancelled request, and what is queued behind it is
    # cancelled (CANCELLED); what is ahead of it still runs, other sequences are untouched.
    with pytest.raises(SequenceCancelled) as cancelled:
        await last
    assert cancelled.value.code is ErrorCode.CANCELLED
    gate.set()
    assert int((await running)["OUT"][0, 0]) == 1
    assert int((await second)["OUT"][0, 0]) == 3
    assert int((await other)["OUT"][0, 0]) == 10
    assert third.cancelled()
    with pytest.raises(SequenceError, match="must specify the START flag"):
        await sched.submit(job("s", 5))
    assert sched.pending == 0
    assert b"s" not in [row for batch in model.batches[2:] for row in batch]
    await sched.stop(1, "was unloaded")
    sched.release(1)


async def test_a_backlogged_sequence_whose_timeout_runs_out_is_rejected() -> None:
    """As tritonserver's reaper: a sequence waiting for a slot past the first of its requests'
    `timeout`s has every request it queued refused (UNAVAILABLE, counted REJECTED), and is
    forgotten; one without a timeout waits on, and one that got a slot is not timed out."""
    gate = threading.Event()
    one_slot = CONFIG.replace("max_batch_size: 8", "max_batch_size: 1")
    sched, model = scheduler(gate, one_slot)
    first = job("a", 1, start=True)
    first.timeout_us = 10_000  # it has the slot: never timed out
    running = asyncio.ensure_future(sched.submit(first))
    await asyncio.sleep(0.01)
    timed = job("b", 2, start=True)
    timed.timeout_us = 30_000
    b_first = asyncio.ensure_future(sched.submit(timed))
    b_second = asyncio.ensure_future(sched.submit(job("b", 3)))
    patient = asyncio.ensure_future(sched.submit(job("c", 4, start=True, end=True)))
    await asyncio.sleep(0.15)
    for waiting in (b_first, b_second):
        with pytest.raises(SequenceTimeout) as refused:
            await waiting
        assert refused.value.code is ErrorCode.UNAVAILABLE
        assert str(refused.value.message).startswith(
            "timeout of the corresponding sequence has been expired (model 'sum' sequence 'b' "
        )
    assert not patient.done()
    assert not running.done()
    with pytest.raises(SequenceError, match="must specify the START flag"):
        await sched.submit(job("b", 5))
    gate.set()
    assert int((await running)["OUT"][0, 0]) == 1
    ended = await sched.submit(job("a", 10, end=True))
    assert int(ended["OUT"][0, 0]) == 11
    assert int((await patient)["OUT"][0, 0]) == 4  # the freed slot went to the one left
    assert [row for batch in model.batches for row in batch] == [b"a", b"a", b"c"]
    await sched.stop(1, "was unloaded")
    sched.release(1)
