"""The fleet, tested as one (issue 22): SeaweedFS with SigV4 and 22 real appliance processes with
their own ids, labels, stores and links to the bucket, driven by `edge-appliance fleet`; every
manifest and rollout document is signed, and every device checks the signatures.

v2 at 10%: the devices the hash picks, and only they, switch; advanced to 100%, every device
takes it (the time it takes is measured). v3 fails probation where it lands: the rollout halts
itself, those devices go back to v2, and even at 100% no other device takes v3; `fleet status`
says so. One device loses its link to the bucket for a while: it keeps serving, goes silent,
and reports again once the link is back. Every device's S3 requests are counted by kind on its
link (an HTTP-parsing proxy), for the numbers in docs/benchmarks/history.md ("Fleet").

Beside it: a fleet area bigger than one listing page (1,101 reports) keeps an idle poll at two
small listings, and a device whose writes are all refused still follows the rollout.

Bounded for CI on 2 cores: tiny ONNX models, no gRPC or metrics listener, a 1 s poll. Measured
on this shared 2-core machine: 107-156 s, 45-56 s and about 20 s.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import statistics
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import tritonclient.http as httpclient
from onnx import TensorProto, helper

from appliance.face import cli
from appliance.repository import rollout
from tests.integration.models import IR_VERSION, OPSET
from tests.integration.test_s3_repository import CONFIG, Bucket, _model_bytes
from tests.s3servers import seaweed_server, weed_binary
from tests.serverproc import ServerProcess
from tests.tcpproxy import TcpProxy

pytestmark = [
    pytest.mark.fleet,
    pytest.mark.skipif(weed_binary() is None, reason="SeaweedFS 'weed' binary not found"),
]

DEVICES = 22
POLL_S = float(os.environ.get("FLEET_POLL_S", "1"))  # another value to measure (docs/benchmarks)
IDLE_WINDOW_S = 10.0
SITES = ("berlin", "munich")
CUT = "dev-21"  # the device whose link goes down (in neither 10% stage: checked below)
# Short probations so that the test's own requests decide them: 2 failures of 3 fail one.
PROBATION = ("--probation-window", "3", "--probation-max-error-rate", "0.34")


# -- a link to the bucket that counts requests and can be cut ------------------------------------


class _RequestParser:
    """Finds the HTTP/1.1 requests in a client's byte stream (Content-Length or chunked)."""

    def __init__(self, record: Callable[[str, str, int], None]) -> None:
        self._record = record
        self._buffer = b""
        self._body_left = 0
        self._chunked = False

    def feed(self, data: bytes) -> None:
        self._buffer += data
        while True:
            if self._body_left:
                used = min(self._body_left, len(self._buffer))
                self._body_left -= used
                self._buffer = self._buffer[used:]
                if self._body_left:
                    return
            if self._chunked:
                line, sep, rest = self._buffer.partition(b"\r\n")
                if not sep:
                    return
                size = int(line.split(b";")[0] or b"0", 16)
                if size == 0:
                    end = rest.find(b"\r\n\r\n") if not rest.startswith(b"\r\n") else -2
                    if end == -1:
                        return
                    self._buffer = rest[end + 4 :]
                    self._chunked = False
                    continue
                self._buffer, self._body_left = rest, size + 2
                continue
            end = self._buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self._buffer[:end].decode("latin-1").split("\r\n")
            self._buffer = self._buffer[end + 4 :]
            method, target = head[0].split(" ")[:2]
            headers = {}
            for line in head[1:]:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            self._chunked = "chunked" in headers.get("transfer-encoding", "")
            self._body_left = int(headers.get("content-length", "0") or 0)
            self._record(method, target, self._body_left)


def request_kind(method: str, target: str) -> str:
    path, _, query = target.partition("?")
    name = path.rsplit("/", 1)[-1]
    if method == "GET" and "list-type=2" in query:
        query = urllib.parse.unquote(query)
        if "verdicts" in query:
            return "list verdicts"
        return "list 1 key" if "max-keys=1&" in query + "&" else "list"
    if method == "GET":
        return "get rollout" if name.startswith(rollout.ROLLOUT) else "get"
    if method == "PUT" and "/.fleet/devices/" in path:
        return "put report"
    if method == "PUT" and "/.fleet/verdicts/" in path:
        return "put verdict"
    return method.lower()


