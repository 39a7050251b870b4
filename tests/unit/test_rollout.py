"""Fleet rollouts: the document, stage membership, the halt rule, keys and device identity."""

from __future__ import annotations

import dataclasses
import itertools
import json
from typing import Any

import pytest

from appliance.repository.rollout import (
    FAILED,
    MAX_ROLLOUT_BYTES,
    MAX_STAGES,
    PASSED,
    DeviceIdentity,
    HaltRule,
    ModelReport,
    ProbationRule,
    RolloutDocument,
    RolloutError,
    choose_version,
    count_verdicts,
    halted,
    hash_share,
    membership,
    needs_verdicts,
    parse_label_text,
    parse_labels,
    parse_verdict_key,
    report_body,
    report_key,
    rollout_key,
    rollout_signature_key,
    verdict_body,
    verdict_key,
    verdict_prefix,
)

IDS = [f"dev-{i:05d}" for i in range(10_000)]


def _raw(**changes: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "format": 1,
        "model": "densenet_onnx",
        "revision": 7,
        "target": 3,
        "baseline": 2,
        "stages": [
            {"percent": 1},
            {"percent": 10},
            {"labels": {"site": "berlin"}},
            {"percent": 100},
        ],
        "stage": 1,
        "probation": {"window_requests": 50, "max_error_rate": 0.05},
        "halt": {"max_failed_share": 0.2, "min_verdicts": 2, "rollback": True},
        "halted": False,
        "reason": "",
    }
    raw.update(changes)
    return {k: v for k, v in raw.items() if v is not _DROP}


_DROP = object()


def _doc(**changes: Any) -> RolloutDocument:
    return RolloutDocument.parse(json.dumps(_raw(**changes)).encode())


def test_the_contract_example_parses_and_round_trips_to_stable_bytes() -> None:
    document = _doc()
    assert (document.target, document.baseline, document.stage, document.revision) == (3, 2, 1, 7)
    assert document.probation == ProbationRule(window_requests=50, max_error_rate=0.05)
    assert document.halt == HaltRule(max_failed_share=0.2, min_verdicts=2, rollback=True)
    data = document.to_json()
    assert RolloutDocument.parse(data) == document
    assert RolloutDocument.parse(data).to_json() == data
    assert json.loads(data) == _raw()  # every field written back as given


def test_probation_may_judge_latency() -> None:
    probation = {"window_requests": 50, "max_error_rate": 0.05, "max_latency_ratio": 2}
    document = _doc(probation=probation)
    assert document.probation == ProbationRule(50, 0.05, max_latency_ratio=2.0)
    data = document.to_json()
    assert json.loads(data)["probation"] == probation  # written back as given
    assert RolloutDocument.parse(data) == document
    assert RolloutDocument.parse(data).to_json() == data
    fraction = _doc(probation={**probation, "max_latency_ratio": 1.5}).probation
    assert fraction == ProbationRule(50, 0.05, 1.5)
    # Without it (or null), latency is not judged and nothing is written.
    assert _doc().probation == ProbationRule(50, 0.05, None)
    assert "max_latency_ratio" not in _doc().to_json().decode()
    null = _doc(probation={**probation, "max_latency_ratio": None}).probation
    assert null == ProbationRule(50, 0.05, None)
    with pytest.raises(RolloutError, match=r"'probation\.max_latency_ratio' must be at least 1"):
        dataclasses.replace(document, probation=ProbationRule(50, 0.05, 0.5))


