"""Fleet rollouts, the device's side: real appliance processes poll a real S3 server (moto on
loopback) that holds a rollout document; each decides alone whether it takes the target, puts it
on probation, writes its verdict and its report, and follows a halt.

Device ids are chosen by computing the contract's membership, so each test knows which devices
the stage holds.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from appliance.repository.rollout import (
    RolloutDocument,
    membership,
    report_key,
    verdict_key,
)
from tests.integration.models import PY_FP32_CONFIG
from tests.integration.s3device import Device
from tests.integration.test_poll_mode import _failing_model
from tests.integration.test_s3_repository import (
    CONFIG,
    Bucket,
    _added,
    _manifest,
    _metric,
    _wait_for,
)
from tests.s3servers import S3Server, moto_server
from tests.serverproc import ServerProcess

POLL = ("--model-control-mode=poll", "--repository-poll-secs=0.3")
PREFIX = "models"


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with moto_server() as server:
        yield server


def _document(**changes: Any) -> RolloutDocument:
    raw: dict[str, Any] = {
        "format": 1,
        "model": "m",
        "revision": 1,
        "target": 2,
        "baseline": 1,
        "stages": [{"percent": 50}, {"percent": 100}],
        "stage": 0,
        "probation": {"window_requests": 4, "max_error_rate": 0.25},
        "halt": {"max_failed_share": 0.2, "min_verdicts": 2, "rollback": True},
    }
    raw.update(changes)
    return RolloutDocument.parse(json.dumps(raw).encode())


_SLEEPING_MODEL = """\
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        time.sleep({sleep_s})
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            out = pb_utils.Tensor("OUTPUT0", (x + {value}).astype(x.dtype))
            responses.append(pb_utils.InferenceResponse([out]))
        return responses
"""


def _ids(document: RolloutDocument, inside: bool, count: int = 1) -> list[str]:
    """Device ids the document's current stage holds (or leaves out), by its own hash."""
    found = (f"dev-{n}" for n in itertools.count())
    return list(
        itertools.islice((i for i in found if membership(document, i, {}) is inside), count)
    )


class Fleet:
    """One bucket (model m: config, version 1 adding 1) and the devices polling it."""

    def __init__(self, start_server: Any, s3: S3Server, tmp_path: Path) -> None:
        self.s3, self.tmp_path, self._start = s3, tmp_path, start_server
        self.bucket = Bucket(s3)
        self.bucket.put("m/config.pbtxt", CONFIG.encode())
        self.bucket.put_version(1, 1)

    def publish(self, document: RolloutDocument) -> None:
        self.bucket.put("m/rollout.json", document.to_json())

    def put_failing(self, version: int) -> None:
        self.put_files(version, {"model.onnx": _failing_model().SerializeToString()})

    def put_files(self, version: int, files: dict[str, bytes]) -> None:
        for name, data in {**files, "SHA256SUMS": _manifest(files)}.items():
            self.bucket.put(f"m/{version}/{name}", data)

    def put_python(self, version: int, value: int, sleep_s: float) -> None:
        """Model m as a Python model (its config too) adding `value` after `sleep_s`."""
        self.bucket.put("m/config.pbtxt", PY_FP32_CONFIG.replace("{name}", "m").encode())
        self.bucket.delete(f"m/{version}/model.onnx")
        source = _SLEEPING_MODEL.format(value=value, sleep_s=sleep_s)
        self.put_files(version, {"model.py": source.encode()})

    def device(self, device_id: str, *flags: str, url: str | None = None) -> ServerProcess:
        proc: ServerProcess = self._start(
            url or self.bucket.url,
            f"--model-store-dir={self.tmp_path / device_id}",
            f"--device-id={device_id}",
            *POLL,
            "--repository-sync-wait-secs=60",
            *flags,
            env=self.s3.env(),
        )
        return proc

    def stored(self, device_id: str, version: int) -> bool:
        """Whether the device's model store holds a version of m (it was downloaded)."""
        return any((self.tmp_path / device_id).glob(f"models/*/m/{version}/model.onnx"))

    def get(self, key: str) -> dict[str, Any] | None:
        try:
            body = self.bucket.client.get_object(Bucket=self.bucket.name, Key=key)["Body"]
        except self.bucket.client.exceptions.NoSuchKey:
            return None
        data: dict[str, Any] = json.loads(body.read())
        return data

    def keys(self, prefix: str) -> list[str]:
        page = self.bucket.client.list_objects_v2(Bucket=self.bucket.name, Prefix=prefix)
        return sorted(item["Key"] for item in page.get("Contents", []))

    def report(self, device_id: str) -> dict[str, Any] | None:
        return self.get(report_key(PREFIX, device_id))


