"""S3 repositories against a real S3 server (moto on loopback): sync, verify, switch, recover.

Each test gets its own bucket; the server syncs it into a model store under tmp_path.
"""

from __future__ import annotations

import hashlib
import os
import signal
import threading
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.integration.models import _add_constant_model
from tests.s3servers import S3Server, moto_server
from tests.serverproc import ServerProcess
from tests.tcpproxy import TcpProxy

CONFIG = 'name: "m"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 4\n'
POLL = ("--model-control-mode=poll", "--repository-poll-secs=0.3")


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with moto_server() as server:
        yield server


class Bucket:
    """A fresh bucket with a `models/` prefix, and ways to put versions into it."""

    def __init__(self, s3: S3Server, endpoint: str | None = None) -> None:
        self.name = f"t-{uuid.uuid4().hex[:12]}"
        s3.make_bucket(self.name)
        self.client = s3.client()
        self.url = f"s3://{endpoint or s3.host_port}/{self.name}/models"

    def put(self, key: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.name, Key=f"models/{key}", Body=data)

    def delete(self, key: str) -> None:
        self.client.delete_object(Bucket=self.name, Key=f"models/{key}")

    def seed(self) -> None:
        """Model m: its config and version 1 (adding 1), with a manifest."""
        self.put("m/config.pbtxt", CONFIG.encode())
        self.put_version(1, 1)

    def put_model_files(self, files: dict[str, bytes], key: Any, model: str = "m") -> None:
        """Model-level files (config.pbtxt, ...) with their model-level manifest, signed by
        `key` (what --manifest-public-key asks of them)."""
        manifest = _manifest(files)
        for name, data in files.items():
            self.put(f"{model}/{name}", data)
        self.put(f"{model}/SHA256SUMS.sig", key.sign(manifest))
        self.put(f"{model}/SHA256SUMS", manifest)

    def put_version(
        self,
        version: int,
        value: int | None,
        manifest: bool = True,
        padding: int = 0,
        model: str = "m",
    ) -> dict[str, bytes]:
        """Version `version` of a model adding `value` (None: a corrupt file), with a manifest.

        `padding` bytes of random, unused weights make the file big enough to interrupt.
        """
        files = {"model.onnx": _model_bytes(value, padding)}
        if manifest:
            files["SHA256SUMS"] = _manifest(files)
        for name, data in files.items():
            self.put(f"{model}/{version}/{name}", data)
        return files


def _model_bytes(value: int | None, padding: int = 0) -> bytes:
    if value is None:
        return b"not a model"
    model = _add_constant_model(value)
    if padding:
        weights = np.frombuffer(os.urandom(padding), np.uint8)
        model.graph.initializer.append(onnx.numpy_helper.from_array(weights, "unused_padding"))
    return bytes(model.SerializeToString())


def _manifest(files: dict[str, bytes]) -> bytes:
    return "".join(f"{hashlib.sha256(d).hexdigest()}  {n}\n" for n, d in files.items()).encode()


def _added(url: str, model: str = "m") -> float:
    client = httpclient.InferenceServerClient(url)
    inp = httpclient.InferInput("INPUT0", [1, 4], "FP32")
    inp.set_data_from_numpy(np.zeros((1, 4), np.float32))
    return float(client.infer(model, [inp]).as_numpy("OUTPUT0")[0, 0])


def _index(url: str) -> list[dict[str, Any]]:
    return list(httpclient.InferenceServerClient(url).get_model_repository_index())


def _wait_for(predicate: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if predicate():
                return
        except InferenceServerException:
            pass
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.1)


def _metric(proc: ServerProcess, name: str) -> float:
    """The value of a metric (summed over its label sets)."""
    url = f"http://127.0.0.1:{proc.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode()
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name)]
    assert values, f"metric {name} not exported"
    return sum(values)


def _start(start_server, bucket: Bucket, s3: S3Server, store: Path, *flags: str, wait=True):  # type: ignore[no-untyped-def]
    """A server on the bucket, ready once its first sync loaded what the bucket holds (unless
    `flags` say otherwise: by default it is ready on what the store held before the sync)."""
    if not any(flag.startswith("--repository-sync-wait-secs") for flag in flags):
        flags = ("--repository-sync-wait-secs=60", *flags)
    return start_server(bucket.url, f"--model-store-dir={store}", *flags, env=s3.env(), wait=wait)