def test_optional_fields_default() -> None:
    document = _doc(probation=_DROP, halt=_DROP, halted=_DROP, reason=_DROP, stage=_DROP)
    assert (document.probation, document.halt, document.halted, document.stage) == (
        None,
        None,
        False,
        -1,
    )
    assert not membership(document, "anyone", {"site": "berlin"})


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"format": 2}, "field 'format' is 2; this device reads format 1"),
        ({"model": "a/b"}, "field 'model' must be a model folder name"),
        ({"model": ".fleet"}, "field 'model' must be a model folder name"),
        ({"revision": -1}, "field 'revision' must be at least 0, got -1"),
        ({"revision": "7"}, "field 'revision' must be an integer, got \"7\""),
        ({"target": 0}, "field 'target' must be at least 1, got 0"),
        ({"target": True}, "field 'target' must be an integer, got true"),
        ({"baseline": 2.5}, "field 'baseline' must be an integer, got 2.5"),
        ({"baseline": 3}, "'target' and 'baseline' are both version 3"),
        ({"stages": []}, "field 'stages' must be a non-empty list"),
        ({"stages": [{"percent": 101}]}, "'stages[0].percent' must be between 0 and 100"),
        ({"stages": [{"percent": 5, "labels": {}}]}, "'stages[0]' must be {\"percent\": N}"),
        ({"stages": [{"precent": 5}]}, "'stages[0]' must be {\"percent\": N}"),
        ({"stages": [{"labels": {}}]}, "'stages[0].labels' must be a non-empty object"),
        ({"stages": [{"labels": {"site": []}}]}, 'entry "site": [] is not a label value'),
        ({"stages": [{"labels": {"site": 3}}]}, 'entry "site": 3 is not a label value'),
        ({"stage": 4}, "field 'stage' is 4; with 4 stage(s) it must be -1 (not started) to 3"),
        ({"stage": -2}, "field 'stage' must be at least -1, got -2"),
        ({"probation": {"window_requests": 0, "max_error_rate": 0.1}}, "at least 1, got 0"),
        ({"probation": {"window_requests": 5}}, "field 'probation' lacks 'max_error_rate'"),
        ({"probation": {"window_requests": 5, "max_error_rate": 1.5}}, "between 0 and 1"),
        ({"probation": [1]}, "field 'probation' must be a JSON object"),
        (
            {"probation": {"window_requests": 5, "max_error_rate": 0.1, "max_latency_ratio": 0.9}},
            "field 'probation.max_latency_ratio' must be at least 1, got 0.9",
        ),
        (
            {"probation": {"window_requests": 5, "max_error_rate": 0.1, "max_latency_ratio": "2"}},
            "field 'probation.max_latency_ratio' must be a number, got \"2\"",
        ),
        (
            {"probation": {"window_requests": 5, "max_error_rate": 0.1, "max_latency": 2}},
            "field 'probation' has unknown key(s) 'max_latency'",
        ),
        ({"halt": {"max_failed_share": 0.2, "rollbak": True}}, "unknown key(s) 'rollbak'"),
        ({"halt": {"max_failed_share": 0.2, "rollback": "yes"}}, "'halt.rollback' must be true"),
        ({"halt": {"max_failed_share": float("nan")}}, "must be a number"),
        ({"halted": 1}, "field 'halted' must be true or false"),
        ({"reason": None}, "field 'reason' must be a string"),
        ({"target": _DROP}, "rollout.json lacks 'target'"),
        ({"extra": 1}, "rollout.json has unknown field(s) 'extra'"),
    ],
)
def test_bad_documents_say_which_field(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(RolloutError) as caught:
        _doc(**changes)
    assert message in str(caught.value)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\xff", "is not UTF-8 JSON"),
        (b"{", "is not UTF-8 JSON"),
        (b"[]", "must be a JSON object"),
    ],
)
def test_unreadable_documents(data: bytes, message: str) -> None:
    with pytest.raises(RolloutError, match=message):
        RolloutDocument.parse(data)


def test_documents_are_bounded_in_size_stages_and_depth() -> None:
    """Issue 31 items 2 and 9: a million stages stalled every poll; a document nested deep
    raised RecursionError (not a RolloutError), which stopped every update of its source."""
    many = json.dumps(_raw(stages=[{"percent": 1}] * (MAX_STAGES + 1))).encode()
    assert len(many) < MAX_ROLLOUT_BYTES
    with pytest.raises(RolloutError, match=f"has {MAX_STAGES + 1} stages, more than the 100"):
        RolloutDocument.parse(many)
    most = json.dumps(_raw(stages=[{"percent": 1}] * MAX_STAGES)).encode()
    assert len(RolloutDocument.parse(most).stages) == MAX_STAGES
    with pytest.raises(RolloutError, match="nested too deep"):
        RolloutDocument.parse(b"[" * 30_000 + b"]" * 30_000)  # under the size cap
    big = json.dumps(_raw(reason="x" * MAX_ROLLOUT_BYTES)).encode()
    with pytest.raises(RolloutError, match=f"more than the {MAX_ROLLOUT_BYTES} it may have"):
        RolloutDocument.parse(big)


def test_a_document_in_another_models_folder_is_refused() -> None:
    with pytest.raises(RolloutError, match="in folder 'other' is for model 'densenet_onnx'"):
        RolloutDocument.parse(_doc().to_json(), model="other")


