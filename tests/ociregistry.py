"""A real OCI registry on loopback for the tests: Debian's `docker-registry` (the CNCF
distribution registry), started on a free port with its storage in a temporary folder."""

from __future__ import annotations

import json
import re
import shutil
import ssl
import subprocess
import time
import urllib.error
import urllib.parse
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

    def __init__(self, folder: Path, tls: tuple[Path, Path] | None = None, token: str = "") -> None:
        """`tls`: (certificate, key) PEM files: the registry serves HTTPS. `token`: its
        clients need a Bearer token from a TokenService (its config block)."""
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
        text += token
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
            except urllib.error.HTTPError as exc:
                if exc.code == 401:  # up, and asking for a token
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


class TokenService:
    """The token service of the distribution spec's Bearer auth, on loopback: a GET of
    `/token?service=...&scope=...` with the right Basic credentials gets a JWT (ES256, its
    certificate in `x5c`) granting what the scope asks; anything else gets 401."""

    def __init__(self, folder: Path, user: str, password: str) -> None:
        import base64
        import http.server
        import threading

        from cryptography.hazmat.primitives import serialization

        from tests.pki import self_signed

        self.cert, key_path = self_signed(folder, "token-signer")
        self._key = serialization.load_pem_private_key(key_path.read_bytes(), None)
        self._expected = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        self.tokens = 0
        service = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
                if self.headers.get("Authorization") != service._expected:
                    self.send_response(401)
                    self.end_headers()
                    return
                body = json.dumps({"token": service.token(query)}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.realm = f"http://127.0.0.1:{self._server.server_address[1]}/token"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def config(self) -> str:
        return (
            "auth:\n  token:\n"
            f"    realm: {self.realm}\n    service: test-registry\n"
            f"    issuer: test-issuer\n    rootcertbundle: {self.cert}\n"
        )

    def token(self, query: dict[str, list[str]]) -> str:
        import base64
        import time
        import uuid

        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

        def b64(data: bytes) -> str:
            return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

        access = []
        for scope in query.get("scope", []):
            kind, _, rest = scope.partition(":")
            name, _, actions = rest.rpartition(":")
            access.append({"type": kind, "name": name, "actions": actions.split(",")})
        der = x509.load_pem_x509_certificate(self.cert.read_bytes()).public_bytes(
            serialization.Encoding.DER
        )
        header = {"alg": "ES256", "typ": "JWT", "x5c": [base64.b64encode(der).decode()]}
        now = int(time.time())
        claims = {
            "iss": "test-issuer",
            "sub": "device",
            "aud": query.get("service", [""])[0],
            "exp": now + 300,
            "nbf": now - 10,
            "iat": now,
            "jti": uuid.uuid4().hex,
            "access": access,
        }
        signing_input = f"{b64(json.dumps(header).encode())}.{b64(json.dumps(claims).encode())}"
        r, s = decode_dss_signature(
            self._key.sign(signing_input.encode(), ec.ECDSA(hashes.SHA256()))  # an EC key
        )
        self.tokens += 1
        return f"{signing_input}.{b64(r.to_bytes(32, 'big') + s.to_bytes(32, 'big'))}"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
