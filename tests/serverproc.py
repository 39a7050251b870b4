"""Start the real server process on free loopback ports and wait until it is ready."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common import free_port as free_port  # one race-free copy (tests import it here)

ROOT = Path(__file__).resolve().parent.parent


class ServerProcess:
    """`python -m appliance serve` as a child process; `stop()` sends SIGTERM and waits."""

    def __init__(
        self,
        repository: Path | str | list[Path | str],
        *extra: str,
        log_path: Path,
        env: dict[str, str] | None = None,
        launcher: Sequence[str] = (),
    ) -> None:
        repos = repository if isinstance(repository, list) else [repository]
        self.http_port = free_port()
        self.grpc_port = free_port()
        self.metrics_port = free_port()
        self.http_url = f"127.0.0.1:{self.http_port}"
        self.grpc_url = f"127.0.0.1:{self.grpc_port}"
        self.log_path = log_path
        # `launcher`: a command that execs the rest (e.g. unshare: a file system of its own).
        args = [*launcher, sys.executable, "-m", "appliance", "serve"]
        for repo in repos:
            args += ["--model-repository", str(repo)]
        args += [
            "--http-port",
            str(self.http_port),
            "--grpc-port",
            str(self.grpc_port),
            "--metrics-port",
            str(self.metrics_port),
            *extra,
        ]
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        environment = dict(os.environ, PYTHONPATH=str(ROOT), **(env or {}))
        # The default state directory (the ledger, the model store) is the test's own, never
        # the user's: a test that restarts a server keeps it by passing the same log folder.
        if "STATE_DIRECTORY" not in (env or {}) and "XDG_STATE_HOME" not in (env or {}):
            environment.pop("STATE_DIRECTORY", None)
            environment["XDG_STATE_HOME"] = str(log_path.parent / "state")
        self.proc = subprocess.Popen(
            args, stdout=self._log, stderr=subprocess.STDOUT, env=environment
        )

    def __enter__(self) -> ServerProcess:
        """Ready (within 120 s) or stopped: `with ServerProcess(...) as proc:` stops it after."""
        try:
            self.wait_ready(timeout_s=120)
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def client(self, module: Any, **kwargs: Any) -> Any:
        """A client of `module` (tritonclient.http or tritonclient.grpc) for this server."""
        http = module.__name__ == "tritonclient.http"
        return module.InferenceServerClient(self.http_url if http else self.grpc_url, **kwargs)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout_s: float = 60.0, path: str = "/v2/health/ready") -> None:
        deadline = time.monotonic() + timeout_s
        url = f"http://{self.http_url}{path}"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                with urllib.request.urlopen(url, timeout=1) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.05)
        raise TimeoutError(f"server not ready within {timeout_s}s:\n{self.log()}")

    def stop(self, timeout_s: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return int(self.proc.returncode)
