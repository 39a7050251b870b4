"""Models from an OCI registry (Debian's docker-registry on loopback): pushed with
`edge-appliance oci push`, pulled into the verified store, switched, refused, resumed.

Each test gets its own repository in one registry of the module.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient

from appliance.fleet.oci_push import push
from tests.integration.test_s3_repository import (
    CONFIG,
    _added,
    _index,
    _metric,
    _model_bytes,
    _wait_for,
)
from tests.ociregistry import OciRegistry, registry_binary
from tests.serverproc import ROOT
from tests.tcpproxy import TcpProxy

POLL = ("--model-control-mode=poll", "--repository-poll-secs=0.3")


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OciRegistry]:
    if registry_binary() is None:
        pytest.skip("no docker-registry binary (apt-get install docker-registry)")
    server = OciRegistry(tmp_path_factory.mktemp("registry"))
    try:
        yield server
    finally:
        server.stop()


def _repository() -> str:
    return f"t{uuid.uuid4().hex[:10]}/models"


def _model_folder(root: Path, versions: dict[int, int], padding: int = 0) -> Path:
    """Model m: its config and a version adding `value` for each (version, value)."""
    folder = root / "m"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.pbtxt").write_text(CONFIG)
    for version, value in versions.items():
        (folder / str(version)).mkdir(exist_ok=True)
        (folder / str(version) / "model.onnx").write_bytes(_model_bytes(value, padding))
    return folder


def _push(
    url: str, *folders: Path, env: dict[str, str] | None = None, cli: bool = False, ok: bool = True
) -> str:
    """`edge-appliance oci push` (a process of its own with `env` or `cli`, else called here:
    a second a push less); its output, or its error when not `ok`."""
    if env is None and not cli:
        return "\n".join(asyncio.run(push(list(folders), url)))
    done = subprocess.run(
        [sys.executable, "-m", "appliance", "oci", "push", *map(str, folders), url],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        check=False,
        env=dict(os.environ, **(env or {})),
    )
    assert (done.returncode == 0) is ok, done.stderr
    return done.stdout if ok else done.stderr


def _pinned(registry: OciRegistry, repository: str, version: int) -> dict[str, str]:
    """The layers (path -> digest) of the version the registry's index pins."""
    base = f"http://{registry.host_port}/v2/{repository}"
    accept = {"Accept": "application/vnd.oci.image.manifest.v1+json"}

    def get(path: str) -> bytes:
        request = urllib.request.Request(f"{base}/{path}", headers=accept)
        with urllib.request.urlopen(request, timeout=10) as response:
            return bytes(response.read())

    index = json.loads(get("manifests/index"))
    document = json.loads(get(f"blobs/{index['config']['digest']}"))
    digest = document["models"]["m"]["versions"][str(version)]["digest"]
    manifest = json.loads(get(f"manifests/{digest}"))
    return {
        layer["annotations"]["org.opencontainers.image.title"]: layer["digest"]
        for layer in manifest["layers"]
    }


def _start(start_server, url: str, store: Path, *flags: str, wait: bool = True):  # type: ignore[no-untyped-def]
    if not any(flag.startswith("--repository-sync-wait-secs") for flag in flags):
        flags = ("--repository-sync-wait-secs=60", *flags)
    return start_server(url, f"--model-store-dir={store}", *flags, wait=wait)


def _ready(url: str) -> list[tuple[str, str]]:
    return [(e["name"], e["version"]) for e in _index(url) if e["state"] == "READY"]


def _reason(url: str, version: str) -> str:
    rows = [e for e in _index(url) if e.get("version") == version]
    return str(rows[0].get("reason", "")) if rows else ""


