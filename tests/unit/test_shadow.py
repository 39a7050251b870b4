"""Shadow probation's judgement: the share it mirrors, errors, latency and output agreement."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np

from appliance.repository.rollout_policy import ShadowRule
from appliance.runtime.shadow import FAIL, PASS, ShadowTrial, fits_beside


def _trial(rule: ShadowRule) -> tuple[ShadowTrial, list[str], Any]:
    ended: list[str] = []
    served = SimpleNamespace(version=1, mirror=None)
    trial = ShadowTrial(
        "m", SimpleNamespace(version=2), rule, [served], lambda t, why: ended.append(why)  # type: ignore[arg-type]
    )
    served.mirror = trial
    return trial, ended, served


def test_a_share_mirrors_evenly_and_never_more_than_one_window_at_once() -> None:
    trial, _, _ = _trial(ShadowRule(share=0.25, requests=2))
    taken = [trial.take() for _ in range(16)]
    assert taken == [False, False, False, True, False, False, False, True] + [False] * 8
    assert trial.in_flight == 2  # the window is in flight: no more are taken


def test_an_error_past_the_rate_fails_it_at_once_and_stops_the_mirroring() -> None:
    trial, ended, served = _trial(ShadowRule(share=1, requests=10, max_error_rate=0.1))
    out = {"y": np.zeros((1, 4), np.float32)}
    assert trial.take()
    assert trial.take()
    assert not trial.take()  # two in flight at most: a busy target is not queued up
    trial.observe(1000, out, 1000, None, "index 10 is out of bounds")
    assert trial.verdict == ""  # 1 of 10 allowed
    assert trial.take()
    trial.skip()  # refused for load: not judged
    assert (trial.mirrored, trial.errors, trial.skipped) == (1, 1, 2)
    assert trial.take()
    trial.observe(1000, out, 1000, None, "index 10 is out of bounds")
    assert trial.verdict == FAIL
    assert ended == [
        "shadow probation: 2 of 2 mirrored requests failed (the rollout's "
        "shadow.max_error_rate 0.1): index 10 is out of bounds"
    ]
    assert served.mirror is None
    assert not trial.take()
    trial.observe(1000, out, 1000, out)  # one still in flight: ignored
    assert len(ended) == 1


def test_outputs_latency_and_top1_are_judged_at_the_end_of_the_window() -> None:
    a = np.array([[0.1, 0.9, 0.0], [0.8, 0.1, 0.1]], np.float32)
    b = np.array([[0.1, 0.8, 0.1], [0.1, 0.8, 0.1]], np.float32)  # row 2 disagrees
    trial, ended, _ = _trial(ShadowRule(share=1, requests=2, min_top1_agreement=0.9))
    for _ in range(2):
        trial.take()
        trial.observe(2_000_000, {"y": a}, 2_000_000, {"y": b})
    assert trial.verdict == FAIL
    assert ended[0].startswith("shadow probation: top-1 agreed with the served version on 50.0%")
    numbers = trial.numbers()
    assert numbers["top1_agreement"] == 0.5
    assert numbers["max_abs_diff"] == 0.7
    slow, ended, _ = _trial(ShadowRule(share=1, requests=2, max_latency_ratio=2))
    for _ in range(2):
        slow.take()
        slow.observe(5_000_000, {"y": a}, 20_000_000, {"y": a})
    assert ended[0] == (
        "shadow probation: median latency 20 ms against the served version's 5 ms on the same 2 "
        "requests (the rollout's shadow.max_latency_ratio 2)"
    )
    good, ended, served = _trial(ShadowRule(share=1, requests=2, max_abs_diff=0.01))
    for _ in range(2):
        good.take()
        good.observe(5_000_000, {"y": a}, 6_000_000, {"y": a.copy()})
    assert (good.verdict, ended) == (PASS, [""])
    assert served.mirror is None
    assert good.numbers()["state"] == "passed"


def test_a_shadow_trial_without_enough_traffic_fails_when_its_time_is_up() -> None:
    trial, ended, _ = _trial(ShadowRule(share=1, requests=5, timeout_s=60))
    trial.timed_out()
    assert ended == [
        "shadow probation: only 0 of 5 mirrored requests in 60 s (the rollout's "
        "shadow.timeout_s)"
    ]


def test_a_version_too_big_for_the_memory_available_falls_back(tmp_path: Any) -> None:
    (tmp_path / "model.onnx").write_bytes(b"x" * 4096)
    assert fits_beside(tmp_path, 8192) == ""
    assert fits_beside(tmp_path, None) == ""
    assert fits_beside(tmp_path, 8191).startswith("its files (0 MiB, twice that needed) do not fit")
