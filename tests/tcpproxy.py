"""A loopback TCP forwarder that a test can switch off and on: a network outage on demand, or
(`freeze`) a peer that vanished without closing its connections."""

from __future__ import annotations

import contextlib
import socket
import threading

from tests.s3servers import free_port


class TcpProxy:
    """Forwards 127.0.0.1:<port> to `target` ("host:port") while started."""

    def __init__(self, target: str) -> None:
        host, _, port = target.rpartition(":")
        self._target = (host, int(port))
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self._listener: socket.socket | None = None
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self._flowing = threading.Event()
        self._flowing.set()
        self.bytes_to_clients = 0  # what the target sent, all connections together
        self.start()

    def start(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def freeze(self) -> None:
        """Forward nothing more either way, a close neither, and keep every socket open: to the
        ends, a peer that lost power or a NAT that forgot the connection (no FIN, no RST)."""
        self._flowing.clear()

    def stop(self) -> None:
        """Refuse new connections and cut the open ones."""
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        with self._lock:
            conns, self._conns = self._conns, []
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()
        self._flowing.set()  # a frozen pipe goes on to find its sockets closed, and ends

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self._target, timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns += [client, upstream]
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(src, dst), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            from_target = src.getpeername() == self._target
            while True:
                data = src.recv(65536)
                self._flowing.wait()  # frozen: what came in (or its end) goes nowhere
                if not data:
                    break
                if from_target:
                    with self._lock:
                        self.bytes_to_clients += len(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)
