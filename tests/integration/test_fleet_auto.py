"""A fleet that rolls out by itself (issue 39): real appliance processes poll SeaweedFS (SigV4,
conditional writes) and move an automatic rollout along with no operator command after
`fleet publish`; windows hold a label group; a disruption budget of one device is kept; a
device that defers switches once its lock is gone.

Small for CI: 1-3 devices a test, tiny ONNX models, a 0.3 s poll, soak times of a second.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from tritonclient.utils import InferenceServerException

from appliance.face import cli
from appliance.repository import rollout
from appliance.repository.rollout_policy import PROGRESS, Progress
from tests.integration.test_poll_mode import _failing_model
from tests.integration.test_s3_repository import CONFIG, Bucket, _added, _manifest, _model_bytes
from tests.s3servers import S3Server, moto_server, seaweed_server, weed_binary
from tests.serverproc import ServerProcess

pytestmark = [
    pytest.mark.fleet,
    pytest.mark.skipif(weed_binary() is None, reason="SeaweedFS 'weed' binary not found"),
]

POLL = ("--model-control-mode=poll", "--repository-poll-secs=0.3")
PROBATION = {"window_requests": 3, "max_error_rate": 0.34}


@pytest.fixture(scope="module")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    with seaweed_server(tmp_path_factory.mktemp("seaweed")) as server:
        yield server


def _ids(count: int, low: float, high: float, target: int = 2, prefix: str = "d") -> list[str]:
    """Device ids whose place for model m's target is in [low, high) (percent)."""
    found = (f"{prefix}-{n}" for n in itertools.count())
    return list(
        itertools.islice(
            (i for i in found if low <= rollout.hash_share(i, "m", target) < high), count
        )
    )


class AutoFleet:
    """A bucket with model m (config, v1 adding 1) and devices polling it."""

    def __init__(self, start_server: Any, s3: S3Server, tmp_path: Path) -> None:
        self.s3, self.tmp_path, self._start = s3, tmp_path, start_server
        self.bucket = Bucket(s3)
        self.bucket.put("m/config.pbtxt", CONFIG.encode())
        self.bucket.put_version(1, 1)
        self.procs: dict[str, ServerProcess] = {}

    def devices(self, ids: dict[str, dict[str, str]]) -> None:
        """Start devices (id -> labels) at once; each ready once its first sync loaded m."""
        for device_id, labels in ids.items():
            self.procs[device_id] = self._start(
                self.bucket.url,
                f"--model-store-dir={self.store(device_id)}",
                f"--device-id={device_id}",
                *(f"--device-label={k}={v}" for k, v in labels.items()),
                *POLL,
                "--repository-sync-wait-secs=60",
                wait=False,
                env=self.s3.env(),
            )
        for proc in self.procs.values():
            proc.wait_ready()

    def store(self, device_id: str) -> Path:
        return self.tmp_path / device_id

    def document(self, **changes: Any) -> None:
        raw: dict[str, Any] = {
            "format": 1,
            "model": "m",
            "revision": 1,
            "target": 2,
            "baseline": 1,
            "stages": [{"percent": 100}],
            "stage": 0,
            "probation": PROBATION,
            "halt": {"max_failed_share": 0.5, "min_verdicts": 1},
        }
        raw.update(changes)
        document = rollout.RolloutDocument.parse(json.dumps(raw).encode())
        self.bucket.put("m/rollout.json", document.to_json())

    def get(self, key: str) -> dict[str, Any] | None:
        try:
            body = self.bucket.client.get_object(Bucket=self.bucket.name, Key=key)["Body"]
        except self.bucket.client.exceptions.NoSuchKey:
            return None
        data: dict[str, Any] = json.loads(body.read())
        return data

    def report(self, device_id: str) -> dict[str, Any]:
        found = self.get(rollout.report_key("models", device_id)) or {}
        entry: dict[str, Any] = found.get("models", {}).get("m", {})
        return entry

    def serves(self, device_id: str, value: float) -> bool:
        try:
            return _added(self.procs[device_id].http_url) == value
        except InferenceServerException:
            return False

    def progress(self) -> dict[str, Any] | None:
        return self.get(f"models/m/{PROGRESS}")

    def put_files(self, version: int, files: dict[str, bytes]) -> None:
        for name, data in {**files, "SHA256SUMS": _manifest(files)}.items():
            self.bucket.put(f"m/{version}/{name}", data)

    def stored(self, device_id: str, version: int) -> bool:
        return any(self.store(device_id).glob(f"models/*/m/{version}/model.onnx"))