class CountingLink(TcpProxy):
    """TcpProxy that counts the S3 requests going through it by kind (and report bytes)."""

    def __init__(self, target: str) -> None:
        self.counts: Counter[str] = Counter()
        self.report_bytes: list[int] = []
        self._count_lock = threading.Lock()
        self._target_port = int(target.rpartition(":")[2])
        super().__init__(target)

    def take(self) -> Counter[str]:
        with self._count_lock:
            counts, self.counts = self.counts, Counter()
        return counts

    def _record(self, method: str, target: str, body_bytes: int) -> None:
        kind = request_kind(method, target)
        with self._count_lock:
            self.counts[kind] += 1
            if kind == "put report":
                self.report_bytes.append(body_bytes)

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:  # type: ignore[override]
        # TcpProxy starts one pipe per direction; the one towards the S3 server is parsed.
        try:
            upstream = dst.getpeername()[1] == self._target_port
        except OSError:
            upstream = False
        parser = _RequestParser(self._record) if upstream else None
        try:
            while data := src.recv(65536):
                if parser is not None:
                    parser.feed(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)


_DENIED = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n'
    b"<Error><Code>AccessDenied</Code><Message>Access Denied</Message></Error>"
)


class ReadOnlyLink(CountingLink):
    """A link with credentials that may read and not write: the link itself answers every PUT,
    POST and DELETE with 403 AccessDenied, as S3 does to a key outside the device's policy.
    (Bodies with a Content-Length only: what the SDK sends for a report or a verdict.)"""

    def __init__(self, target: str) -> None:
        self.refused = 0
        super().__init__(target)

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:  # type: ignore[override]
        try:
            upstream = dst.getpeername()[1] == self._target_port
        except OSError:
            upstream = False
        if not upstream:
            super()._pipe(src, dst)
            return
        buffer = b""
        try:
            while data := src.recv(65536):
                buffer += data
                while (end := buffer.find(b"\r\n\r\n")) >= 0:
                    head = buffer[:end].decode("latin-1").split("\r\n")
                    headers = {}
                    for line in head[1:]:
                        name, _, value = line.partition(":")
                        headers[name.strip().lower()] = value.strip()
                    method, target = head[0].split(" ")[:2]
                    length = int(headers.get("content-length", "0") or 0)
                    write = method in ("PUT", "POST", "DELETE")
                    # "Expect: 100-continue": the body comes only after a 100; a 403 instead
                    # answers the headers alone.
                    waits = write and headers.get("expect", "").lower() == "100-continue"
                    size = end + 4 + (0 if waits else length)
                    if len(buffer) < size:
                        break
                    request, buffer = buffer[:size], buffer[size:]
                    self._record(method, target, length)
                    if not write:
                        dst.sendall(request)
                        continue
                    self.refused += 1
                    src.sendall(
                        b"HTTP/1.1 403 Forbidden\r\nContent-Type: application/xml\r\n"
                        + f"Content-Length: {len(_DENIED)}\r\n".encode()
                        + (b"Connection: close\r\n\r\n" if waits else b"\r\n")
                        + _DENIED
                    )
                    if waits:  # the connection's byte stream is not followed further
                        return
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)


# -- the devices ---------------------------------------------------------------------------------


