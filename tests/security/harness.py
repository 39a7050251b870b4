"""What every security test checks after its hostile input: the server answers a canary
inference, its process is alive, no answer was a 5xx, no traceback reached its log, and its
memory (the server and its children, VmRSS) grew by less than 50 MB."""

from __future__ import annotations

import contextlib
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient

from tests.serverproc import ServerProcess

RSS_GROWTH_BYTES = 50 * 1024 * 1024


def _rss_bytes(pid: int) -> int:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return found


def tree_rss_bytes(pid: int) -> int:
    """VmRSS of `pid` and all its descendants."""
    total, todo = 0, [pid]
    while todo:
        current = todo.pop()
        total += _rss_bytes(current)
        todo += _children(current)
    return total


def _complete(data: bytes) -> bool:
    """Whether `data` holds a whole answer with a Content-Length."""
    head, sep, body = data.partition(b"\r\n\r\n")
    if not sep:
        return False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(body) >= int(value)
    return False


@dataclass
class Http:
    """One raw HTTP/1.1 exchange per call, over TCP or a Unix socket (Connection: close)."""

    host: str = ""
    port: int = 0
    unix_path: str = ""

    def connect(self) -> socket.socket:
        if self.unix_path:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(self.unix_path)
        else:
            sock = socket.create_connection((self.host, self.port))
        sock.settimeout(30)
        return sock

    def exchange(self, raw: bytes) -> tuple[int, bytes]:
        """Send `raw` (a whole request) and read the answer to the end: (status, body).
        Status 0: the server closed the connection without an answer."""
        with self.connect() as sock:
            # The server may answer and close before the whole body is in.
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                sock.sendall(raw)
            data = b""
            try:
                while chunk := sock.recv(65536):
                    data += chunk
                    if _complete(data):  # the server may linger, reading a refused body
                        break
            except ConnectionResetError:
                pass
        if not data.startswith(b"HTTP/1."):
            return 0, data
        head, _, body = data.partition(b"\r\n\r\n")
        return int(head.split(b" ", 2)[1]), body

    def request(
        self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
    ) -> tuple[int, bytes]:
        lines = [f"{method} {path} HTTP/1.1", "Host: localhost", "Connection: close"]
        fields = {"Content-Length": str(len(body)), **(headers or {})}
        lines += [f"{k}: {v}" for k, v in fields.items()]
        return self.exchange(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)


@dataclass
class Watch:
    """One module's server and what its tests have seen of it."""

    proc: ServerProcess
    canary: str = "simple"
    statuses: list[tuple[str, int]] = field(default_factory=list)
    baseline_rss: int = 0

    def __post_init__(self) -> None:
        self.answer_canary()  # allocations of the first requests are not growth
        self.baseline_rss = tree_rss_bytes(self.proc.proc.pid)

    def seen(self, what: str, status: int) -> int:
        self.statuses.append((what, status))
        return status

    def answer_canary(self) -> None:
        client = httpclient.InferenceServerClient(self.proc.http_url)
        data = np.arange(16, dtype=np.int32).reshape(1, 16)
        inputs = [httpclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
        for item in inputs:
            item.set_data_from_numpy(data)
        result = client.infer(self.canary, inputs)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data + data)
        client.close()

    def check(self) -> None:
        """The server survived: alive, canary answered, no 5xx, no traceback, bounded RSS."""
        assert self.proc.proc.poll() is None, f"the server died:\n{self.proc.log()[-4000:]}"
        self.answer_canary()
        errors = [(what, status) for what, status in self.statuses if status >= 500]
        self.statuses.clear()
        assert not errors, f"5xx answers: {errors}"
        log = self.proc.log()
        assert "Traceback" not in log, log[-4000:]
        # What a refused request allocated is freed when its answer is sent; the heap is
        # trimmed after (appliance/ops/memory.py): look again for a few seconds before failing.
        deadline = time.monotonic() + 10
        while True:
            grown = tree_rss_bytes(self.proc.proc.pid) - self.baseline_rss
            if grown < RSS_GROWTH_BYTES or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert grown < RSS_GROWTH_BYTES, f"the server grew by {grown / 2**20:.0f} MB"