def test_the_dataclass_checks_rules_across_fields() -> None:
    document = _doc()
    with pytest.raises(RolloutError, match="'stage' is 9"):
        dataclasses.replace(document, stage=9)
    assert dataclasses.replace(document, stage=3).stage == 3


def test_hash_is_exactly_the_contracts() -> None:
    import hashlib

    digest = hashlib.sha256(b"dev-07/densenet_onnx/3").digest()
    expected = int.from_bytes(digest[:8], "big") / 2**64 * 100
    assert hash_share("dev-07", "densenet_onnx", 3) == expected


def test_percent_share_over_ten_thousand_ids() -> None:
    for percent in (1, 10, 50):
        document = _doc(stages=[{"percent": percent}], stage=0)
        share = sum(membership(document, i, {}) for i in IDS) / len(IDS) * 100
        # Binomial: 3 standard deviations of 10,000 draws is under 1.5 points at 50%.
        assert abs(share - percent) < 3 * (percent * (100 - percent) / len(IDS)) ** 0.5 + 0.01
    everyone = _doc(stages=[{"percent": 100}], stage=0)
    nobody = _doc(stages=[{"percent": 0}], stage=0)
    assert all(membership(everyone, i, {}) for i in IDS)
    assert not any(membership(nobody, i, {}) for i in IDS)


def test_advancing_the_stage_only_adds_devices() -> None:
    labels = {i: {"site": "berlin" if n % 7 == 0 else "paris"} for n, i in enumerate(IDS)}
    members = []
    for stage in range(-1, 4):
        document = _doc(stage=stage)
        members.append({i for i in IDS if membership(document, i, labels[i])})
    sizes = [len(m) for m in members]
    for before, after in itertools.pairwise(members):
        assert before <= after  # monotonic: nobody leaves
    assert sizes[0] == 0
    assert sizes[-1] == len(IDS)
    assert 50 < sizes[1] < 160  # ~1 %
    assert 850 < sizes[2] < 1150  # ~10 %
    berliners = {i for i in IDS if labels[i]["site"] == "berlin"}
    assert members[3] == members[2] | berliners  # the labels stage adds exactly Berlin


def test_the_hash_differs_per_target_and_model() -> None:
    ten = _doc(stages=[{"percent": 10}], stage=0)
    at_v4 = dataclasses.replace(ten, target=4)
    other_model = dataclasses.replace(ten, model="resnet")
    first = {i for i in IDS if membership(ten, i, {})}
    assert first != {i for i in IDS if membership(at_v4, i, {})}
    assert first != {i for i in IDS if membership(other_model, i, {})}


def test_label_stages_need_every_key_and_accept_any_listed_value() -> None:
    document = _doc(stages=[{"labels": {"site": ["berlin", "paris"], "hw": "orin-nano"}}], stage=0)
    assert membership(document, "d", {"site": "paris", "hw": "orin-nano", "x": "y"})
    assert membership(document, "d", {"site": "berlin", "hw": "orin-nano"})
    assert not membership(document, "d", {"site": "rome", "hw": "orin-nano"})
    assert not membership(document, "d", {"site": "berlin"})
    assert not membership(document, "d", {})
    assert json.loads(document.to_json())["stages"] == [
        {"labels": {"hw": "orin-nano", "site": ["berlin", "paris"]}}
    ]


@pytest.mark.parametrize(
    ("passed", "failed", "expected"),
    [
        (0, 0, False),
        (0, 1, False),  # below min_verdicts (2)
        (10, 2, False),  # 2/12 = 0.167 <= 0.2
        (8, 2, False),  # exactly 0.2 is not above it
        (7, 2, True),  # 2/9 = 0.222
        (0, 2, True),
        (100, 30, True),
    ],
)
def test_halt_rule(passed: int, failed: int, expected: bool) -> None:
    assert halted(_doc(), passed, failed) is expected


def test_halt_by_operator_and_without_a_rule() -> None:
    assert halted(_doc(halted=True), 100, 0)
    assert not halted(_doc(halt=_DROP), 0, 1000)
    assert halted(_doc(halt={"max_failed_share": 0}), 5, 1)  # min_verdicts defaults to 1