@pytest.fixture
def fleet(start_server: Any, seaweed: S3Server, tmp_path: Path) -> AutoFleet:
    return AutoFleet(start_server, seaweed, tmp_path)


class Traffic:
    """Clients: requests to every device in turn, each answer and failure counted."""

    def __init__(self, fleet: AutoFleet) -> None:
        self.fleet = fleet
        self.failures: dict[str, int] = dict.fromkeys(fleet.procs, 0)
        self.answers: dict[str, set[float]] = {d: set() for d in fleet.procs}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Traffic:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.is_set():
            for device_id, proc in self.fleet.procs.items():
                try:
                    self.answers[device_id].add(_added(proc.http_url))
                except InferenceServerException:
                    self.failures[device_id] += 1
            time.sleep(0.02)


def _wait(what: str, predicate: Callable[[], bool], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"not in {timeout_s:g} s: {what}"
        time.sleep(0.1)


def test_an_automatic_rollout_goes_10_50_100_with_no_operator_command_after_publish(
    fleet: AutoFleet, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    for name, value in fleet.s3.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_REGION", raising=False)
    first, second, last = _ids(1, 0, 10)[0], _ids(1, 10, 50)[0], _ids(1, 50, 100)[0]
    fleet.devices({first: {}, second: {}, last: {}})
    folder = tmp_path / "v2"
    folder.mkdir()
    (folder / "model.onnx").write_bytes(_model_bytes(2))
    policy = tmp_path / "policy.json"
    policy.write_text(
        json.dumps(
            {  # the 10% need its one verdict, the 50% a second one, a second of soak each
                "stage_rules": [
                    {"soak_s": 1, "min_verdicts": 1, "min_passed_share": 1},
                    {"soak_s": 1, "min_verdicts": 2, "min_passed_share": 1},
                    {},
                ]
            }
        )
    )
    with Traffic(fleet) as traffic:
        code = cli.main(
            [
                "fleet", "publish", fleet.bucket.url, "m", str(folder), "--version", "2",
                "--stages", "10,50,100", "--start", "--auto", "--policy", str(policy),
                "--probation-window", "3", "--probation-max-error-rate", "0.34",
            ]
        )  # fmt: skip
        assert code == 0, capsys.readouterr().err
        # no `fleet advance` from here on: the devices move it
        _wait("every device serves v2", lambda: all(fleet.serves(d, 2.0) for d in fleet.procs))
        _wait(  # its probation's requests come from the traffic; its report after the verdict
            "every device reports its verdict",
            lambda: all(fleet.report(d).get("probation_ended") for d in fleet.procs),
        )
    assert traffic.failures == dict.fromkeys(fleet.procs, 0)
    raw = fleet.get(f"models/m/{PROGRESS}")
    assert raw is not None
    progress = Progress.parse(json.dumps(raw).encode(), "m")
    assert progress.stage == 2
    assert [(s.stage, s.action) for s in progress.history] == [(1, "advance"), (2, "advance")]
    assert all(s.by in fleet.procs for s in progress.history)  # devices, not an operator
    assert progress.history[0].passed >= 1
    assert progress.history[1].passed >= 2
    # The 50% device took v2 only after the first stage passed; the last only after the 50%.
    started = {d: fleet.report(d)["probation_started"] for d in fleet.procs}
    assert started[first] < started[second] < started[last]
    # `fleet status` says where it stands: at its last stage, done
    assert cli.main(["fleet", "status", fleet.bucket.url]) == 0
    out = capsys.readouterr().out
    assert "version 2 at stage 2 of 2 (100%)" in out
    assert "automatic: done: at its last stage; verdicts 3/1, passed 100% (at least 100%)" in out


def test_status_says_why_an_automatic_stage_waits(
    fleet: AutoFleet, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in fleet.s3.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_REGION", raising=False)
    fleet.bucket.put_version(2, 2)
    fleet.document(
        advance="auto",
        stages=[{"percent": 10, "soak_s": 3600, "min_verdicts": 5}, {"percent": 100}],
    )
    assert cli.main(["fleet", "status", fleet.bucket.url]) == 0
    out = capsys.readouterr().out
    assert re.search(r"automatic: wait: waiting: soak 3\d\d\d s left of 3600 s, verdicts 0/5", out)
    # the operator's loop waits too, and says so
    assert cli.main(["fleet", "operator", fleet.bucket.url, "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    assert "model 'm': version 2 at stage 0 of 1 (10%): waiting: soak" in out
    assert fleet.get(f"models/m/{PROGRESS}") is None


def test_a_closed_switch_window_holds_its_group_while_the_others_proceed(
    fleet: AutoFleet,
) -> None:
    fleet.devices({"a-0": {"site": "a"}, "b-0": {"site": "b"}})
    now = time.localtime()
    start = (now.tm_hour + 2) % 24  # a window that opens in two hours: closed now
    closed = f"{start:02d}:00-{(start + 1) % 24:02d}:00"
    with Traffic(fleet):
        fleet.document(windows=[{"labels": {"site": "a"}, "switch": closed}])
        fleet.bucket.put_version(2, 2)
        _wait("b serves v2", lambda: fleet.serves("b-0", 2.0))
        _wait("a downloaded v2 ahead of its window", lambda: fleet.stored("a-0", 2))
        _wait("a reports its window", lambda: fleet.report("a-0").get("window") == "switch closed")
        time.sleep(1.5)  # five polls
        assert fleet.serves("a-0", 1.0)
    report = fleet.report("a-0")
    assert report["serving"] == [1]
    assert report["waiting"] == f"waiting: the switch window ({closed}) is closed"
    assert fleet.report("b-0").get("serving") == [2]


@pytest.mark.parametrize(
    ("budget", "devices", "most"),
    [({"max_devices": 1}, 3, 1), ({"max_percent": 50}, 4, 2)],
    ids=["1 device", "50 percent"],
)
def test_a_disruption_budget_of_one_device_is_never_exceeded(
    fleet: AutoFleet, budget: dict[str, Any], devices: int, most: int
) -> None:
    ids = [f"c-{i}" for i in range(devices)]
    fleet.devices({device: {"site": "x"} for device in ids})
    with Traffic(fleet) as traffic:
        fleet.document(budget={**budget, "group_by": "site", "lease_s": 600})
        fleet.bucket.put_version(2, 2)  # after the document: no device takes it as the newest
        _wait("every device serves v2", lambda: all(fleet.serves(d, 2.0) for d in ids), 90)
        _wait(
            "every device reports its probation's end",
            lambda: all(fleet.report(d).get("probation_ended") for d in ids),
        )
    assert traffic.failures == dict.fromkeys(ids, 0)
    reports = [fleet.report(d) for d in ids]
    spans = sorted((r["probation_started"], r["probation_ended"]) for r in reports)
    events = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    at_once = max(itertools.accumulate(step for _, step in events))
    assert at_once <= most, f"{at_once} devices on probation at once: {spans}"
    slots = fleet.bucket.client.list_objects_v2(
        Bucket=fleet.bucket.name, Prefix="models/.fleet/slots/"
    )
    held = [o["Key"] for o in slots.get("Contents", []) if "/members/" not in o["Key"]]
    assert held == []  # every slot freed after its verdict
    members = [o["Key"] for o in slots.get("Contents", []) if "/members/" in o["Key"]]
    assert len(members) == (devices if "max_percent" in budget else 0)


def test_a_deferring_device_holds_back_and_switches_once_its_lock_is_released(
    fleet: AutoFleet,
) -> None:
    fleet.store("e-0").mkdir()
    lock = fleet.store("e-0") / "fleet-defer"
    lock.write_text("recording\n")
    fleet.devices({"e-0": {}})
    fleet.document(defer={"max_s": 1})
    fleet.bucket.put_version(2, 2)
    _wait("it reports holding back", lambda: fleet.report("e-0").get("holding_back") is True)
    report = fleet.report("e-0")
    assert report["serving"] == [1]
    assert report["waiting"] == (
        "deferred on this device (fleet-defer) (holding back: longer than the 1 s the rollout "
        "allows)"
    )
    assert report["deferred_s"] > 1
    assert fleet.serves("e-0", 1.0)
    lock.unlink()
    _wait("it switches", lambda: fleet.serves("e-0", 2.0))
    _wait("its report says so", lambda: "deferred_s" not in fleet.report("e-0"))


def test_a_broken_version_halts_at_the_first_stage_with_no_failed_client_request(
    fleet: AutoFleet,
) -> None:
    inside, outside = _ids(2, 0, 50), _ids(1, 50, 100)
    fleet.devices({device: {} for device in [*inside, *outside]})
    with Traffic(fleet) as traffic:
        fleet.document(
            advance="auto",
            stages=[{"percent": 50, "min_verdicts": 2}, {"percent": 100}],
            shadow={"share": 1, "requests": 4},
            halt={"max_failed_share": 0.2, "min_verdicts": 2},
        )
        fleet.put_files(2, {"model.onnx": _failing_model().SerializeToString()})
        _wait(
            "both devices of the stage failed it in the shadow",
            lambda: all(fleet.report(d).get("probation") == "failed" for d in inside),
        )
        _wait("the rollout halted itself", lambda: (fleet.progress() or {}).get("halted"))
        time.sleep(1.0)  # more polls: nobody takes it
    assert traffic.failures == dict.fromkeys(fleet.procs, 0)  # no client saw version 2
    assert all(traffic.answers[d] == {1.0} for d in fleet.procs)
    progress = fleet.progress()
    assert progress is not None
    assert progress["stage"] == 0
    assert progress["reason"] == "halted by the fleet: 2 of 2 verdicts failed (the halt rule)"
    for device_id in inside:
        shadow = fleet.report(device_id)["shadow"]
        assert shadow["state"] == "failed"
        assert shadow["errors"] >= 1
        assert shadow["reason"].startswith("shadow probation: 1 of 1 mirrored requests failed")
    assert not fleet.stored(outside[0], 2)
    assert fleet.report(outside[0])["serving"] == [1]


def test_a_version_whose_outputs_differ_fails_its_shadow_and_a_good_one_passes(
    fleet: AutoFleet,
) -> None:
    fleet.devices({"s-0": {}})
    with Traffic(fleet) as traffic:
        fleet.document(shadow={"share": 0.5, "requests": 6, "max_abs_diff": 0.5})
        fleet.bucket.put_version(2, 5)  # adds 5 where version 1 adds 1
        _wait("it failed", lambda: fleet.report("s-0").get("probation") == "failed")
        shadow = fleet.report("s-0")["shadow"]
        assert shadow["reason"] == (
            "shadow probation: outputs differ from the served version's by up to 4 over 6 "
            "mirrored requests (the rollout's shadow.max_abs_diff 0.5)"
        )
        assert (shadow["mirrored"], shadow["errors"], shadow["max_abs_diff"]) == (6, 0, 4.0)
        fleet.document(
            revision=2, target=3, shadow={"share": 0.5, "requests": 6, "max_abs_diff": 0.5}
        )
        fleet.bucket.put_version(3, 1)  # the same outputs: it passes and clients move
        _wait("version 3 serves", lambda: fleet.report("s-0").get("serving") == [3])
        _wait("its report", lambda: fleet.report("s-0").get("shadow", {}).get("state") == "passed")
    assert traffic.failures == {"s-0": 0}
    assert traffic.answers["s-0"] == {1.0}  # version 2's answers never reached a client
    assert fleet.report("s-0")["shadow"]["mirrored"] == 6


@pytest.mark.parametrize("server", ["seaweedfs", "moto"])
def test_of_advancers_racing_on_one_progress_exactly_one_wins(
    server: str, seaweed: S3Server
) -> None:
    """The compare-and-swap the advance relies on, on both S3 servers the suite runs: eight
    writers that read the same ETag write at once (If-Match), and eight that saw no object
    create it at once (If-None-Match); one of each wins, the others get 412."""
    from botocore.exceptions import ClientError

    with contextlib.ExitStack() as stack:
        s3 = seaweed if server == "seaweedfs" else stack.enter_context(moto_server())
        bucket = Bucket(s3)
        clients = [s3.client() for _ in range(8)]

        def race(write: Callable[[Any, int], None]) -> list[int]:
            start = threading.Barrier(len(clients))
            codes: list[int] = []

            def one(index: int) -> None:
                start.wait()
                try:
                    write(clients[index], index)
                    codes.append(200)
                except ClientError as exc:
                    codes.append(int(exc.response["ResponseMetadata"]["HTTPStatusCode"]))

            threads = [threading.Thread(target=one, args=(i,)) for i in range(len(clients))]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            return sorted(codes)

        key = "models/m/rollout.progress.json"
        created = race(
            lambda c, i: c.put_object(Bucket=bucket.name, Key=key, Body=b"%d" % i, IfNoneMatch="*")
        )
        assert created == [200] + [412] * 7
        etag = bucket.client.head_object(Bucket=bucket.name, Key=key)["ETag"]
        moved = race(
            lambda c, i: c.put_object(Bucket=bucket.name, Key=key, Body=b"x%d" % i, IfMatch=etag)
        )
        assert moved == [200] + [412] * 7