def test_new_version_from_s3_switches_in_under_load_without_failing_a_request(
    start_server, s3: S3Server, tmp_path: Path
) -> None:
    bucket = Bucket(s3)
    bucket.seed()
    proc = _start(start_server, bucket, s3, tmp_path / "store", *POLL)
    assert _added(proc.http_url) == 1.0
    seen: Counter[float] = Counter()
    failures: list[str] = []
    stop = threading.Event()

    def load() -> None:
        client = httpclient.InferenceServerClient(proc.http_url)
        inp = httpclient.InferInput("INPUT0", [1, 4], "FP32")
        inp.set_data_from_numpy(np.zeros((1, 4), np.float32))
        while not stop.is_set():
            try:
                seen[float(client.infer("m", [inp]).as_numpy("OUTPUT0")[0, 0])] += 1
            except InferenceServerException as exc:
                failures.append(exc.message())

    threads = [threading.Thread(target=load) for _ in range(2)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(0.5)
        bucket.put_version(2, 2)
        _wait_for(lambda: seen[2.0] > 50)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert failures == []
    assert seen[1.0] > 0
    assert seen[2.0] > 50
    # The store holds complete versions only, and the index shows the one serving.
    store_versions = list((tmp_path / "store" / "models").glob("*/m/*"))
    assert sorted(p.name for p in store_versions if p.is_dir()) == ["1", "2"]
    assert not list((tmp_path / "store" / "models").rglob("*.part"))
    ready = [e for e in _index(proc.http_url) if e["state"] == "READY"]
    assert [(e["name"], e["version"]) for e in ready] == [("m", "2")]
    assert _metric(proc, "edge_repository_source_up") == 1.0
    assert _metric(proc, "edge_repository_download_bytes_total") > 0


def test_idle_poll_costs_one_listing_and_downloads_nothing(
    start_server, s3: S3Server, tmp_path: Path
) -> None:
    bucket = Bucket(s3)
    bucket.put("m/config.pbtxt", CONFIG.encode())
    bucket.put_version(1, 1, manifest=False, padding=100_000)  # taken once its listing settles
    bucket.put("m/1/notes.txt", b"first notes")
    proc = _start(start_server, bucket, s3, tmp_path / "store", *POLL)
    _wait_for(lambda: _added(proc.http_url) == 1.0)
    downloaded = _metric(proc, "edge_repository_download_bytes_total")
    requests = _metric(proc, "edge_repository_requests_total")
    time.sleep(1.5)  # about five polls
    idle_requests = _metric(proc, "edge_repository_requests_total") - requests
    assert _metric(proc, "edge_repository_download_bytes_total") == downloaded
    assert 2 <= idle_requests <= 8  # about one listing per poll, and no download
    # A changed file is the only one fetched again; the big model file is not.
    bucket.put("m/1/notes.txt", b"second notes, longer")
    _wait_for(
        lambda: (
            (tmp_path / "store" / "models").glob("*/m/1/notes.txt").__next__().read_bytes()
            == b"second notes, longer"
        )
    )
    assert _metric(proc, "edge_repository_download_bytes_total") - downloaded == len(
        b"second notes, longer"
    )


def test_partial_or_wrong_upload_is_never_loaded_and_is_taken_once_complete(
    start_server, s3: S3Server, tmp_path: Path
) -> None:
    bucket = Bucket(s3)
    bucket.seed()
    proc = _start(start_server, bucket, s3, tmp_path / "store", *POLL, "--require-manifest")
    files = bucket.put_version(2, 2, manifest=False)  # the manifest has not arrived yet

    def v2_reason() -> str:
        rows = [e for e in _index(proc.http_url) if e.get("version") == "2"]
        return str(rows[0].get("reason", "")) if rows else ""

    _wait_for(lambda: "waiting for SHA256SUMS" in v2_reason())
    assert _added(proc.http_url) == 1.0
    bucket.put("m/2/SHA256SUMS", _manifest({"model.onnx": b"something else"}))
    _wait_for(lambda: "does not match its sha256" in v2_reason())
    assert _added(proc.http_url) == 1.0
    assert not (next((tmp_path / "store" / "models").glob("*/m")) / "2").exists()
    bucket.put("m/2/SHA256SUMS", _manifest(files))  # the upload completes
    _wait_for(lambda: _added(proc.http_url) == 2.0)
    assert v2_reason() == ""


def test_corrupt_model_in_a_new_version_keeps_the_old_one_serving(
    start_server, s3: S3Server, tmp_path: Path
) -> None:
    bucket = Bucket(s3)
    bucket.seed()
    proc = _start(start_server, bucket, s3, tmp_path / "store", *POLL)
    bucket.put_version(2, None)  # a manifest that matches a file that is not a model

    def failed() -> bool:
        rows = {e.get("version"): e for e in _index(proc.http_url)}
        return rows.get("2", {}).get("state") == "UNAVAILABLE" and bool(rows["2"].get("reason"))

    _wait_for(failed)
    assert _added(proc.http_url) == 1.0
    assert _metric(proc, 'edge_model_load_total{model="m",result="failure"}') >= 1
    bucket.put("m/config.pbtxt", b"max_batch_size: [not a config")
    time.sleep(1.5)
    assert _added(proc.http_url) == 1.0
    bucket.put("m/config.pbtxt", CONFIG.encode())
    bucket.put_version(3, 3)
    _wait_for(lambda: _added(proc.http_url) == 3.0)


def test_download_killed_half_way_resumes_after_restart(
    start_server, s3: S3Server, tmp_path: Path
) -> None:
    bucket = Bucket(s3)
    bucket.put("m/config.pbtxt", CONFIG.encode())
    size = 6 * 1024 * 1024
    model_size = len(bucket.put_version(1, 5, padding=size)["model.onnx"])
    store = tmp_path / "store"
    # 16 Mbit/s: the 6 MiB file takes about 3 s, long enough to kill the server half way.
    proc = _start(
        start_server, bucket, s3, store, *POLL, "--model-download-limit-mbps=16", wait=False
    )
    deadline = time.monotonic() + 30
    while True:
        parts = list((store / "staging").rglob("model.onnx.part"))
        if parts and parts[0].stat().st_size > size // 4:
            break
        assert time.monotonic() < deadline, proc.log()
        time.sleep(0.02)
    proc.proc.send_signal(signal.SIGKILL)
    proc.proc.wait()
    fetched_before = parts[0].stat().st_size
    assert fetched_before < size
    assert not list((store / "models").rglob("model.onnx"))  # no torn file is served
    again = _start(start_server, bucket, s3, store, *POLL)
    assert _added(again.http_url) == 5.0
    resumed = _metric(again, "edge_repository_download_bytes_total")
    assert resumed <= model_size - fetched_before + 1024  # only the rest was fetched
    assert not list(store.rglob("*.part"))


def test_restart_with_the_bucket_unreachable_serves_from_the_cache_and_catches_up(
    start_server, s3: S3Server, tmp_path: Path
) -> None:
    proxy = TcpProxy(s3.host_port)
    bucket = Bucket(s3, endpoint=proxy.address)
    bucket.seed()
    store = tmp_path / "store"
    first = _start(start_server, bucket, s3, store, *POLL)
    assert _added(first.http_url) == 1.0
    first.stop()
    proxy.stop()  # the network goes away
    try:
        proc = _start(start_server, bucket, s3, store, *POLL, "--repository-sync-wait-secs=0")
        assert _added(proc.http_url) == 1.0
        _wait_for(lambda: "unreachable" in proc.log())
        assert _metric(proc, "edge_repository_source_up") == 0.0
        bucket.put_version(2, 2)
        time.sleep(1.0)
        assert _added(proc.http_url) == 1.0
        proxy.start()  # and comes back
        _wait_for(lambda: _added(proc.http_url) == 2.0)  # switched in as soon as it arrived
        _wait_for(lambda: _metric(proc, "edge_repository_source_up") == 1.0)  # the sync ends
    finally:
        proxy.stop()


async def test_disk_reserve_stops_a_download_with_a_clear_reason(
    s3: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store on a 64 MiB disk of its own, 16 MiB of it reserved: version 1 fits, a 128 MiB
    version 2 does not, and the reason says so. The disk is an injected free-space reader
    (capacity minus what the store holds), so the machine's free disk, which other processes
    change, plays no part. The reason reaches the repository index as every pending reason
    does (see the SHA256SUMS test above)."""
    from appliance.repository.manifest import NO_MANIFEST_RULES
    from appliance.repository.s3 import S3Source

    for key, value in s3.env().items():
        monkeypatch.setenv(key, value)
    bucket = Bucket(s3)
    bucket.seed()
    store = tmp_path / "store"
    capacity, mib = 64 * 1024 * 1024, 1024 * 1024
    asked: list[Path] = []

    def free_bytes(folder: Path) -> int:
        asked.append(folder)
        return capacity - sum(p.stat().st_size for p in store.rglob("*") if p.is_file())

    source = S3Source(bucket.url, store, 16 * mib, NO_MANIFEST_RULES, free_bytes=free_bytes)
    async with source.opened():
        assert await source.sync() == {"m"}
        assert (source.root / "m" / "1" / "model.onnx").is_file()
        bucket.put_version(2, 2, padding=128 * mib)
        assert await source.sync() == set()
    reason = source.pending[("m", 2)]
    assert reason.startswith("not enough disk for model 'm' version 2: needs 128.")
    assert "MiB free in" in reason
    assert "16.0 MiB must stay free (--model-store-reserve-mb)" in reason
    assert asked == [store, store]  # the reader is asked about the store's own folder
    assert not (source.root / "m" / "2").exists()
    assert not list(store.rglob("*.part"))


def test_explicit_mode_loads_and_unloads_models_from_s3(
    start_server, s3: S3Server, tmp_path: Path
) -> None:
    bucket = Bucket(s3)
    proc = _start(start_server, bucket, s3, tmp_path / "store", "--model-control-mode=explicit")
    bucket.put("m/config.pbtxt", CONFIG.encode())
    bucket.put_version(1, 7)
    client = grpcclient.InferenceServerClient(proc.grpc_url)
    assert not client.is_model_ready("m")
    client.load_model("m")
    assert client.is_model_ready("m")
    assert _added(proc.http_url) == 7.0
    bucket.put_version(2, 8)
    client.load_model("m")  # a load request fetches what changed first
    assert _added(proc.http_url) == 8.0
    client.unload_model("m")
    assert not client.is_model_ready("m")


def test_signed_manifests_are_verified_before_anything_loads(
    start_server, s3: S3Server, tmp_path: Path
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
    bucket = Bucket(s3)
    bucket.put_model_files({"config.pbtxt": CONFIG.encode()}, key)
    files = bucket.put_version(1, 1)
    bucket.put("m/1/SHA256SUMS.sig", key.sign(files["SHA256SUMS"]))
    proc = _start(
        start_server, bucket, s3, tmp_path / "store", *POLL, f"--manifest-public-key={public}"
    )
    assert _added(proc.http_url) == 1.0
    files = bucket.put_version(2, 2)
    bucket.put("m/2/SHA256SUMS.sig", Ed25519PrivateKey.generate().sign(files["SHA256SUMS"]))

    def v2_reason() -> str:
        rows = [e for e in _index(proc.http_url) if e.get("version") == "2"]
        return str(rows[0].get("reason", "")) if rows else ""

    _wait_for(lambda: "does not verify" in v2_reason())
    assert _added(proc.http_url) == 1.0
    bucket.put("m/2/SHA256SUMS.sig", key.sign(files["SHA256SUMS"]))
    _wait_for(lambda: _added(proc.http_url) == 2.0)


def test_signed_mode_takes_no_unsigned_model_level_file_from_the_bucket(
    start_server, s3: S3Server, tmp_path: Path
) -> None:
    # Issue 31 item 1: bucket write without the key: an unsigned config naming a file outside
    # the signed version folder, and that file. Neither is taken; the signed version serves.
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    public = tmp_path / "release.pub"
    public.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    bucket = Bucket(s3)
    bucket.put_model_files({"config.pbtxt": CONFIG.encode()}, key)
    files = bucket.put_version(1, 1)
    bucket.put("m/1/SHA256SUMS.sig", key.sign(files["SHA256SUMS"]))
    store = tmp_path / "store"
    proc = _start(start_server, bucket, s3, store, *POLL, f"--manifest-public-key={public}")
    assert _added(proc.http_url) == 1.0
    bucket.put("m/evil.onnx", _model_bytes(9))
    bucket.put("m/config.pbtxt", (CONFIG + 'default_model_filename: "../evil.onnx"\n').encode())
    _wait_for(lambda: "model-level files not taken" in proc.log())
    assert "model-level files not in the signed SHA256SUMS: evil.onnx" in proc.log()
    assert _added(proc.http_url) == 1.0
    assert not list(store.glob("models/*/m/evil.onnx"))
    assert proc.log().count("model-level files not taken") == 1  # not fetched at every poll


@pytest.mark.parametrize("manifest", [False, True])
def test_a_flipped_byte_in_the_store_is_found_at_load_and_fetched_again(
    start_server, s3: S3Server, tmp_path: Path, manifest: bool
) -> None:
    # Issue 31 item 5: without a manifest the damaged version served wrong answers as READY;
    # with one, the model went down (the version below was not tried) and the damaged version
    # was never fetched again. Now each file's sha256 is in the store's record, checked at
    # load: the version below serves within the same load and the damaged one is re-fetched.
    bucket = Bucket(s3)
    bucket.put("m/config.pbtxt", CONFIG.encode())
    bucket.put_version(1, 1, manifest=manifest)
    bucket.put_version(2, 2, manifest=manifest)
    store = tmp_path / "store"
    proc = _start(start_server, bucket, s3, store, *POLL)
    _wait_for(lambda: _added(proc.http_url) == 2.0)
    proc.stop()
    (stored,) = store.glob("models/*/m/2/model.onnx")
    data = bytearray(stored.read_bytes())
    two = np.float32(2.0).tobytes()
    assert data.count(two) == 1
    data[data.index(two) + 2] ^= 0x80  # one bit of one byte: the constant 2.0 becomes 4.0
    stored.write_bytes(bytes(data))

    again = _start(start_server, bucket, s3, store, *POLL)
    _wait_for(lambda: "model 'm' version 2 is READY" in again.log())
    log = again.log()
    assert "version 2 is damaged in the store: 'model.onnx' no longer matches" in log
    # The same load served version 1 before the sync fetched version 2 again.
    assert log.index("model 'm' version 1 is READY") < log.index("model 'm' version 2 is READY")
    assert _added(again.http_url) == 2.0
    assert stored.read_bytes() == bucket_bytes(bucket, "m/2/model.onnx")


def bucket_bytes(bucket: Bucket, key: str) -> bytes:
    body = bucket.client.get_object(Bucket=bucket.name, Key=f"models/{key}")["Body"]
    return bytes(body.read())


def test_s3_repository_merges_with_a_local_one_and_removed_models_unload(
    start_server, s3: S3Server, tmp_path: Path
) -> None:
    local = tmp_path / "local"
    (local / "here" / "1").mkdir(parents=True)
    (local / "here" / "config.pbtxt").write_text(CONFIG.replace('"m"', '"here"'))
    (local / "here" / "1" / "model.onnx").write_bytes(_model_bytes(4))
    bucket = Bucket(s3)
    bucket.seed()
    proc = start_server(
        [local, bucket.url],
        f"--model-store-dir={tmp_path / 'store'}",
        "--repository-sync-wait-secs=60",
        *POLL,
        env=s3.env(),
    )
    assert _added(proc.http_url, "here") == 4.0
    assert _added(proc.http_url) == 1.0
    for key in ("m/config.pbtxt", "m/1/model.onnx", "m/1/SHA256SUMS"):
        bucket.delete(key)
    _wait_for(lambda: not httpclient.InferenceServerClient(proc.http_url).is_model_ready("m"))
    assert _added(proc.http_url, "here") == 4.0
    assert not list((tmp_path / "store" / "models").glob("*/m"))


def test_add_model_helper_builds_a_loadable_model() -> None:
    # The padding initializer must not change what the model computes.
    import onnxruntime as ort

    session = ort.InferenceSession(
        _model_bytes(3, padding=1000), providers=["CPUExecutionProvider"]
    )
    out = session.run(None, {"INPUT0": np.zeros((1, 4), np.float32)})[0]
    assert out.tolist() == [[3.0] * 4]


async def test_one_bad_object_or_model_never_stops_the_sync(
    s3: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 31 item 2: each of these made every sync of the source fail (rollbacks and
    removals included); now each is left out and reported, and the rest syncs."""
    from appliance.repository.fleet_agent import FleetAgent
    from appliance.repository.manifest import NO_MANIFEST_RULES
    from appliance.repository.rollout import DeviceIdentity
    from appliance.repository.s3 import S3Source

    for key, value in s3.env().items():
        monkeypatch.setenv(key, value)
    bucket = Bucket(s3)
    bucket.seed()
    bucket.put_version(2, 2)
    bucket.put("m/\u00b2/model.onnx", b"isdigit() and no int()")
    bucket.put("m/2", b"a file where version 2's folder is")
    bucket.put_version(3, 3)
    bucket.put("m/3/model.onnx/x", b"version 3's model file is also a folder")
    long_name = "n" * 300
    bucket.put(f"{long_name}/1/model.onnx", b"a name no file system holds")
    bucket.put("r/config.pbtxt", CONFIG.encode())
    bucket.put_version(1, 1, model="r")
    bucket.put("r/rollout.json", b"[" * 30_000 + b"]" * 30_000)  # RecursionError in json
    bucket.put("ok/config.pbtxt", CONFIG.encode())
    bucket.put_version(1, 4, model="ok")
    store = tmp_path / "store"
    source = S3Source(bucket.url, store, 0, NO_MANIFEST_RULES)
    FleetAgent(source, DeviceIdentity("dev-1"), 0, False)

    def versions(model: str) -> list[str]:
        folder = source.root / model
        return sorted(p.name for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []

    async with source.opened():
        assert await source.sync() == {"m", "ok", "r"}
        assert source.reachable is True
        assert versions("m") == ["1", "2"]
        assert versions("ok") == ["1"]
        assert versions("r") == []  # its first document cannot be read: nothing new taken
        assert source.pending[("m", 3)] == "not synced: 'model.onnx' is both a file and a folder"
        assert source.pending[(long_name, 1)].startswith(
            "not synced: model skipped: its name is 300 bytes, more than the 200"
        )
        assert sorted(source.skipped) == ["models/m/2", "models/m/\u00b2/model.onnx"]
        # A version deleted from the bucket still leaves the store (the sync runs on).
        for name in ("model.onnx", "SHA256SUMS"):
            bucket.delete(f"m/1/{name}")
        assert await source.sync() == {"m"}
        assert versions("m") == ["2"]
        # Fixed in the bucket: version 3 is fetched.
        bucket.delete("m/3/model.onnx/x")
        assert await source.sync() == {"m"}
        assert versions("m") == ["2", "3"]
        assert ("m", 3) not in source.pending


def test_a_failing_remote_source_and_bad_local_entries_leave_local_models_polled(
    start_server, s3: S3Server, tmp_path: Path
) -> None:
    """Issue 31: in poll mode a source whose every sync failed stopped the rescans of the
    local folders too; a bad entry in a local folder must not stop the others either."""
    local = tmp_path / "local"
    (local / "here" / "1").mkdir(parents=True)
    (local / "here" / "config.pbtxt").write_text(CONFIG.replace('"m"', '"here"'))
    (local / "here" / "1" / "model.onnx").write_bytes(_model_bytes(4))
    (local / "here" / "\u00b2").mkdir()  # '²': not a version
    (local / "here" / "3").write_text("a file where a version folder would be")
    (local / ("x" * 240)).mkdir()  # longer than a model name may be
    bucket = Bucket(s3)
    bucket.seed()
    bucket.put("m/\u00b2/model.onnx", b"made every sync of the old code fail")
    proc = start_server(
        [local, bucket.url],
        f"--model-store-dir={tmp_path / 'store'}",
        "--repository-sync-wait-secs=60",
        *POLL,
        env=s3.env(),
    )
    assert _added(proc.http_url, "here") == 4.0
    assert _added(proc.http_url) == 1.0
    staging = tmp_path / "new"
    (staging / "1").mkdir(parents=True)
    (staging / "config.pbtxt").write_text(CONFIG.replace('"m"', '"new"'))
    (staging / "1" / "model.onnx").write_bytes(_model_bytes(6))
    staging.rename(local / "new")  # a local model arrives while the server polls
    _wait_for(lambda: _added(proc.http_url, "new") == 6.0)
    assert "is not a version folder" in proc.log()


async def test_a_model_whose_store_folder_cannot_be_written_fails_alone(
    s3: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 31 item 2: an OSError of one model's folder failed the whole sync and marked the
    source unreachable; now that model alone waits, reported, and the others sync."""
    from appliance.repository.manifest import NO_MANIFEST_RULES
    from appliance.repository.s3 import S3Source

    for key, value in s3.env().items():
        monkeypatch.setenv(key, value)
    bucket = Bucket(s3)
    for model in ("a", "blocked", "z"):
        bucket.put(f"{model}/config.pbtxt", CONFIG.encode())
        bucket.put_version(1, 1, model=model)
    source = S3Source(bucket.url, tmp_path / "store", 0, NO_MANIFEST_RULES)
    async with source.opened():
        (source.root / "blocked").write_text("a file where the model's folder goes")
        assert await source.sync() == {"a", "z"}
        assert source.reachable is True
        why = source.skipped["models/blocked/"]
        assert why.startswith("model not synced: ")
        assert (source.root / "a" / "1" / "model.onnx").is_file()
        assert (source.root / "z" / "1" / "model.onnx").is_file()
        (source.root / "blocked").unlink()
        assert await source.sync() == {"blocked"}
        assert "models/blocked/" not in source.skipped