def test_keys() -> None:
    assert rollout_key("fleet/prod", "m") == "fleet/prod/m/rollout.json"
    assert rollout_key("", "m") == "m/rollout.json"
    assert rollout_signature_key("p/", "m") == "p/m/rollout.json.sig"
    assert report_key("p", "dev-1") == "p/.fleet/devices/dev-1.json"
    assert verdict_prefix("p", "m", 3) == "p/.fleet/verdicts/m/3/"
    key = verdict_key("p", "m", 3, FAILED, "dev-1")
    assert key == "p/.fleet/verdicts/m/3/failed/dev-1.json"
    assert parse_verdict_key("p/.fleet/verdicts/m/3/", key) == (FAILED, "dev-1")
    with pytest.raises(ValueError, match="verdict must be one of"):
        verdict_key("p", "m", 3, "maybe", "dev-1")


@pytest.mark.parametrize(
    "key",
    [
        "p/.fleet/verdicts/m/3/maybe/dev-1.json",
        "p/.fleet/verdicts/m/3/passed/dev-1.txt",
        "p/.fleet/verdicts/m/3/passed/dev 1.json",
        "p/.fleet/verdicts/m/3/passed/.json",
        "p/.fleet/verdicts/m/3/passed/a/b.json",
        "p/.fleet/verdicts/m/30/passed/dev-1.json",
    ],
)
def test_keys_of_other_shapes_are_ignored(key: str) -> None:
    assert parse_verdict_key("p/.fleet/verdicts/m/3/", key) is None


def test_count_verdicts_counts_devices_once() -> None:
    listed = verdict_prefix("p", "m", 3)
    keys = [verdict_key("p", "m", 3, PASSED, f"d{i}") for i in range(5)]
    keys += [verdict_key("p", "m", 3, FAILED, f"e{i}") for i in range(2)]
    keys += [verdict_key("p", "m", 3, FAILED, "d0"), listed + "junk", listed + "passed/x y.json"]
    count = count_verdicts(listed, keys)
    assert (count.passed, count.failed) == (4, 3)  # d0 wrote both: failed


def test_device_identity_from_flags_env_machine_id_and_host() -> None:
    def machine() -> bytes | None:
        return b"0123456789abcdef0123456789abcdef\n"

    def host() -> str:
        return "edge-host"

    flags = DeviceIdentity.resolve("dev-7", ["site=berlin", "hw=orin"], {}, machine, host)
    assert flags == DeviceIdentity("dev-7", {"site": "berlin", "hw": "orin"})
    env = {"EDGE_DEVICE_ID": "env-1", "EDGE_DEVICE_LABELS": "site=paris, hw=orin-nano"}
    from_env = DeviceIdentity.resolve(None, None, env, machine, host)
    assert from_env == DeviceIdentity("env-1", {"site": "paris", "hw": "orin-nano"})
    assert DeviceIdentity.resolve("x", ["a=b"], env, machine, host).labels == {"a": "b"}
    default = DeviceIdentity.resolve(None, None, {}, machine, host)
    assert default == DeviceIdentity("0123456789abcdef0123456789abcdef", {})
    assert DeviceIdentity.resolve(None, None, {}, lambda: None, host).device_id == "edge-host"
    assert DeviceIdentity.resolve(None, None, {}, lambda: b" \n", host).device_id == "edge-host"


@pytest.mark.parametrize(
    ("device_id", "env", "message"),
    [
        ("dev 7", {}, "--device-id 'dev 7' is not a device id"),
        ("", {}, "--device-id '' is not a device id"),
        ("d" * 129, {}, "is not a device id"),
        ("dev/7", {}, "is not a device id"),
        (None, {"EDGE_DEVICE_ID": "a:b"}, "EDGE_DEVICE_ID 'a:b' is not a device id"),
    ],
)
def test_bad_device_ids_are_start_up_errors(
    device_id: str | None, env: dict[str, str], message: str
) -> None:
    with pytest.raises(RolloutError, match=message.replace("(", r"\(")):
        DeviceIdentity.resolve(device_id, None, env, lambda: None, lambda: "h")


@pytest.mark.parametrize(
    ("items", "message"),
    [
        (["site"], "--device-label 'site' is not key=value"),
        (["=berlin"], "is not key=value"),
        (["site="], "is not key=value"),
        (["site=ber lin"], "is not key=value"),
        (["site=a", "site=b"], "label 'site' given twice"),
    ],
)
def test_bad_labels(items: list[str], message: str) -> None:
    with pytest.raises(RolloutError, match=message):
        parse_labels(items)