class Device:
    def __init__(
        self,
        index: int,
        s3: Any,
        bucket: Bucket,
        tmp_path: Path,
        *flags: str,
        link: type[CountingLink] = CountingLink,
    ) -> None:
        self.id = f"dev-{index:02d}"
        self.site = SITES[index % 2]
        self.link = link(s3.host_port)
        folder = tmp_path / self.id
        folder.mkdir()
        url = f"s3://{self.link.address}/{bucket.name}/models"
        self.proc = ServerProcess(
            url,
            f"--model-store-dir={folder / 'store'}",
            "--model-control-mode=poll",
            f"--repository-poll-secs={POLL_S:g}",
            "--repository-sync-wait-secs=60",
            "--allow-grpc=false",
            "--allow-metrics=false",
            "--log-verbose=0",
            f"--device-id={self.id}",
            f"--device-label=site={self.site}",
            "--device-label=hw=tiny",
            *flags,
            log_path=folder / "server.log",
            env=s3.env(),
        )
        self._client: Any = None

    def value(self) -> float:
        """What the served version adds (raises InferenceServerException when it fails)."""
        if self._client is None:
            self._client = httpclient.InferenceServerClient(self.proc.http_url)
        inp = httpclient.InferInput("INPUT0", [1, 4], "FP32")
        inp.set_data_from_numpy(np.zeros((1, 4), np.float32))
        return float(self._client.infer("m", [inp]).as_numpy("OUTPUT0")[0, 0])

    def serves(self, expected: float) -> bool:
        try:
            return self.value() == expected
        except Exception:
            return False


