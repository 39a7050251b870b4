"""The memory budget's pure decisions (appliance/runtime/budget.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from appliance.ops.memory import cgroup_limit_bytes
from appliance.runtime.budget import (
    BudgetSpec,
    CostBook,
    Estimate,
    MiB,
    Resident,
    idle_models,
    make_room,
    parse_budget,
    resolve_budget,
    split_cost,
)


@pytest.mark.parametrize(
    ("text", "spec"),
    [
        ("2G", BudgetSpec(bytes=2 << 30)),
        ("512M", BudgetSpec(bytes=512 << 20)),
        ("512MiB", BudgetSpec(bytes=512 << 20)),
        ("1500000000", BudgetSpec(bytes=1_500_000_000)),
        ("40%", BudgetSpec(percent=40.0)),
    ],
)
def test_budget_sizes_and_percentages(text: str, spec: BudgetSpec) -> None:
    assert parse_budget(text) == spec


@pytest.mark.parametrize("text", ["", "lots", "0", "-1G", "0%", "150%", "x%"])
def test_bad_budgets_say_why(text: str) -> None:
    with pytest.raises(ValueError, match=r"budget|size|percentage"):
        parse_budget(text)


def test_a_percentage_is_of_the_cgroup_limit_else_of_what_is_available() -> None:
    spec = BudgetSpec(percent=50.0)
    assert resolve_budget(spec, available=8000, cgroup_max=1000) == 500
    assert resolve_budget(spec, available=8000, cgroup_max=None) == 4000
    assert resolve_budget(BudgetSpec(bytes=123), 8000, 1000) == 123
    assert resolve_budget(BudgetSpec(), 8000, 1000) == 0


def test_the_cgroup_limit_is_read_from_the_process_own_cgroup(tmp_path: Path) -> None:
    proc, fs = tmp_path / "proc", tmp_path / "cg"
    proc.mkdir()
    (proc / "cgroup").write_text("0::/box.slice/app.scope\n")
    (fs / "box.slice" / "app.scope").mkdir(parents=True)
    (fs / "box.slice" / "app.scope" / "memory.max").write_text("1073741824\n")
    assert cgroup_limit_bytes(str(proc), str(fs)) == 1 << 30
    (fs / "box.slice" / "app.scope" / "memory.max").write_text("max\n")
    assert cgroup_limit_bytes(str(proc), str(fs)) is None


def _r(name: str, mib: int, used: float, busy: bool = False, pinned: bool = False) -> Resident:
    return Resident(name, mib * MiB, used, busy, pinned)


def test_it_fits_without_unloading_anything() -> None:
    room = make_room("d", Estimate(10 * MiB, False), 100 * MiB, [_r("a", 50, 1.0)])
    assert room.evict == ()
    assert not room.refused


def test_the_least_recently_used_idle_models_make_room_first() -> None:
    residents = [_r("a", 30, 3.0), _r("b", 30, 1.0), _r("c", 30, 2.0)]
    room = make_room("d", Estimate(40 * MiB, True), 100 * MiB, residents)
    assert room.evict == ("b",)
    assert not room.refused
    room = make_room("d", Estimate(50 * MiB, True), 100 * MiB, residents)
    assert room.evict == ("b", "c")
    assert not room.refused


def test_pinned_and_busy_models_are_never_chosen() -> None:
    residents = [_r("a", 40, 1.0, pinned=True), _r("b", 40, 2.0, busy=True), _r("c", 10, 3.0)]
    room = make_room("d", Estimate(30 * MiB, False), 100 * MiB, residents)
    assert room.evict == ()
    assert "nothing more can be unloaded" in room.refused
    assert "'a' 40.0 MiB (pinned)" in room.refused
    assert "'b' 40.0 MiB (in use)" in room.refused
    assert "needs 30.0 MiB (estimated from its files)" in room.refused
    assert room.wait  # once b is idle it would fit


def test_only_pinned_models_in_the_way_is_no_reason_to_wait() -> None:
    room = make_room("d", Estimate(70 * MiB, True), 100 * MiB, [_r("a", 50, 1.0, pinned=True)])
    assert room.refused
    assert not room.wait
    assert "(measured)" in room.refused


def test_a_model_larger_than_the_budget_is_refused_outright() -> None:
    room = make_room("big", Estimate(200 * MiB, False), 100 * MiB, [])
    assert "larger than the whole budget" in room.refused
    assert not room.wait


def test_a_reloading_model_is_not_evicted_to_make_room_for_itself() -> None:
    room = make_room("a", Estimate(60 * MiB, False), 100 * MiB, [_r("a", 50, 1.0)])
    assert room.evict == ()
    assert room.refused


def test_idle_models_least_recently_used_first() -> None:
    residents = [_r("a", 1, 5.0), _r("b", 1, 1.0), _r("p", 1, 0.0, pinned=True), _r("c", 1, 9.5)]
    assert idle_models(residents, now=10.0, idle_s=2.0) == ["b", "a"]


def test_a_cost_is_shared_by_file_size_and_kept_across_restarts(tmp_path: Path) -> None:
    assert split_cost(300, {1: 100, 2: 200}) == {1: 100, 2: 200}
    book = CostBook(tmp_path)
    assert book.estimate("m", 1, 1000) == Estimate(1000, False)
    book.record("m", 1, 1000, 2500)
    again = CostBook(tmp_path)
    assert again.estimate("m", 1, 1000) == Estimate(2500, True)
    assert again.estimate("m", 1, 1001) == Estimate(1001, False)  # new content: its files


def test_room_is_made_for_what_a_load_holds_while_it_loads() -> None:
    residents = [_r("a", 40, 1.0), _r("b", 40, 2.0)]
    assert make_room("d", Estimate(10 * MiB, True), 100 * MiB, residents).evict == ()
    room = make_room("d", Estimate(10 * MiB, True), 100 * MiB, residents, loading=20 * MiB)
    assert room.evict == ("a",)
    assert "and 60.0 MiB more while it loads" in make_room(
        "d", Estimate(60 * MiB, False), 100 * MiB, [], loading=60 * MiB
    ).refused


def test_what_an_unload_did_not_give_back_lowers_the_next_estimate(tmp_path: Path) -> None:
    book = CostBook(tmp_path)
    book.record("m", 1, 40 * MiB, 80 * MiB)  # the first load carried 40 MiB of one-time state
    book.scale("m", 40 * MiB, 80 * MiB)
    assert book.estimate("m", 1, 40 * MiB) == Estimate(40 * MiB, True)
    book.scale("m", 0, 80 * MiB)
    assert book.estimate("m", 1, 40 * MiB) == Estimate(40 * MiB, True)  # never below its files