@pytest.fixture
def fleet(start_server: Any, s3: S3Server, tmp_path: Path) -> Fleet:
    return Fleet(start_server, s3, tmp_path)


def _serves(proc: ServerProcess, value: float) -> bool:
    return _added(proc.http_url) == value


def _infer_until(proc: ServerProcess, value: float, timeout_s: float = 30.0) -> int:
    """Send requests until the model adds `value`; how many failed on the way."""
    failures = 0
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if _added(proc.http_url) == value:
                return failures
        except InferenceServerException:
            failures += 1
    raise AssertionError(f"the model never added {value}")


def test_a_device_in_the_stage_switches_and_one_outside_keeps_its_version(fleet: Fleet) -> None:
    document = _document(revision=2)
    (inside,), (outside,) = _ids(document, True), _ids(document, False)
    fleet.publish(_document(revision=1, stage=-1))  # published, not started
    fleet.bucket.put_version(2, 2)
    taker = fleet.device(inside, "--device-label=site=berlin")
    keeper = fleet.device(outside)
    assert _serves(taker, 1.0)
    assert not fleet.stored(inside, 2)

    fleet.publish(document)
    _wait_for(lambda: _serves(taker, 2.0))
    assert _serves(keeper, 1.0)
    assert fleet.stored(inside, 2)
    assert not fleet.stored(outside, 2)  # a version the device will not serve is not fetched

    # Probation (the document's: 4 requests) passes; the verdict is in the key.
    for _ in range(4):
        assert _serves(taker, 2.0)
    passed = verdict_key(PREFIX, "m", 2, "passed", inside)
    _wait_for(lambda: fleet.get(passed) is not None)
    marker = fleet.get(passed)
    assert marker is not None
    assert (marker["device"], marker["model"], marker["version"]) == (inside, "m", 2)
    assert marker["verdict"] == "passed"
    assert "passed its first 4 requests" in taker.log()

    def reported(device_id: str, **expected: Any) -> bool:
        report = fleet.report(device_id)
        model = (report or {}).get("models", {}).get("m", {})
        return all(model.get(k) == v for k, v in expected.items())

    _wait_for(lambda: reported(inside, serving=[2], probation="passed"))
    report = fleet.report(inside)
    assert report is not None
    assert report["format"] == 1
    assert report["device"] == inside
    assert report["labels"] == {"site": "berlin"}
    assert report["last_poll_ok"] is True
    assert report["time"].endswith("Z")
    assert report["last_poll"].endswith("Z")
    assert report["server_version"]
    model = report["models"]["m"]
    assert (model["rollout_revision"], model["target"], model["in_stage"]) == (2, 2, True)
    assert model["requests"] >= 5
    assert model["errors"] == 0
    assert set(model) >= {"reason", "p50_ms", "p99_ms"}
    _wait_for(lambda: reported(outside, serving=[1], in_stage=False, probation="none"))

    # Advancing the stage only adds devices: the one outside takes the target now.
    fleet.publish(_document(revision=3, stage=1))
    _wait_for(lambda: _serves(keeper, 2.0))
    assert _serves(taker, 2.0)
    # Both have acted on revision 3 (a device that never saw it would take revision 2 as new).
    _wait_for(lambda: reported(inside, rollout_revision=3))
    _wait_for(lambda: reported(outside, rollout_revision=3))
    # A stale copy of an older revision is ignored.
    fleet.publish(_document(revision=2, stage=0))
    time.sleep(1.5)  # several polls
    assert _serves(keeper, 2.0)

    # The rollout is complete (last stage) and the taker passed: it looks for a halt at the
    # report interval, not every poll, so an idle poll is one listing (two without that).
    syncs = set()  # each poll's sync time, sampled far more often than polls come
    before = _metric(taker, "edge_repository_requests")
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:
        syncs.add(_metric(taker, "edge_repository_last_sync_timestamp_seconds"))
        time.sleep(0.05)
    requests = _metric(taker, "edge_repository_requests") - before
    assert len(syncs) >= 4
    assert requests <= len(syncs) + 1