def test_label_text() -> None:
    assert parse_label_text("") == {}
    assert parse_label_text("a=1,,b=2,") == {"a": "1", "b": "2"}
    with pytest.raises(RolloutError, match="EDGE_DEVICE_LABELS 'a' is not key=value"):
        parse_label_text("a")


@pytest.mark.parametrize(
    ("in_stage", "is_halted", "failed_here", "on_target", "rollback", "expected"),
    [
        (True, False, False, False, True, 3),  # in the stage: the target
        (False, False, False, False, True, 2),  # outside: the baseline
        (False, False, False, True, True, 2),  # left the stage (a lowered one): back
        (True, True, False, False, True, 2),  # halted: never taken
        (True, True, False, False, False, 2),
        (True, True, False, True, True, 2),  # halted with rollback: back
        (True, True, False, True, False, 3),  # halted without: kept
        (True, False, True, False, True, 2),  # failed here: never again
        (True, False, True, True, False, 2),
    ],
)
def test_choose_version(
    in_stage: bool,
    is_halted: bool,
    failed_here: bool,
    on_target: bool,
    rollback: bool,
    expected: int,
) -> None:
    document = _doc(halt={"max_failed_share": 0.2, "rollback": rollback})
    assert choose_version(document, in_stage, is_halted, failed_here, on_target) == expected


def test_an_operator_halt_without_a_rule_rolls_back() -> None:
    document = _doc(halt=_DROP, halted=True)
    assert document.rolls_back
    assert choose_version(document, True, True, False, True) == 2


@pytest.mark.parametrize(
    ("changes", "in_stage", "failed_here", "on_target", "expected"),
    [
        ({}, True, False, False, True),  # about to take the target
        ({}, False, False, False, False),  # a halt changes nothing outside the stage
        ({}, True, False, True, True),  # on it, and a halt would roll it back
        ({"halt": {"max_failed_share": 0.2, "rollback": False}}, True, False, True, False),
        ({}, True, True, False, False),  # failed here: the baseline whatever happens
        ({"halted": True}, True, False, False, False),  # halted already
        ({"halt": _DROP}, True, False, False, False),  # no halt rule
    ],
)
def test_verdicts_are_listed_only_when_they_can_change_the_choice(
    changes: dict[str, Any], in_stage: bool, failed_here: bool, on_target: bool, expected: bool
) -> None:
    assert needs_verdicts(_doc(**changes), in_stage, failed_here, on_target) is expected


def test_report_body_has_the_contracts_fields() -> None:
    identity = DeviceIdentity("dev-07", {"site": "berlin"})
    model = ModelReport((3,), 7, 3, True, PASSED, "", 1234, 0, 4.1, 9.8)
    body = json.loads(
        report_body(identity, 1796137200.0, "0.1.0", 1796137170.0, True, {"m": model})
    )
    assert body == {
        "format": 1,
        "device": "dev-07",
        "labels": {"site": "berlin"},
        "time": "2026-12-01T15:00:00Z",
        "server_version": "0.1.0",
        "last_poll": "2026-12-01T14:59:30Z",
        "last_poll_ok": True,
        "updates_frozen_since": None,
        "models": {
            "m": {
                "serving": [3],
                "rollout_revision": 7,
                "target": 3,
                "in_stage": True,
                "probation": "passed",
                "reason": "",
                "requests": 1234,
                "errors": 0,
                "p50_ms": 4.1,
                "p99_ms": 9.8,
            }
        },
    }
    never = json.loads(report_body(identity, 0.0, "x", None, None, {}))
    assert (never["last_poll"], never["last_poll_ok"], never["models"]) == (None, None, {})


def test_verdict_body() -> None:
    body = json.loads(verdict_body("dev-1", "m", 3, FAILED, "rolled back", 1796137200.0))
    assert body == {
        "format": 1,
        "device": "dev-1",
        "model": "m",
        "version": 3,
        "verdict": "failed",
        "reason": "rolled back",
        "time": "2026-12-01T15:00:00Z",
    }


def test_report_latency_percentiles_are_nearest_ranks() -> None:
    from appliance.runtime.rollout_view import percentile_ms

    assert percentile_ms([], 0.5) is None
    ordered = [n * 1_000_000 for n in range(1, 101)]  # 1 .. 100 ms
    assert percentile_ms(ordered, 0.5) == 50.0
    assert percentile_ms(ordered, 0.99) == 99.0
    assert percentile_ms([1_234_567], 0.99) == 1.235  # ms, to the microsecond
