"""The learned cost of a version's executions (scheduling/costs.py), with plain numbers."""

from __future__ import annotations

import pytest

from appliance.scheduling.costs import WARMUP_EXECUTIONS, ExecutionCosts


def test_inline_only_after_the_warm_up_and_within_the_budget() -> None:
    costs = ExecutionCosts(inline_budget_ns=50_000)
    for _ in range(WARMUP_EXECUTIONS - 1):
        costs.learn(1, 1000, cpu_ns=10_000, wall_ns=12_000, cycle_ns=15_000)  # 10 ns a byte
    assert not costs.inline_within_budget(1000)  # one execution short of the warm-up
    costs.learn(1, 1000, cpu_ns=10_000, wall_ns=12_000, cycle_ns=15_000)
    assert costs.per_byte_ns == pytest.approx(10.0)
    assert costs.inline_within_budget(5000)  # 50 us predicted: within
    assert not costs.inline_within_budget(5001)
    assert not ExecutionCosts(inline_budget_ns=0).inline_within_budget(0)  # no budget: never


def test_moving_averages_start_at_the_first_execution_and_weigh_the_newest_a_tenth() -> None:
    costs = ExecutionCosts()
    costs.learn(2, 100, cpu_ns=1000, wall_ns=4000, cycle_ns=6000)
    assert (costs.per_byte_ns, costs.request_ns, costs.execution_ns) == (10.0, 3000.0, 6000.0)
    costs.learn(2, 100, cpu_ns=2000, wall_ns=4000, cycle_ns=6000)
    assert costs.per_byte_ns == pytest.approx(11.0)  # 10 + (20 - 10) * 0.1
    assert costs.request_ns == pytest.approx(3000.0)


def test_a_cycle_counts_between_the_execution_and_twice_it() -> None:
    # The loop's own delays count (the cycle), but one stall counts at most twice the execution.
    stalled = ExecutionCosts()
    stalled.learn(1, 8, cpu_ns=100, wall_ns=1000, cycle_ns=1_000_000)
    assert stalled.request_ns == 2000.0
    early = ExecutionCosts()
    early.learn(4, 8, cpu_ns=100, wall_ns=1000, cycle_ns=500)  # never below the execution
    assert early.request_ns == 250.0
    assert early.execution_ns == 1000.0


def test_an_unsampled_execution_leaves_the_cost_per_byte() -> None:
    costs = ExecutionCosts()
    costs.learn(1, 10, cpu_ns=100, wall_ns=200, cycle_ns=200)
    costs.learn(1, 10, cpu_ns=-1, wall_ns=400, cycle_ns=400)  # CPU time not sampled
    assert costs.per_byte_ns == 10.0
    assert costs.request_ns == pytest.approx(220.0)
