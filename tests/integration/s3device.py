"""A device for update tests: a bucket behind a link that can go down, a model store that
outlives the server process, and the server, started again and again (real processes, a real
S3 server)."""

from __future__ import annotations

import signal
import socket
from pathlib import Path
from typing import Any

from tests.integration.test_s3_repository import Bucket, _added, _index, _manifest
from tests.s3servers import S3Server
from tests.serverproc import ServerProcess
from tests.tcpproxy import TcpProxy

POLL = ("--model-control-mode=poll", "--repository-poll-secs=0.3")


class Device:
    """One device: a bucket behind a link that can go down, a store that outlives the server
    process, and the server, started again and again."""

    def __init__(self, start_server: Any, s3: S3Server, tmp_path: Path, *flags: str) -> None:
        self.link = TcpProxy(s3.host_port)
        self.bucket = Bucket(s3, endpoint=self.link.address)
        self.store = tmp_path / "store"
        self._start_server, self._s3, self._flags = start_server, s3, flags
        self.proc: ServerProcess | None = None

    def start(self, *flags: str, first: bool = False) -> ServerProcess:
        """Start the server; `first`: ready once the first sync loaded what the bucket holds
        (else ready on what the store holds, the default)."""
        wait = ("--repository-sync-wait-secs=60",) if first else ()
        self.proc = self._start_server(
            self.bucket.url,
            f"--model-store-dir={self.store}",
            *POLL,
            *self._flags,
            *wait,
            *flags,
            env=self._s3.env(),
        )
        return self.proc

    def kill(self) -> None:
        """A crash, a watchdog kill or a power cut, as the process sees it."""
        assert self.proc is not None
        self.proc.proc.send_signal(signal.SIGKILL)
        self.proc.proc.wait()

    def stop(self) -> None:
        assert self.proc is not None
        assert self.proc.stop() == 0

    def row(self, version: str) -> dict[str, Any]:
        assert self.proc is not None
        rows = [e for e in _index(self.proc.http_url) if e.get("version") == version]
        return rows[0] if rows else {}

    def added(self) -> float:
        assert self.proc is not None
        return _added(self.proc.http_url)

    def put_files(self, version: int, files: dict[str, bytes]) -> None:
        for name, data in {**files, "SHA256SUMS": _manifest(files)}.items():
            self.bucket.put(f"m/{version}/{name}", data)




class HungEndpoint:
    """A listening socket on `port` that never accepts, so never answers: the kernel completes
    each TCP handshake (the backlog), then a request waits forever. An S3 endpoint that
    accepts connections and hangs, as a captive portal or a dead proxy does."""

    def __init__(self, port: int) -> None:
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", port))
        self._sock.listen(128)

    def close(self) -> None:
        self._sock.close()