def broken_model() -> bytes:
    """Loads, then fails every request: Gather with an index past the input's 4 columns."""
    graph = helper.make_graph(
        [
            helper.make_node("Gather", ["INPUT0", "idx"], ["g"], axis=1),
            helper.make_node("Add", ["INPUT0", "g"], ["OUTPUT0"]),
        ],
        "broken",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", 4])],
        initializer=[helper.make_tensor("idx", TensorProto.INT64, [1], [7])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    return bytes(model.SerializeToString())


def release_keys(folder: Path) -> tuple[Path, Path]:
    """An Ed25519 key pair as PEM files: (private, public)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    private, public = folder / "release.pem", folder / "release.pub"
    private.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    public.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return private, public


def wait_for(what: str, predicate: Callable[[], bool], timeout_s: float = 120.0) -> float:
    """Seconds until `predicate()` held (polled every 0.1 s)."""
    started = time.monotonic()
    while not predicate():
        assert time.monotonic() - started < timeout_s, f"not within {timeout_s:g} s: {what}"
        time.sleep(0.1)
    return time.monotonic() - started


def reports(bucket: Bucket) -> dict[str, dict[str, Any]]:
    listed = bucket.client.list_objects_v2(Bucket=bucket.name, Prefix="models/.fleet/devices/")
    found = {}
    for item in listed.get("Contents", []):
        body = bucket.client.get_object(Bucket=bucket.name, Key=item["Key"])["Body"].read()
        report = json.loads(body)
        found[report["device"]] = report
    return found


def verdicts(bucket: Bucket, version: int) -> dict[str, str]:
    listed = rollout.verdict_prefix("models", "m", version)
    answer = bucket.client.list_objects_v2(Bucket=bucket.name, Prefix=listed)
    found = {}
    for item in answer.get("Contents", []):
        parsed = rollout.parse_verdict_key(listed, item["Key"])
        if parsed is not None:
            found[parsed[1]] = parsed[0]
    return found


def revision(bucket: Bucket) -> int:
    body = bucket.client.get_object(Bucket=bucket.name, Key="models/m/rollout.json")["Body"]
    return rollout.RolloutDocument.parse(body.read(), "m").revision


def acted_on(bucket: Bucket, devices: list[Device], wanted: int) -> Callable[[], bool]:
    """Every device has reported the rollout document's revision `wanted` (or a later one)."""

    def check() -> bool:
        got = reports(bucket)
        return all(
            (got.get(d.id, {}).get("models", {}).get("m", {}).get("rollout_revision") or 0)
            >= wanted
            for d in devices
        )

    return check


def version_folder(tmp_path: Path, version: int, data: bytes) -> Path:
    folder = tmp_path / "release" / str(version)
    folder.mkdir(parents=True)
    (folder / "model.onnx").write_bytes(data)
    return folder


# -- the test ------------------------------------------------------------------------------------


@pytest.mark.timeout(480)
def test_a_fleet_rolls_out_by_stage_halts_a_bad_version_and_rides_out_a_lost_link(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    numbers: dict[str, Any] = {"devices": DEVICES, "poll_s": POLL_S}
    with seaweed_server(tmp_path) as s3:
        for name, value in s3.env().items():
            monkeypatch.setenv(name, value)
        bucket = Bucket(s3)
        url = bucket.url

        private, public = release_keys(tmp_path)
        # EDGE_FLEET_TUF=1: the same run in TUF metadata mode too (docs/model-updates.md):
        # publish signs TUF metadata, every device trusts its root (not in CI: ~2 min more).
        tuf = os.environ.get("EDGE_FLEET_TUF") == "1"
        tuf_keys = tmp_path / "tuf-keys"
        if tuf:
            assert cli.main(["fleet", "keys", str(tuf_keys)]) == 0

        def fleet(*argv: Any) -> str:  # every write signed; the devices check the signatures
            if argv[0] != "status":
                argv = (*argv, "--sign-key", private)
            if tuf and argv[0] == "publish":
                argv = (*argv, "--tuf-keys", tuf_keys)
            code = cli.main(["fleet", *[str(a) for a in argv]])
            out, err = capsys.readouterr()
            assert code == 0, err
            return out

        model_files = tmp_path / "m"  # signed too: devices with the key take nothing unsigned
        model_files.mkdir()
        (model_files / "config.pbtxt").write_text(CONFIG)
        first = version_folder(tmp_path, 1, _model_bytes(1))
        fleet("publish", url, "m", first, "--version", 1, "--model-files", model_files)
        started = time.monotonic()
        key_flag = f"--manifest-public-key={public}"
        tuf_flag = (f"--model-repository-tuf-root={tuf_keys / '1.root.json'}",) if tuf else ()
        devices = [Device(i, s3, bucket, tmp_path, key_flag, *tuf_flag) for i in range(DEVICES)]
        by_id = {d.id: d for d in devices}
        cut = by_id[CUT]
        try:
            for device in devices:
                device.proc.wait_ready(timeout_s=180)
            numbers["start_all_s"] = round(time.monotonic() - started, 1)
            print("fleet: all ready after", numbers["start_all_s"], "s")  # noqa: T201
            assert all(d.value() == 1.0 for d in devices)
            if tuf:  # each device holds trusted TUF metadata of its own
                assert all(
                    list((tmp_path / d.id / "store" / "tuf").glob("*/timestamp.json"))
                    for d in devices
                )
            # Every device's report names `m` before the link is cut: a device whose first
            # report went out before `m` loaded, and whose next one meets the cut, is never
            # counted in the stage (two clean-clone runs saw it: 21 of 22).
            wait_for(
                "every device reports serving m",
                lambda: (
                    [r["models"].get("m", {}).get("serving") for r in reports(bucket).values()]
                    == [[1]] * DEVICES
                ),
            )

            # -- v2 at 10%: the devices the hash picks switch, the others do not -----------------
            in_v2 = {d.id for d in devices if rollout.hash_share(d.id, "m", 2) < 10}
            in_v3 = {d.id for d in devices if rollout.hash_share(d.id, "m", 3) < 10}
            assert in_v2, "no device in v2's 10%: choose other ids"
            assert len(in_v3) >= 2, "fewer than 2 devices in v3's 10%: choose other ids"
            assert CUT not in in_v2 | in_v3
            cut.link.stop()  # from here the device cannot reach the bucket
            cut_at = time.monotonic()
            fleet(
                "publish", url, "m", version_folder(tmp_path, 2, _model_bytes(2)), "--version", 2,
                "--stages", "10,100", "--start", *PROBATION,
            )  # fmt: skip
            live = [d for d in devices if d is not cut]
            wait_for("the 10% serve v2", lambda: all(by_id[i].serves(2.0) for i in in_v2))
            wait_for("all devices acted on v2's start", acted_on(bucket, live, revision(bucket)))
            assert {d.id for d in devices if d.serves(2.0)} == in_v2
            assert all(d.serves(1.0) for d in devices if d.id not in in_v2)
            assert cut.serves(1.0)  # no bucket, still serving

            # -- 100% ----------------------------------------------------------------------------
            time.sleep(max(0.0, cut_at + 4 - time.monotonic()))  # the cut's report ages first
            advanced = time.monotonic()
            fleet("advance", url, "m")
            arrivals = []
            waiting = {d.id for d in live if d.id not in in_v2}
            deadline = advanced + 120
            while waiting:
                assert time.monotonic() < deadline, f"not on v2 after 120 s: {sorted(waiting)}"
                for device_id in sorted(waiting):
                    if by_id[device_id].serves(2.0):
                        arrivals.append(time.monotonic() - advanced)
                        waiting.discard(device_id)
                time.sleep(0.05)
            numbers["rollout_100_s"] = {
                "median": round(statistics.median(arrivals), 2),
                "max": round(max(arrivals), 2),
                "devices": len(arrivals),
            }
            for device in live:  # v2's probation: 3 good requests each
                for _ in range(3):
                    assert device.value() == 2.0
            wait_for(
                "v2 passed on every live device", lambda: len(verdicts(bucket, 2)) == len(live)
            )
            assert set(verdicts(bucket, 2).values()) == {rollout.PASSED}
            assert cut.serves(1.0)

            # -- idle: what a device costs the bucket ---------------------------------------------
            time.sleep(2 * POLL_S)  # the last reports go out
            for device in live:
                device.link.take()
            time.sleep(IDLE_WINDOW_S)
            idle: Counter[str] = Counter()
            for device in live:
                idle.update(device.link.take())
            polls = idle["list"]  # one listing of the repository per poll
            assert polls >= len(live), "a device did not poll during the idle window"
            numbers["idle"] = {
                "window_s": IDLE_WINDOW_S,
                "devices": len(live),
                "requests": dict(idle),
                "per_poll": {k: round(v / polls, 3) for k, v in idle.items()},
                "polls_per_device_hour": round(polls / len(live) / IDLE_WINDOW_S * 3600),
            }
            sizes = [n for d in devices for n in d.link.report_bytes]
            numbers["report_bytes"] = {"median": statistics.median(sizes), "max": max(sizes)}

            # the cut device is silent and behind; the rest are not
            # newer reports than the advance (every other device switched), older: the cut one
            # Reports are written on change: on a busy CI machine one can lag the switch it
            # reports by a poll or two, so the view is read until it settles (30 s at most).
            settle_by = time.monotonic() + 30
            while True:
                now = time.monotonic()
                silent_after = now - (advanced + cut_at) / 2
                view = json.loads(fleet("status", url, "--json", "--silent-after", silent_after))
                (model,) = view["models"]
                settled = model["in_stage"] == DEVICES and model["behind"] == 1
                if settled or time.monotonic() > settle_by:
                    break
                time.sleep(1)
            # What each device last reported, for a failure's message: which one is missing.
            told = {
                d: {k: r.get(k) for k in ("time", "last_poll_ok")}
                | {k: r["models"].get("m", {}).get(k) for k in ("serving", "rollout_revision")}
                for d, r in sorted(reports(bucket).items())
            }
            assert view["silent"] == [CUT], (view, told)
            # Named first, as a long message is cut: the devices without a report of `m`.
            unreported = sorted(
                {d.id for d in devices} - {d for d, t in told.items() if t["serving"]}
            )
            assert model["in_stage"] == DEVICES, (unreported, len(told), model, told)
            assert model["in_stage_on_target"] == DEVICES - 1, (model, told)
            assert model["behind"] == 1, (model, told)

            # -- the link comes back: the device catches up and reports --------------------------
            cut.link.start()
            back = time.monotonic()
            wait_for("the cut device serves v2", lambda: cut.serves(2.0))

            def reported_again() -> bool:
                entry = reports(bucket)[CUT]
                return entry["last_poll_ok"] and entry["models"]["m"]["serving"] == [2]

            wait_for("the cut device reports again", reported_again)
            numbers["catch_up_after_link_s"] = round(time.monotonic() - back, 2)

            # -- v3 fails probation where it lands: the rollout halts itself ----------------------
            fleet(
                "publish", url, "m", version_folder(tmp_path, 3, broken_model()), "--version", 3,
                "--stages", "10,100", "--start", *PROBATION, "--halt-min-verdicts", 2,
            )  # fmt: skip

            def failed_where_it_landed() -> bool:
                for device_id in in_v3:  # the requests that make up their probation
                    with contextlib.suppress(Exception):
                        by_id[device_id].value()
                return verdicts(bucket, 3) == dict.fromkeys(in_v3, rollout.FAILED)

            wait_for("v3 failed on its 10%", failed_where_it_landed)
            wait_for("the 10% are back on v2", lambda: all(by_id[i].serves(2.0) for i in in_v3))
            fleet("advance", url, "m", "--force")  # even at 100%, nobody takes a halted version
            wait_for("all devices acted on 100%", acted_on(bucket, devices, revision(bucket)))
            assert all(d.serves(2.0) for d in devices)
            for report in reports(bucket).values():
                assert report["models"]["m"]["serving"] == [2], report
            asked = time.monotonic()
            status = fleet("status", url, "--by", "site", "--devices")
            numbers["status_s"] = round(time.monotonic() - asked, 2)
            assert "HALTED by the fleet: 2 of 2 verdicts failed" in status
            assert "devices on version 3 go back to version 2" in status
            rows = [line.split() for line in status.splitlines() if line.startswith("  ")]
            table = {(r[0], r[1]): r[2:] for r in rows if len(r) == 7 and r[1].isdigit()}
            on_v3 = sum(int(v[0]) for (_, version), v in table.items() if version == "3")
            failed_v3 = sum(int(v[3]) for (_, version), v in table.items() if version == "3")
            on_v2 = sum(int(v[0]) for (_, version), v in table.items() if version == "2")
            assert (on_v3, failed_v3, on_v2) == (0, 2, DEVICES)
            numbers["final_status"] = status
        finally:
            for device in devices:
                device.proc.proc.terminate()
            for device in devices:
                device.proc.stop()
                device.link.stop()
    numbers["total_s"] = round(time.monotonic() - started, 1)
    keep_numbers("rollout", numbers)


def keep_numbers(name: str, numbers: dict[str, Any]) -> None:
    """FLEET_NUMBERS=FOLDER keeps them as FOLDER/<name>.json (docs/benchmarks/history.md,
    "Fleet")."""
    out = os.environ.get("FLEET_NUMBERS")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / f"{name}.json").write_text(json.dumps(numbers, indent=2))


FAKE_REPORTS = 1100  # more than one listing page (1,000 keys)


@pytest.mark.timeout(300)
def test_a_big_fleet_area_costs_an_idle_poll_two_small_listings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With more reports than a listing page, an idle poll stays two listings (one of one key)
    and `fleet status` reads them all: what 10,000 devices cost, measured at 1,100."""
    numbers: dict[str, Any] = {"reports": FAKE_REPORTS + 1, "poll_s": POLL_S}
    with seaweed_server(tmp_path) as s3:
        for name, value in s3.env().items():
            monkeypatch.setenv(name, value)
        bucket = Bucket(s3)
        url = bucket.url

        def fleet(*argv: Any) -> str:
            code = cli.main(["fleet", *[str(a) for a in argv]])
            out, err = capsys.readouterr()
            assert code == 0, err
            return out

        bucket.put("m/config.pbtxt", CONFIG.encode())
        fleet("publish", url, "m", version_folder(tmp_path, 1, _model_bytes(1)), "--version", 1)
        device = Device(0, s3, bucket, tmp_path)
        try:
            device.proc.wait_ready(timeout_s=120)
            fleet(
                "publish", url, "m", version_folder(tmp_path, 2, _model_bytes(2)), "--version", 2,
                "--stages", "100", "--start", *PROBATION,
            )  # fmt: skip
            wait_for("the device serves v2", lambda: device.serves(2.0))
            body = json.dumps(
                {
                    "format": 1, "device": "fake", "labels": {"site": "far"},
                    "time": "2026-12-01T15:00:00Z", "server_version": "0.1.0",
                    "last_poll": "2026-12-01T15:00:00Z", "last_poll_ok": True,
                    "models": {"m": {"serving": [2], "rollout_revision": revision(bucket),
                                     "target": 2, "in_stage": True, "probation": "passed"}},
                }
            )  # fmt: skip
            client = s3.client(max_pool_connections=16)

            def put(i: int) -> None:
                key = f"models/.fleet/devices/fake-{i:05d}.json"
                client.put_object(
                    Bucket=bucket.name, Key=key, Body=body.replace("fake", key[22:-5])
                )

            with ThreadPoolExecutor(16) as pool:
                list(pool.map(put, range(FAKE_REPORTS)))
            for _ in range(3):  # its probation of v2: it passes, and settles on the target
                assert device.value() == 2.0
            wait_for("its verdict", lambda: verdicts(bucket, 2) == {device.id: rollout.PASSED})
            time.sleep(3 * POLL_S)
            device.link.take()
            time.sleep(IDLE_WINDOW_S)
            idle = device.link.take()
            polls = idle["list 1 key"]
            assert polls >= IDLE_WINDOW_S / POLL_S / 2
            numbers["idle_requests"] = dict(idle)
            numbers["idle_per_poll"] = {k: round(v / polls, 3) for k, v in idle.items()}
            # one page of one key (it skips the fleet area), one page of the models
            assert idle["list"] <= polls + 1
            assert sum(idle.values()) <= 2 * polls + 2
            asked = time.monotonic()
            view = json.loads(fleet("status", url, "--json"))
            numbers["status_s"] = round(time.monotonic() - asked, 2)
            assert view["devices"] == FAKE_REPORTS + 1
            assert view["models"][0]["in_stage_on_target"] == FAKE_REPORTS + 1
        finally:
            device.proc.stop()
            device.link.stop()
    keep_numbers("big-area", numbers)


@pytest.mark.timeout(240)
def test_a_device_that_may_not_write_follows_the_rollout_and_keeps_serving(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Read-only credentials (every write refused with AccessDenied): the device takes the
    rollout and serves as its neighbour does, logs the refusal once, and is simply absent from
    the reports and verdicts."""
    with seaweed_server(tmp_path) as s3:
        for name, value in s3.env().items():
            monkeypatch.setenv(name, value)
        bucket = Bucket(s3)
        url = bucket.url

        def fleet(*argv: Any) -> str:
            code = cli.main(["fleet", *[str(a) for a in argv]])
            out, err = capsys.readouterr()
            assert code == 0, err
            return out

        bucket.put("m/config.pbtxt", CONFIG.encode())
        fleet("publish", url, "m", version_folder(tmp_path, 1, _model_bytes(1)), "--version", 1)
        writer = Device(0, s3, bucket, tmp_path)
        reader = Device(1, s3, bucket, tmp_path, link=ReadOnlyLink)
        assert isinstance(reader.link, ReadOnlyLink)
        try:
            for device in (writer, reader):
                device.proc.wait_ready(timeout_s=120)
            wait_for("the writer reports", lambda: set(reports(bucket)) == {writer.id})
            fleet(
                "publish", url, "m", version_folder(tmp_path, 2, _model_bytes(2)), "--version", 2,
                "--stages", "100", "--start", *PROBATION,
            )  # fmt: skip
            for device in (writer, reader):
                wait_for(f"{device.id} serves v2", lambda d=device: d.serves(2.0))
                for _ in range(3):  # its probation passes
                    assert device.value() == 2.0
            wait_for("the writer's verdict", lambda: verdicts(bucket, 2) == {writer.id: "passed"})
            time.sleep(3 * POLL_S)  # the reader's writes were due by now, and refused
            assert reader.link.refused >= 2  # its report and its verdict, at least
            assert set(reports(bucket)) == {writer.id}
            assert verdicts(bucket, 2) == {writer.id: rollout.PASSED}
            assert reader.proc.log().count("cannot write to the bucket") == 1  # once an outage
            assert reader.value() == 2.0
            view = json.loads(fleet("status", url, "--json"))
            assert view["devices"] == 1
            assert view["models"][0]["in_stage_on_target"] == 1
        finally:
            for device in (writer, reader):
                device.proc.stop()
                device.link.stop()
