"""The systemd install restricts the repository API by default (issue 17, item 12): with
--model-control-mode explicit a load request's `file:` overrides can bring a Python model, code
the server runs as its user, so whoever may load models may run code. install.sh writes a random
key into the installed settings file; the server reads it from its environment (which other
users cannot read), not from its command line (which they can)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import pytest

from appliance.common.protocol import service_pb2 as pb
from appliance.common.protocol import service_pb2_grpc
from configs.generate import SIMPLE_CONFIG, save, simple_model
from tests.serverproc import ROOT, ServerProcess

SYSTEMD = ROOT / "systemd"
VARIABLES = ("EDGE_APPLIANCE_HTTP_RESTRICTED_API", "EDGE_APPLIANCE_GRPC_RESTRICTED_PROTOCOL")


def _install(root: Path, tmp_path: Path) -> Path:
    """install.sh into `root` with a stub build; the installed settings file."""
    dist = tmp_path / "dist"
    (dist / "_internal").mkdir(parents=True, exist_ok=True)
    (dist / "edge-appliance").write_text("#!/bin/sh\n")
    (dist / "edge-appliance").chmod(0o755)
    result = subprocess.run(
        ["bash", str(SYSTEMD / "install.sh"), "--root", str(root), "--dist", str(dist)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={k: v for k, v in os.environ.items() if k != "DESTDIR"},
    )
    assert result.returncode == 0, result.stderr
    return root / "etc/edge-appliance/edge-appliance.env"


def _environment(settings: Path) -> dict[str, str]:
    """VAR=value lines as systemd's EnvironmentFile= reads these (no quoting used)."""
    pairs = {}
    for line in settings.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, _, value = line.partition("=")
            pairs[name.strip()] = value
    return pairs


def _key(environment: dict[str, str]) -> str:
    keys = {environment[name].rpartition("model-repository:admin-key=")[2] for name in VARIABLES}
    assert len(keys) == 1, environment
    return keys.pop()


def test_install_writes_a_random_key_for_the_repository_api(tmp_path: Path) -> None:
    first = _install(tmp_path / "one", tmp_path)
    second = _install(tmp_path / "two", tmp_path)
    key = _key(_environment(first))
    assert re.fullmatch(r"[0-9a-f]{48}", key)
    assert _key(_environment(second)) != key  # one per device, never a shared default
    assert first.stat().st_mode & 0o777 == 0o600
    assert _install(tmp_path / "one", tmp_path) == first  # an upgrade keeps it
    assert _key(_environment(first)) == key


def test_the_example_settings_without_a_key_do_not_start(start_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Copied by hand, not through install.sh: an empty key is refused, never an open API."""
    environment = _environment(SYSTEMD / "edge-appliance.env.example")
    (tmp_path / "models").mkdir()
    proc = start_server(
        tmp_path / "models", wait=False, env={name: environment[name] for name in VARIABLES}
    )
    assert proc.proc.wait(60) != 0
    assert "$EDGE_APPLIANCE_HTTP_RESTRICTED_API" in proc.log()
    assert "the value of header 'admin-key' is empty" in proc.log()


def _index_status(proc: ServerProcess, headers: dict[str, str]) -> int:
    request = urllib.request.Request(
        f"http://{proc.http_url}/v2/repository/index", data=b"{}", headers=headers
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_the_installed_settings_restrict_the_repository_api(start_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    environment = _environment(_install(tmp_path / "root", tmp_path))
    key = _key(environment)
    models = tmp_path / "models"
    save(simple_model(), models / "simple" / "1" / "model.onnx")
    (models / "simple" / "config.pbtxt").write_text(SIMPLE_CONFIG)
    # As the unit runs it: EDGE_APPLIANCE_ARGS on the command line, the rest in the environment.
    proc = start_server(
        models,
        *shlex.split(environment["EDGE_APPLIANCE_ARGS"]),
        env={name: environment[name] for name in VARIABLES},
    )
    assert key not in Path(f"/proc/{proc.proc.pid}/cmdline").read_text()

    assert _index_status(proc, {}) == 403
    assert _index_status(proc, {"admin-key": "guess"}) == 403
    assert _index_status(proc, {"admin-key": key}) == 200
    with grpc.insecure_channel(proc.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.RepositoryIndex(pb.RepositoryIndexRequest(), timeout=10)
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
        metadata = (("triton-grpc-protocol-admin-key", key),)
        index = stub.RepositoryIndex(pb.RepositoryIndexRequest(), metadata=metadata, timeout=10)
        assert [model.name for model in index.models] == ["simple"]
        # Everything else stays open, as in tritonserver.
        assert stub.ModelReady(pb.ModelReadyRequest(name="simple"), timeout=10).ready
