"""The two servers under comparison: tritonserver (the reference, from the nvidia-pytriton
wheel that scripts/tritonserver-reference installs) and this server."""

from __future__ import annotations

import os
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from tests.serverproc import ServerProcess, free_port

# Where scripts/tritonserver-reference puts its venv unless TRITONSERVER_VENV says otherwise.
DEFAULT_VENV = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / (
    "edge-appliance/tritonserver-venv"
)


def reference_venv() -> Path:
    return Path(os.environ.get("TRITONSERVER_VENV", DEFAULT_VENV))


def reference_missing() -> str | None:
    """Why the reference cannot run here, or None when it can."""
    venv = reference_venv()
    binary = _site_packages(venv) / "pytriton/tritonserver/bin/tritonserver"
    if not binary.is_file():
        return (
            f"tritonserver is not installed at {venv} (scripts/tritonserver-reference "
            "setup installs it; TRITONSERVER_VENV names another venv)"
        )
    stub = _site_packages(venv) / "pytriton/tritonserver/backends/python"
    if not (stub / "triton_python_backend_stub").is_file():
        return f"the Python backend's stub is missing in {stub} (rerun the setup)"
    return None


def _site_packages(venv: Path) -> Path:
    found = sorted((venv / "lib").glob("python3.*/site-packages"))
    return found[0] if found else venv / "lib/python3.11/site-packages"


class ReferenceServer:
    """tritonserver on free loopback ports; `stop()` sends SIGTERM and waits."""

    def __init__(self, repository: Path, *flags: str, log_path: Path) -> None:
        venv = reference_venv()
        site = _site_packages(venv)
        root = site / "pytriton/tritonserver"
        self.http_port, self.grpc_port, self.metrics_port = free_port(), free_port(), free_port()
        self.http_url = f"127.0.0.1:{self.http_port}"
        self.grpc_url = f"127.0.0.1:{self.grpc_port}"
        self.metrics_url = f"127.0.0.1:{self.metrics_port}"
        self.log_path = log_path
        env = dict(os.environ)
        # the stub finds the venv's numpy through PATH and its libraries beside the wheel's
        env["PATH"] = f"{venv / 'bin'}:{env.get('PATH', '')}"
        env["LD_LIBRARY_PATH"] = str(site / "nvidia_pytriton.libs")
        args = [
            str(root / "bin/tritonserver"),
            "--model-repository",
            str(repository),
            "--backend-directory",
            str(root / "backends"),
            "--http-port",
            str(self.http_port),
            "--grpc-port",
            str(self.grpc_port),
            "--metrics-port",
            str(self.metrics_port),
            "--http-address",
            "127.0.0.1",
            "--grpc-address",
            "127.0.0.1",
            *flags,
        ]
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT, env=env)

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"tritonserver exited with {self.proc.returncode}:\n"
                    f"{self.log_path.read_text(errors='replace')[-4000:]}"
                )
            try:
                url = f"http://{self.http_url}/v2/health/ready"
                with urllib.request.urlopen(url, timeout=1) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.1)
        raise TimeoutError(f"tritonserver not ready within {timeout_s} s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def ours(repository: Path, *flags: str, log_path: Path) -> ServerProcess:
    proc = ServerProcess(repository, *flags, log_path=log_path)
    proc.metrics_url = f"127.0.0.1:{proc.metrics_port}"  # type: ignore[attr-defined]
    return proc