def test_a_target_failing_its_probation_rolls_back_and_is_not_taken_again(
    fleet: Fleet,
) -> None:
    document = _document(halt=None, revision=2)
    (inside,) = _ids(document, True)
    fleet.publish(_document(revision=1, stage=-1))
    fleet.put_failing(2)
    proc = fleet.device(inside)
    assert _serves(proc, 1.0)
    fleet.publish(document)
    _wait_for(lambda: fleet.stored(inside, 2))
    # Once version 2 serves (a busy machine can take a while to load it), its probation runs.
    client = httpclient.InferenceServerClient(proc.http_url)
    _wait_for(lambda: client.is_model_ready("m", "2"))
    failures = _infer_until(proc, 1.0)
    assert failures == 2  # rolled back once more than 25 % of its first 4 requests failed
    assert "the rollout's probation.max_error_rate 0.25" in proc.log()
    failed = verdict_key(PREFIX, "m", 2, "failed", inside)
    _wait_for(lambda: fleet.get(failed) is not None)
    marker = fleet.get(failed)
    assert marker is not None
    assert "rolled back" in marker["reason"]
    _wait_for(
        lambda: (
            (fleet.report(inside) or {}).get("models", {}).get("m", {}).get("probation") == "failed"
        )
    )
    time.sleep(1.5)  # several polls: the device does not take the failed target again
    for _ in range(5):
        assert _serves(proc, 1.0)


def test_a_halt_keeps_devices_off_the_target_and_rolls_back_those_on_it(fleet: Fleet) -> None:
    document = _document(revision=2)
    first, late = _ids(document, True, 2)
    fleet.publish(_document(revision=1, stage=-1))
    fleet.bucket.put_version(2, 2)
    on_target = fleet.device(first)
    assert _serves(on_target, 1.0)
    fleet.publish(document)
    _wait_for(lambda: _serves(on_target, 2.0))
    for _ in range(4):
        assert _serves(on_target, 2.0)
    _wait_for(lambda: fleet.get(verdict_key(PREFIX, "m", 2, "passed", first)) is not None)

    # Two other devices failed it: 2 of 3 is over the document's 20 %.
    for other in ("other-1", "other-2"):
        fleet.bucket.client.put_object(
            Bucket=fleet.bucket.name, Key=verdict_key(PREFIX, "m", 2, "failed", other), Body=b"{}"
        )
    _wait_for(lambda: _serves(on_target, 1.0))  # rolled back
    _wait_for(
        lambda: (
            (fleet.report(first) or {}).get("models", {}).get("m", {}).get("probation") == "halted"
        )
    )
    assert "halted: 2 of 3 devices failed version 2" in on_target.log()

    newcomer = fleet.device(late)  # in the stage, but the rollout is halted
    time.sleep(1.5)
    assert _serves(newcomer, 1.0)
    assert not fleet.stored(late, 2)


def test_an_operator_halt_without_rollback_keeps_devices_on_the_target(fleet: Fleet) -> None:
    document = _document(halt={"max_failed_share": 0.5, "rollback": False})
    fleet.bucket.put_version(2, 2)
    fleet.publish(document)
    (inside,) = _ids(document, True)
    proc = fleet.device(inside)
    _wait_for(lambda: _serves(proc, 2.0))
    fleet.publish(
        _document(
            revision=2,
            halted=True,
            reason="bad batch",
            halt={"max_failed_share": 0.5, "rollback": False},
        )
    )
    _wait_for(
        lambda: (
            "halted by the operator: bad batch"
            in str((fleet.report(inside) or {}).get("models", {}).get("m", {}).get("reason"))
        )
    )
    assert _serves(proc, 2.0)


def test_a_device_with_the_bucket_unreachable_keeps_serving_and_reports_when_back(
    start_server: Any, s3: S3Server, tmp_path: Path
) -> None:
    device = Device(start_server, s3, tmp_path)
    try:
        device.bucket.seed()
        document = _document(stages=[{"percent": 100}])
        device.bucket.put_version(2, 2)
        device.bucket.put("m/rollout.json", document.to_json())
        proc = device.start("--device-id=dev-x", "--fleet-report-interval=30", first=True)
        _wait_for(lambda: device.added() == 2.0)
        key = report_key(PREFIX, "dev-x")
        client = device.bucket.client  # straight to the S3 server, not over the device's link

        def report() -> dict[str, Any] | None:
            try:
                body = client.get_object(Bucket=device.bucket.name, Key=key)["Body"]
            except client.exceptions.NoSuchKey:
                return None
            data: dict[str, Any] = json.loads(body.read())
            return data

        _wait_for(lambda: report() is not None)
        device.link.stop()
        client.delete_object(Bucket=device.bucket.name, Key=key)
        _wait_for(lambda: "model source unreachable" in proc.log())
        _wait_for(lambda: "fleet: cannot write to the bucket" in proc.log())
        for _ in range(10):
            assert device.added() == 2.0  # serving goes on
        time.sleep(1.0)
        assert proc.log().count("fleet: cannot write to the bucket") == 1  # once per outage
        assert report() is None
        device.link.start()
        _wait_for(lambda: (report() or {}).get("last_poll_ok") is True)
        assert "fleet: writing to the bucket works again" in proc.log()
        assert (report() or {})["models"]["m"]["serving"] == [2]
    finally:
        device.link.stop()