def test_a_pushed_model_serves_and_a_new_version_switches_in_with_only_its_layers(
    start_server, registry: OciRegistry, tmp_path: Path
) -> None:
    repository = _repository()
    url = registry.url(repository)
    folder = _model_folder(tmp_path / "src", {1: 1}, padding=200_000)
    (folder / "1" / "notes.txt").write_text("first notes")
    out = _push(url, folder, cli=True)
    assert "model 'm' version 1: 2 files, sha256:" in out
    store = tmp_path / "store"
    proc = _start(start_server, url, store, *POLL)
    assert _added(proc.http_url) == 1.0
    requests = _metric(proc, "edge_repository_requests_total")
    time.sleep(1.0)  # about three idle polls
    idle = _metric(proc, "edge_repository_requests_total") - requests
    assert 1 <= idle <= 6  # one index read per poll, nothing else
    # Version 2: the same weights (one layer digest), new notes.
    (folder / "2").mkdir()
    (folder / "2" / "model.onnx").write_bytes((folder / "1" / "model.onnx").read_bytes())
    (folder / "2" / "notes.txt").write_text("second notes")
    before = _metric(proc, "edge_repository_download_bytes_total")
    _push(url, folder)
    layers = _pinned(registry, repository, 2)
    _wait_for(lambda: _ready(proc.http_url) == [("m", "2")])
    assert _added(proc.http_url) == 1.0  # version 2 is the same model: a switch, same answer
    assert registry.blob_gets(repository, layers["model.onnx"]) == 1  # fetched for version 1 only
    assert registry.blob_gets(repository, layers["notes.txt"]) == 1
    fetched = _metric(proc, "edge_repository_download_bytes_total") - before
    index_doc = 4096  # the new index document, a few hundred bytes
    assert len("second notes") <= fetched <= len("second notes") + index_doc
    stored = sorted(p.name for p in next((store / "models").glob("*/m")).iterdir() if p.is_dir())
    assert stored == ["1", "2"]
    assert not list(store.rglob("*.part"))
    assert _metric(proc, "edge_repository_source_up") == 1.0
    with urllib.request.urlopen(f"http://{proc.http_url}/status.json", timeout=10) as resp:
        sources = json.loads(resp.read())["updates"]["sources"]
    assert [(s["url"], s["reachable"], s["pending"]) for s in sources] == [(url, True, [])]


