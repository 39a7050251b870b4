"""The OCI image (build/oci/): it builds from the one-folder binary, runs under podman with the
example repository on a read-only root file system as its non-root user, serves HTTP and gRPC
(a Python model too), reports healthy, and exits 0 on SIGTERM within the deadline.

Skipped where podman or the binary is absent (CI builds the binary and installs podman first,
.ci/run). The image gets a tag of its own and is removed afterwards."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.serverproc import ROOT, free_port

DIST = Path(os.environ.get("EDGE_OCI_DIST", ROOT / "dist" / "edge-appliance"))
PODMAN = shutil.which("podman")
EXIT_TIMEOUT_S = 10  # --exit-timeout-secs given to the server in the container
UID = "10001"


def _podman_works() -> str:
    """Why podman cannot be used here, or '' when it can."""
    if PODMAN is None:
        return "no podman here (Debian: apt-get install podman runc; .ci/run installs them)"
    probe = subprocess.run([PODMAN, "info"], capture_output=True, text=True, timeout=60)
    if probe.returncode != 0:
        return f"podman info failed: {probe.stderr.strip()[-300:]}"
    return ""


_WHY_NOT = (
    f"no built binary at {DIST} (run build/build.sh, or set EDGE_OCI_DIST)"
    if not (DIST / "edge-appliance").is_file()
    else _podman_works()
)
pytestmark = [
    pytest.mark.skipif(bool(_WHY_NOT), reason=_WHY_NOT or "-"),
    pytest.mark.timeout(300),
]


def podman(
    *args: str, timeout: float = 120, check: bool = True
) -> subprocess.CompletedProcess[str]:
    assert PODMAN is not None
    done = subprocess.run([PODMAN, *args], capture_output=True, text=True, timeout=timeout)
    if check:
        assert done.returncode == 0, f"podman {' '.join(args)}: {done.stdout}{done.stderr}"
    return done


def _run_options() -> list[str]:
    """runc where it is installed (issue 22 reports crun failing on these machines), and limits
    no higher than this process's own: podman's default open-file limit is above the hard limit
    here, and runc then fails to set it ("error setting rlimit type 7")."""
    options = ["--runtime", "runc"] if shutil.which("runc") else []
    for name, limit, cap in (
        ("nofile", resource.RLIMIT_NOFILE, 65536),
        ("nproc", resource.RLIMIT_NPROC, 4096),
    ):
        hard = resource.getrlimit(limit)[1]
        value = cap if hard == resource.RLIM_INFINITY else min(hard, cap)
        options += ["--ulimit", f"{name}={value}:{value}"]
    return options


@pytest.fixture(scope="module")
def image() -> Iterator[str]:
    tag = f"localhost/edge-appliance:test-{uuid.uuid4().hex[:8]}"
    started = time.monotonic()
    build = subprocess.run(
        [str(ROOT / "build" / "oci" / "build.sh"), "--tag", tag],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "EDGE_OCI_DIST": str(DIST)},
    )
    assert build.returncode == 0, build.stdout + build.stderr
    assert f"built {tag}" in build.stdout, build.stdout
    print(f"image built in {time.monotonic() - started:.1f} s: {build.stdout.strip()}")  # noqa: T201
    try:
        yield tag
    finally:
        podman("rmi", "-f", tag, check=False)


class Container:
    """One container of the image, its host ports and its name."""

    def __init__(self, name: str, http_port: int, grpc_port: int) -> None:
        self.name, self.http_port, self.grpc_port = name, http_port, grpc_port

    def inspect(self) -> dict[str, Any]:
        doc: list[dict[str, Any]] = json.loads(podman("inspect", self.name).stdout)
        return doc[0]

    def logs(self) -> str:
        done = podman("logs", self.name, check=False)
        return done.stdout + done.stderr

    def exec(self, *args: str) -> subprocess.CompletedProcess[str]:
        return podman("exec", self.name, "/usr/bin/busybox", *args, check=False)


@pytest.fixture(scope="module")
def container(image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Container]:
    from configs.generate import write_repository

    repo = tmp_path_factory.mktemp("oci") / "models"
    write_repository(repo)
    name = f"edge-oci-test-{uuid.uuid4().hex[:8]}"
    box = Container(name, free_port(), free_port())
    podman(
        "run",
        "--detach",
        "--name",
        name,
        *_run_options(),
        # As the manifests in deploy/ run it: read-only root, no capability, no new privileges.
        "--read-only",
        "--cap-drop",
        "ALL",
        "--security-opt",
        "no-new-privileges",
        "--publish",
        f"127.0.0.1:{box.http_port}:8000",
        "--publish",
        f"127.0.0.1:{box.grpc_port}:8001",
        "--volume",
        f"{repo}:/models:ro",
        image,
        # Arguments replace the image's CMD (the repository) and come after its ENTRYPOINT.
        "--model-repository=/models",
        f"--exit-timeout-secs={EXIT_TIMEOUT_S}",
    )
    try:
        deadline = time.monotonic() + 90
        url = f"http://127.0.0.1:{box.http_port}/v2/health/ready"
        while True:
            state = box.inspect()["State"]
            assert state["Running"], f"container exited {state['ExitCode']}:\n{box.logs()}"
            try:
                with urllib.request.urlopen(url, timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, f"not ready within 90 s:\n{box.logs()}"
            time.sleep(0.1)
        yield box
    finally:
        podman("rm", "--force", "--volumes", "--time", "0", name, check=False)


def test_image_configuration(image: str) -> None:
    config = json.loads(podman("image", "inspect", image).stdout)[0]["Config"]
    assert config["User"] == f"{UID}:{UID}"
    assert set(config["ExposedPorts"]) == {"8000/tcp", "8001/tcp", "8002/tcp"}
    assert config["StopSignal"] == "SIGTERM"
    assert "/var/lib/edge-appliance" in config["Volumes"]
    assert "STATE_DIRECTORY=/var/lib/edge-appliance" in config["Env"]
    assert config["Entrypoint"][:2] == ["/opt/edge-appliance/edge-appliance", "serve"]
    labels = config["Labels"]
    assert labels["org.opencontainers.image.title"] == "edge-appliance"
    assert labels["org.opencontainers.image.version"]
    assert labels["org.opencontainers.image.revision"] != "unknown"
    health = json.loads(
        podman("image", "inspect", "--format", "{{json .HealthCheck}}", image).stdout
    )
    assert health["Test"][-1] == "http://127.0.0.1:8000/v2/health/ready", health


def test_serves_the_example_repository(container: Container) -> None:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.ones((1, 16), dtype=np.int32)
    http = httpclient.InferenceServerClient(f"127.0.0.1:{container.http_port}")
    inputs = [
        httpclient.InferInput("INPUT0", [1, 16], "INT32"),
        httpclient.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b, binary_data=True)
    result = http.infer("simple", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)

    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{container.grpc_port}")
    ginputs = [
        grpcclient.InferInput("INPUT0", [1, 16], "INT32"),
        grpcclient.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    ginputs[0].set_data_from_numpy(a)
    ginputs[1].set_data_from_numpy(b)
    np.testing.assert_array_equal(grpc.infer("simple", ginputs).as_numpy("OUTPUT1"), a - b)

    # A Python model: a process of the binary, tensors in the container's /dev/shm, BLS to
    # densenet_onnx, all with a read-only root file system.
    image = grpcclient.InferInput("IMAGE", [224, 224, 3], "UINT8")
    image.set_data_from_numpy(
        (np.arange(224 * 224 * 3) % 256).astype(np.uint8).reshape(224, 224, 3)
    )
    scores = grpc.infer("densenet_preprocess", [image]).as_numpy("SCORES")
    assert scores is not None
    assert scores.size == 1000
    index = http.get_model_repository_index()
    not_ready = [m["name"] for m in index if m.get("state") != "READY"]
    assert not not_ready, index


def test_healthy_and_confined(container: Container) -> None:
    health = podman("healthcheck", "run", container.name, check=False)
    assert health.returncode == 0, health.stdout + health.stderr
    assert "unhealthy" not in health.stdout
    assert container.exec("id", "-u").stdout.strip() == UID
    denied = container.exec("touch", "/opt/edge-appliance/probe")
    assert denied.returncode != 0
    assert "Read-only file system" in denied.stdout + denied.stderr
    # The state volume is the service user's alone (as StateDirectoryMode=0700); its parents
    # stay root's.
    owners = container.exec("stat", "-c", "%u %a", "/var/lib/edge-appliance", "/var/lib")
    assert owners.stdout.split("\n")[:2] == [f"{UID} 700", "0 755"], owners.stdout
    assert container.exec("touch", "/var/lib/edge-appliance/probe").returncode == 0
    assert container.exec("touch", "/tmp/probe").returncode == 0
    # The health check's command fails on a 4xx, which is what a server not ready answers.
    refused = container.exec("wget", "-q", "-O", "/dev/null", "http://127.0.0.1:8000/v2/nothing")
    assert refused.returncode != 0


def test_stops_cleanly_on_sigterm(container: Container) -> None:
    started = time.monotonic()
    # STOPSIGNAL SIGTERM; podman's SIGKILL would come only after the --time given here.
    podman("stop", "--time", str(EXIT_TIMEOUT_S + 20), container.name, timeout=60)
    took_s = time.monotonic() - started
    state = container.inspect()["State"]
    logs = container.logs()
    assert state["ExitCode"] == 0, logs
    assert took_s < EXIT_TIMEOUT_S + 2, f"stopped after {took_s:.1f} s:\n{logs}"
    assert "SIGTERM: shutting down" in logs
    assert "shutdown complete" in logs


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a root-owned folder")
def test_the_daemonsets_init_container_hands_the_state_to_the_image_user(
    image: str, tmp_path: Path
) -> None:
    """deploy/k3s/daemonset.yaml's init container, run as the manifest says (root with CHOWN
    alone, read-only root) on a root-owned folder as the kubelet makes it, twice."""
    yaml = pytest.importorskip("yaml", reason="PyYAML is not installed (the dev extra)")

    docs = list(yaml.safe_load_all((ROOT / "deploy" / "k3s" / "daemonset.yaml").read_text()))
    daemonset = next(d for d in docs if d["kind"] == "DaemonSet")
    init = daemonset["spec"]["template"]["spec"]["initContainers"][0]
    assert init["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN"]}
    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    for _ in range(2):  # the second time, the folder is already handed over
        done = podman(
            "run",
            "--rm",
            *_run_options(),
            "--read-only",
            "--user",
            str(init["securityContext"]["runAsUser"]),
            "--cap-drop",
            "ALL",
            "--cap-add",
            "CHOWN",
            "--security-opt",
            "no-new-privileges",
            "--volume",
            f"{state}:/var/lib/edge-appliance",
            "--entrypoint",
            init["command"][0],
            image,
            *init["command"][1:],
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        info = state.stat()
        assert (info.st_uid, info.st_gid, info.st_mode & 0o777) == (int(UID), int(UID), 0o700)