def test_a_rollout_document_is_followed_only_with_a_good_signature(
    fleet: Fleet, tmp_path: Path
) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    public = tmp_path / "release.pub"
    public.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    fleet.bucket.put_model_files({"config.pbtxt": CONFIG.encode()}, key)
    for version in (1, 2):
        files = fleet.bucket.put_version(version, version)
        fleet.bucket.put(f"m/{version}/SHA256SUMS.sig", key.sign(files["SHA256SUMS"]))
    started = _document(revision=1, stage=-1, stages=[{"percent": 100}])
    fleet.publish(started)
    fleet.bucket.put("m/rollout.json.sig", key.sign(started.to_json()))
    proc = fleet.device("dev-signed", f"--manifest-public-key={public}")
    assert _serves(proc, 1.0)
    assert not fleet.stored("dev-signed", 2)  # the signed document holds everyone back

    document = _document(revision=2, stage=0, stages=[{"percent": 100}])
    fleet.publish(document)  # signed by someone else
    fleet.bucket.put("m/rollout.json.sig", Ed25519PrivateKey.generate().sign(document.to_json()))
    _wait_for(lambda: "rollout.json.sig does not verify" in proc.log())
    time.sleep(1.0)  # several polls
    assert _serves(proc, 1.0)
    assert not fleet.stored("dev-signed", 2)
    assert proc.log().count("rollout.json.sig does not verify") == 1  # once per revision

    fleet.bucket.put("m/rollout.json.sig", key.sign(document.to_json()))
    _wait_for(lambda: _serves(proc, 2.0))


async def test_listings_skip_the_fleet_area(
    s3: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Thousands of reports under .fleet/ cost a device's poll no extra pages."""
    from concurrent.futures import ThreadPoolExecutor

    from appliance.repository.manifest import NO_MANIFEST_RULES
    from appliance.repository.s3 import S3Source

    bucket = Bucket(s3)
    bucket.put("m/config.pbtxt", CONFIG.encode())
    bucket.put_version(1, 1)
    bucket.put("-early/1/model.onnx", b"x")  # sorts before '.fleet/'
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda n: bucket.put(f".fleet/devices/d{n:05d}.json", b"{}"), range(2050)))
    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)
    source = S3Source(bucket.url, tmp_path, None, NO_MANIFEST_RULES)
    expected = {
        "models/-early/1/model.onnx",
        "models/m/config.pbtxt",
        "models/m/1/model.onnx",
        "models/m/1/SHA256SUMS",
    }
    async with source.opened():
        counts = []
        for _ in range(3):
            before = source.requests
            objects, _ = await source._list()
            counts.append(source.requests - before)
            assert {o.key for o in objects} == expected
        bucket.delete("-early/1/model.onnx")
        before = source.requests
        objects, _ = await source._list()
        assert {o.key for o in objects} == expected - {"models/-early/1/model.onnx"}
    # Paging through the area would take 3 pages; the first listing reads one page of it, then
    # a one-key page finds it at once: 1 key, then the models after it.
    assert counts == [2, 3, 3]  # '-early' sorts before the area: the probe pages on to it
    assert source.requests - before == 2


def test_a_target_that_does_not_load_is_a_failed_verdict(fleet: Fleet) -> None:
    document = _document(revision=2)
    (inside,) = _ids(document, True)
    fleet.publish(_document(revision=1, stage=-1))
    fleet.bucket.put_version(2, None)  # a corrupt model file (its manifest matches it)
    proc = fleet.device(inside)
    fleet.publish(document)
    failed = verdict_key(PREFIX, "m", 2, "failed", inside)
    _wait_for(lambda: fleet.get(failed) is not None)
    marker = fleet.get(failed)
    assert marker is not None
    assert "onnxruntime cannot load" in marker["reason"]
    assert _serves(proc, 1.0)
    _wait_for(
        lambda: (
            (fleet.report(inside) or {}).get("models", {}).get("m", {}).get("probation") == "failed"
        )
    )
    time.sleep(1.0)  # several polls: not loaded again
    assert proc.log().count("version 2 failed to load:") == 1


def _model_report(fleet: Fleet, device_id: str) -> dict[str, Any]:
    model: dict[str, Any] = (fleet.report(device_id) or {}).get("models", {}).get("m", {})
    return model


