"""A real OCI registry on loopback for the tests: Debian's `docker-registry` (the CNCF
distribution registry), started on a free port with its storage in a temporary folder."""

from __future__ import annotations

import re
import shutil
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from tests.s3servers import free_port

_CONFIG = """\
version: 0.1
log:
  level: warn
  accesslog:
    disabled: false
storage:
  filesystem:
    rootdirectory: {root}
  delete:
    enabled: true
http:
  addr: 127.0.0.1:{port}
"""


def registry_binary() -> str | None:
    """The registry's binary (apt-get install docker-registry), or None."""
    return shutil.which("docker-registry") or (
        "/usr/bin/docker-registry" if Path("/usr/bin/docker-registry").is_file() else None
    )


class OciRegistry:
    """`docker-registry serve` on 127.0.0.1, its access log in `log_path`."""

    def __init__(self, folder: Path, tls: tuple[Path, Path] | None = None) -> None:
        """`tls`: (certificate, key) PEM files: the registry serves HTTPS."""
        binary = registry_binary()
        assert binary is not None
        self.root = folder / "storage"
        self.port = free_port()  # the registry takes no port 0: a free one, bound just before
        self.host_port = f"127.0.0.1:{self.port}"
        self._tls = tls
        config = folder / "config.yml"
        text = _CONFIG.format(root=self.root, port=self.port)
        if tls is not None:
            text += f"  tls:\n    certificate: {tls[0]}\n    key: {tls[1]}\n"
        config.write_text(text)
        self.log_path = folder / "registry.log"
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [binary, "serve", str(config)], stdout=self._log, stderr=subprocess.STDOUT
        )
        self._wait_ready()

    def _wait_ready(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"docker-registry exited:\n{self.log_path.read_text()}")
            scheme, context = "http", None
            if self._tls is not None:
                scheme, context = "https", ssl.create_default_context(cafile=str(self._tls[0]))
            url = f"{scheme}://{self.host_port}/v2/"
            try:
                with urllib.request.urlopen(url, timeout=1, context=context) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"docker-registry not ready:\n{self.log_path.read_text()}")
            time.sleep(0.05)

    def url(self, repository: str, host_port: str | None = None) -> str:
        return f"oci://{host_port or self.host_port}/{repository}"

    def blob_file(self, digest: str) -> Path:
        """Where the registry keeps a blob (manifests are blobs too) on its disk."""
        hexdigest = digest.split(":", 1)[1]
        return self.root / "docker/registry/v2/blobs/sha256" / hexdigest[:2] / hexdigest / "data"

    def blob_gets(self, repository: str, digest: str | None = None) -> int:
        """How many blob GETs of `repository` (of one digest, when given) the log shows."""
        blob = re.escape(digest) if digest else r"sha256:[0-9a-f]{64}"
        pattern = re.compile(rf'"GET /v2/{re.escape(repository)}/blobs/{blob} HTTP')
        return len(pattern.findall(self.log_path.read_text(errors="replace")))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