@pytest.mark.parametrize("tampered", ["layer", "manifest", "longer"])
def test_a_registry_serving_other_content_for_a_digest_is_refused_and_last_good_serves(
    start_server, registry: OciRegistry, tmp_path: Path, tampered: str
) -> None:
    repository = _repository()
    url = registry.url(repository)
    folder = _model_folder(tmp_path / "src", {1: 1})
    # Random padding: blobs are shared by every repository of the registry, and this one's
    # are about to be damaged.
    _model_folder(tmp_path / "src", {2: 2}, padding=64)
    _push(url, folder)
    store = tmp_path / "store"
    # The registry's disk (or whoever answers for it) changes version 2's bytes, same length.
    if tampered in ("layer", "longer"):
        blob = registry.blob_file(_pinned(registry, repository, 2)["model.onnx"])
    else:
        index = json.loads(registry.blob_file(_index_digest(registry, repository)).read_bytes())
        document = json.loads(registry.blob_file(index["config"]["digest"]).read_bytes())
        blob = registry.blob_file(document["models"]["m"]["versions"]["2"]["digest"])
    data = bytearray(blob.read_bytes())
    if tampered == "longer":  # endless data: more than the manifest's size for it
        data += b"\0" * (1 << 20)
    else:
        data[len(data) // 2] ^= 0x01
    blob.write_bytes(bytes(data))

    proc = _start(start_server, url, store, *POLL)
    why = {
        "layer": "with other content",
        "manifest": "is not the sha256:",
        "longer": "bytes its manifest gives",
    }[tampered]
    _wait_for(lambda: why in _reason(proc.http_url, "2"))
    assert _reason(proc.http_url, "2").startswith("not fetched: rejected: ")
    assert _added(proc.http_url) == 1.0
    assert not next((store / "models").glob("*/m")).joinpath("2").exists()
    assert not list(store.rglob("*.part"))
    log = proc.log()
    time.sleep(1.0)  # polls go on; the refused content is not fetched again
    assert proc.log().count("version 2 not fetched") == log.count("version 2 not fetched") == 1


def test_a_tag_moved_to_other_content_changes_nothing_on_the_device(
    start_server, registry: OciRegistry, tmp_path: Path
) -> None:
    """A device follows the digests the index pins, never a tag: `m.1` re-pointed at other
    weights (a registry write without the index) is not served."""
    repository = _repository()
    url = registry.url(repository)
    folder = _model_folder(tmp_path / "src", {1: 1})
    _push(url, folder)
    base = f"http://{registry.host_port}/v2/{repository}/manifests"
    accept = {"Accept": "application/vnd.oci.image.manifest.v1+json"}
    with urllib.request.urlopen(urllib.request.Request(f"{base}/index", headers=accept)) as r:
        index = r.read()
    _push(url, _model_folder(tmp_path / "other", {1: 9}))  # tag m.1 -> the 9-adding weights
    put = urllib.request.Request(
        f"{base}/index",
        data=index,
        method="PUT",
        headers={"Content-Type": "application/vnd.oci.image.manifest.v1+json"},
    )
    with urllib.request.urlopen(put) as r:  # the index as it was: pinning the 1-adding ones
        assert r.status == 201
    proc = _start(start_server, url, tmp_path / "store", *POLL)
    assert _added(proc.http_url) == 1.0
    time.sleep(1.0)  # a few polls
    assert _added(proc.http_url) == 1.0


def _index_digest(registry: OciRegistry, repository: str) -> str:
    link = (
        registry.root
        / "docker/registry/v2/repositories"
        / repository
        / "_manifests/tags/index/current/link"
    )
    return link.read_text().strip()


def test_a_download_killed_half_way_resumes_and_a_restart_offline_serves_from_the_store(
    start_server, registry: OciRegistry, tmp_path: Path
) -> None:
    proxy = TcpProxy(registry.host_port)
    repository = _repository()
    url = registry.url(repository, proxy.address)
    size = 6 * 1024 * 1024
    folder = _model_folder(tmp_path / "src", {1: 5}, padding=size)
    model_size = (folder / "1" / "model.onnx").stat().st_size
    _push(registry.url(repository), folder)
    store = tmp_path / "store"
    try:
        # 16 Mbit/s: the 6 MiB layer takes about 3 s, long enough to kill the server half way.
        proc = _start(start_server, url, store, *POLL, "--model-download-limit-mbps=16", wait=False)
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
        assert not list((store / "models").rglob("model.onnx"))  # nothing torn is served
        again = _start(start_server, url, store, *POLL)
        assert _added(again.http_url) == 5.0
        resumed = _metric(again, "edge_repository_download_bytes_total")
        assert resumed <= model_size - fetched_before + 4096  # only the rest, and the index
        again.stop()
        proxy.stop()  # the registry goes away: the store serves
        offline = _start(start_server, url, store, *POLL, "--repository-sync-wait-secs=0")
        assert _added(offline.http_url) == 5.0
        _wait_for(lambda: "unreachable" in offline.log())
        assert _metric(offline, "edge_repository_source_up") == 0.0
    finally:
        proxy.stop()


def test_explicit_mode_loads_from_the_registry(
    start_server, registry: OciRegistry, tmp_path: Path
) -> None:
    repository = _repository()
    url = registry.url(repository)
    folder = _model_folder(tmp_path / "src", {1: 7})
    _push(url, folder)
    proc = _start(start_server, url, tmp_path / "store", "--model-control-mode=explicit")
    client = grpcclient.InferenceServerClient(proc.grpc_url)
    assert not client.is_model_ready("m")
    client.load_model("m")
    assert _added(proc.http_url) == 7.0
    _model_folder(tmp_path / "src", {2: 8})
    _push(url, folder)
    client.load_model("m")  # a load request fetches what changed first
    assert _added(proc.http_url) == 8.0


def test_a_registry_over_https_with_its_own_ca(start_server, tmp_path: Path) -> None:
    """oci+https:// (and oci:// to a host that is not loopback) is TLS, verified against the
    system's roots or SSL_CERT_FILE; a registry whose certificate is not trusted is refused
    (shown with a push: the same calls as the device's sync)."""
    from tests.pki import self_signed

    if registry_binary() is None:
        pytest.skip("no docker-registry binary (apt-get install docker-registry)")
    cert, key = self_signed(tmp_path, "registry")
    (tmp_path / "tls-registry").mkdir()
    server = OciRegistry(tmp_path / "tls-registry", tls=(cert, key))
    try:
        url = f"oci+https://{server.host_port}/fleet/models"
        trust = {"SSL_CERT_FILE": str(cert)}
        folder = _model_folder(tmp_path / "src", {1: 3})
        _push(url, folder, env=trust)
        proc = start_server(
            url,
            f"--model-store-dir={tmp_path / 'store'}",
            "--repository-sync-wait-secs=60",
            env=trust,
        )
        assert _added(proc.http_url) == 3.0
        # Without the CA (the device's sync makes the same calls): refused, nothing sent.
        untrusting = _push(url, folder, env={"SSL_CERT_FILE": os.devnull}, ok=False)
        assert "cannot reach the registry" in untrusting
        assert "CERTIFICATE_VERIFY_FAILED" in untrusting
    finally:
        server.stop()


def test_a_registry_with_bearer_token_auth(start_server, tmp_path: Path) -> None:
    """The distribution spec's token auth (Docker Hub, GHCR, Harbor): a 401 with a Bearer
    challenge is answered with a token from its realm, got with EDGE_OCI_USERNAME /
    EDGE_OCI_PASSWORD; wrong credentials are refused (shown with a push: the same calls)."""
    from tests.ociregistry import TokenService

    if registry_binary() is None:
        pytest.skip("no docker-registry binary (apt-get install docker-registry)")
    tokens = TokenService(tmp_path, "device", "s3cret")
    (tmp_path / "auth-registry").mkdir()
    server = OciRegistry(tmp_path / "auth-registry", token=tokens.config())
    try:
        url = server.url("fleet/models")
        good = {"EDGE_OCI_USERNAME": "device", "EDGE_OCI_PASSWORD": "s3cret"}
        _push(url, _model_folder(tmp_path / "src", {1: 4}), env=good)
        proc = start_server(
            url,
            f"--model-store-dir={tmp_path / 'store'}",
            "--repository-sync-wait-secs=60",
            env=good,
        )
        assert _added(proc.http_url) == 4.0
        assert tokens.tokens >= 2  # the pusher's and the device's
        wrong = {"EDGE_OCI_USERNAME": "device", "EDGE_OCI_PASSWORD": "guess"}
        folder = _model_folder(tmp_path / "src", {2: 5})
        assert "the token service refused (401)" in _push(url, folder, env=wrong, ok=False)
    finally:
        server.stop()
        tokens.stop()


def test_an_openssf_signed_model_travels_through_the_registry(
    start_server, registry: OciRegistry, tmp_path: Path
) -> None:
    """model.sig is a layer like any file; the store's record beside the files needs no
    signature, a version signed by another key is refused."""
    model_signing = pytest.importorskip("model_signing", reason="model-signing not installed")
    from tests.integration.test_model_signature import _keys

    private, public = _keys(tmp_path)
    (tmp_path / "other-key").mkdir()
    other, _ = _keys(tmp_path / "other-key")
    repository = _repository()
    url = registry.url(repository)
    folder = _model_folder(tmp_path / "src", {1: 1, 2: 2})
    (folder / "config.pbtxt").write_text(CONFIG + "version_policy: { all: {} }\n")
    for version, key in ((1, private), (2, other)):
        signer = model_signing.signing.Config().use_elliptic_key_signer(private_key=key)
        signer.sign(folder / str(version), tmp_path / "model.sig")
        (tmp_path / "model.sig").rename(folder / str(version) / "model.sig")
    _push(url, folder)
    proc = _start(start_server, url, tmp_path / "store", *POLL, f"--model-signature=key:{public}")
    assert _added(proc.http_url) == 1.0
    assert _reason(proc.http_url, "2").startswith("model.sig does not verify (key): ")
    (stored,) = (tmp_path / "store").glob("models/*/m/1")
    assert sorted(p.name for p in stored.iterdir()) == [
        ".edge-sync.json",
        "model.onnx",
        "model.sig",
    ]


async def test_a_blob_missing_from_the_registry_waits_and_is_never_recorded_as_rejected(
    registry: OciRegistry, tmp_path: Path
) -> None:
    """A pinned blob the registry lost (garbage collection, a restore) is not bad content:
    the version waits with its reason, nothing goes into the ledger, and it is fetched once
    the blob is back."""
    from appliance.repository.manifest import NO_MANIFEST_RULES
    from appliance.repository.oci import OciSource

    repository = _repository()
    url = registry.url(repository)
    folder = _model_folder(tmp_path / "src", {1: 1})
    _model_folder(tmp_path / "src", {2: 2}, padding=64)  # a blob of its own, to take away
    await push([folder], url)
    blob = registry.blob_file(_pinned(registry, repository, 2)["model.onnx"])
    data = blob.read_bytes()
    blob.unlink()
    source = OciSource(url, tmp_path / "store", 0, NO_MANIFEST_RULES)
    async with source.opened():
        assert await source.sync() == {"m"}
        assert source.reachable is True
        assert source.pending[("m", 2)].endswith("is not in the registry")
        assert not source.ledger.entry(source.root / "m").failed
        assert not (source.root / "m" / "2").exists()
        blob.write_bytes(data)
        assert await source.sync() == {"m"}
        assert (source.root / "m" / "2" / "model.onnx").read_bytes() == data
        assert ("m", 2) not in source.pending