def test_a_much_slower_target_fails_probation_on_latency_and_rolls_back(fleet: Fleet) -> None:
    probation = {"window_requests": 4, "max_error_rate": 0.25, "max_latency_ratio": 3}
    document = _document(revision=2, halt=None, probation=probation)
    (inside,) = _ids(document, True)
    fleet.put_python(1, 1, sleep_s=0)  # the baseline answers at once
    fleet.put_python(2, 2, sleep_s=0.25)  # the target answers right, 250 ms later
    fleet.publish(_document(revision=1, stage=-1, halt=None, probation=probation))
    proc = fleet.device(inside)
    for _ in range(10):  # the baseline's recent latencies, read at the switch
        assert _serves(proc, 1.0)
    fleet.publish(document)
    _wait_for(lambda: _serves(proc, 2.0))
    answers: list[float] = []
    deadline = time.monotonic() + 30
    while not answers or answers[-1] != 1.0:
        assert time.monotonic() < deadline
        answers.append(_added(proc.http_url))  # none fails: only latency can roll it back
    assert answers == [2.0, 2.0, 2.0, 1.0]  # 3 + the one above: rolled back after its window

    failed = verdict_key(PREFIX, "m", 2, "failed", inside)
    _wait_for(lambda: fleet.get(failed) is not None)
    marker = fleet.get(failed)
    assert marker is not None
    reason = marker["reason"]
    assert reason.startswith("rolled back: its median latency over its first 4 requests was ")
    assert "times the" in reason
    assert "ms of version 1 before the switch" in reason
    assert reason.endswith("(the rollout's probation.max_latency_ratio 3)")
    median_ms = float(reason.split(" was ", 1)[1].split(" ms", 1)[0])
    assert median_ms >= 250
    assert fleet.get(verdict_key(PREFIX, "m", 2, "passed", inside)) is None
    _wait_for(lambda: _model_report(fleet, inside).get("probation") == "failed")
    model = _model_report(fleet, inside)
    assert model["serving"] == [1]
    assert "median latency" in model["reason"]
    # Reports carry latency percentiles without --metrics-config histogram_latencies=true.
    assert isinstance(model["p50_ms"], float)
    assert isinstance(model["p99_ms"], float)
    assert 0 < model["p50_ms"] <= model["p99_ms"]

    time.sleep(1.5)  # several polls: the slow target is not taken again
    for _ in range(5):
        assert _serves(proc, 1.0)
    assert proc.log().count("version 2 rolled back: its median latency") == 1  # once


def test_a_target_that_fails_its_warm_up_is_a_failed_verdict(fleet: Fleet) -> None:
    warmup = (
        'model_warmup [ { name: "zeros", batch_size: 1, inputs { key: "INPUT0" '
        "value: { data_type: TYPE_FP32, dims: [ 4 ], zero_data: true } } } ]\n"
    )
    fleet.bucket.put("m/config.pbtxt", (CONFIG + warmup).encode())
    document = _document(revision=2)
    (inside,) = _ids(document, True)
    fleet.publish(_document(revision=1, stage=-1))
    fleet.put_failing(2)  # loads, fails every request: its warm-up fails
    proc = fleet.device(inside)
    assert _serves(proc, 1.0)
    fleet.publish(document)
    failed = verdict_key(PREFIX, "m", 2, "failed", inside)
    _wait_for(lambda: fleet.get(failed) is not None)
    marker = fleet.get(failed)
    assert marker is not None
    assert "warm-up sample 'zeros' failed" in marker["reason"]
    assert _serves(proc, 1.0)  # it never served
    _wait_for(lambda: _model_report(fleet, inside).get("probation") == "failed")


def test_a_replayed_older_revision_is_refused_after_a_restart_too(fleet: Fleet) -> None:
    # Issue 31 item 6: the highest revision acted on is kept in the ledger, so a stale or
    # replayed (validly signed) older document is not obeyed after a reboot either.
    fleet.bucket.put_version(2, 2)
    (device,) = _ids(_document(stages=[{"percent": 100}]), True)
    fleet.publish(_document(revision=3, stage=0, stages=[{"percent": 100}]))
    proc = fleet.device(device)
    _wait_for(lambda: _serves(proc, 2.0))
    proc.stop()
    # The replay: revision 2, not started (every device serves the baseline, version 1).
    fleet.publish(_document(revision=2, stage=-1, stages=[{"percent": 100}]))
    again = fleet.device(device)
    _wait_for(lambda: "revision 2 ignored: revision 3 was acted on before" in again.log())
    assert _serves(again, 2.0)
