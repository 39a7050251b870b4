"""Soak: minutes of mixed work, watching that memory and file descriptors reach a plateau.

    python -m bench.soak [--minutes 3] [--sample-s 5]

The server runs in poll mode on a private copy of the example repository (poll every 1 s).
It is driven by:
- HTTP and gRPC clients running `simple`, `simple_string` and `squeezenet_onnx`;
- a client whose requests time out and are cancelled;
- a thread that writes a new version of a model every 10 s, each switching in and retiring
  the old one;
- a thread that removes and restores a whole model folder every 15 s, unloading and loading
  it.

Every sample records the server's RSS (its whole process tree), open file descriptors and
threads. The table ends with a verdict. The plateau check compares the last third of the run
with the middle third: growth above 10 % in RSS, or in descriptors beyond a small slack,
fails.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from bench.common import process_tree, rss_mib
from bench.server import start_server, stop_server, wait_ready


def sample(pid: int) -> tuple[float, int, int]:
    """(RSS MiB of the process tree, open fds of the server, server threads)."""
    rss = sum(rss_mib(p) for p in process_tree(pid))
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    threads = len(os.listdir(f"/proc/{pid}/task"))
    return rss, fds, threads


class Load:
    def __init__(self, http_url: str, grpc_url: str, stop: threading.Event) -> None:
        self.http_url, self.grpc_url, self.stop = http_url, grpc_url, stop
        self.ok = self.failed = 0
        self.errors: dict[str, int] = {}
        self._lock = threading.Lock()

    def _count(self, error: str = "") -> None:
        with self._lock:
            if error:
                self.failed += 1
                key = error[:80]
                self.errors[key] = self.errors.get(key, 0) + 1
            else:
                self.ok += 1

    def simple_http(self) -> None:
        client = httpclient.InferenceServerClient(self.http_url)
        a = np.arange(16, dtype=np.int32).reshape(1, 16)
        while not self.stop.is_set():
            inputs = [httpclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
            for inp in inputs:
                inp.set_data_from_numpy(a, binary_data=True)
            try:
                client.infer("simple", inputs)
                self._count()
            except InferenceServerException as exc:
                self._count(exc.message())

    def strings_grpc(self) -> None:
        client = grpcclient.InferenceServerClient(self.grpc_url)
        data = np.array([[str(i).encode() for i in range(16)]], dtype=np.object_)
        while not self.stop.is_set():
            inputs = [grpcclient.InferInput(n, [1, 16], "BYTES") for n in ("INPUT0", "INPUT1")]
            for inp in inputs:
                inp.set_data_from_numpy(data)
            try:
                client.infer("simple_string", inputs)
                self._count()
            except InferenceServerException as exc:
                self._count(exc.message())

    def image_grpc(self) -> None:
        client = grpcclient.InferenceServerClient(self.grpc_url)
        image = np.random.default_rng(0).random((1, 3, 224, 224), dtype=np.float32)
        while not self.stop.is_set():
            inp = grpcclient.InferInput("data_0", [1, 3, 224, 224], "FP32")
            inp.set_data_from_numpy(image)
            try:
                client.infer("squeezenet_onnx", [inp])
                self._count()
            except InferenceServerException as exc:
                self._count(exc.message())

    def cancelled(self) -> None:
        client = grpcclient.InferenceServerClient(self.grpc_url)
        image = np.zeros((1, 3, 224, 224), dtype=np.float32)
        while not self.stop.is_set():
            inp = grpcclient.InferInput("data_0", [1, 3, 224, 224], "FP32")
            inp.set_data_from_numpy(image)
            # Expected to time out (and be cancelled) often; counted apart.
            with contextlib.suppress(InferenceServerException):
                client.infer("squeezenet_onnx", [inp], client_timeout=0.002)
            time.sleep(0.01)


def version_switcher(repo: Path, stop: threading.Event, switches: list[int]) -> None:
    """A new version of `simple` every 10 s (the same model, a new number)."""
    source = repo / "simple" / "1" / "model.onnx"
    version = 1
    while not stop.wait(10):
        version += 1
        staging = repo.parent / f"staging-{version}"
        staging.mkdir()
        shutil.copy2(source if source.exists() else staging, staging / "model.onnx")
        staging.rename(repo / "simple" / str(version))
        old = repo / "simple" / str(version - 2)
        if version - 2 >= 1 and old.exists():
            shutil.rmtree(old)  # keep the folder small; version_policy serves the latest
        switches.append(version)
        source = repo / "simple" / str(version) / "model.onnx"


def model_flipper(repo: Path, stop: threading.Event, flips: list[int]) -> None:
    """`simple_int8` leaves the repository and comes back, every 15 s."""
    away = repo.parent / "simple_int8-away"
    while not stop.wait(15):
        if (repo / "simple_int8").exists():
            (repo / "simple_int8").rename(away)
        else:
            away.rename(repo / "simple_int8")
        flips.append(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--sample-s", type=float, default=5.0)
    args = parser.parse_args()
    from configs.generate import write_repository

    with tempfile.TemporaryDirectory() as tmp:
        repo = write_repository(Path(tmp) / "models")
        shutil.rmtree(repo / "densenet_onnx")  # keep the soak about churn, not one slow model
        shutil.rmtree(repo / "densenet_preprocess")
        poll = ["--model-control-mode", "poll", "--repository-poll-secs", "1"]
        proc = start_server(repo, None, Path(tmp) / "server.log", poll)
        stop = threading.Event()
        try:
            wait_ready(proc)
            http_url, grpc_url = proc.http_url, proc.grpc_url
            load = Load(http_url, grpc_url, stop)
            switches: list[int] = []
            flips: list[int] = []
            workers = [
                threading.Thread(target=load.simple_http),
                threading.Thread(target=load.strings_grpc),
                threading.Thread(target=load.image_grpc),
                threading.Thread(target=load.cancelled),
                threading.Thread(target=version_switcher, args=(repo, stop, switches)),
                threading.Thread(target=model_flipper, args=(repo, stop, flips)),
            ]
            for worker in workers:
                worker.start()
            samples = []
            started = time.monotonic()
            end = started + args.minutes * 60
            while time.monotonic() < end:
                time.sleep(args.sample_s)
                rss, fds, threads = sample(proc.proc.pid)
                samples.append((time.monotonic() - started, rss, fds, threads, load.ok))
            stop.set()
            for worker in workers:
                worker.join(30)
        finally:
            stop.set()
            code = stop_server(proc)
    print("| t (s) | RSS MiB (tree) | open fds | threads | requests ok |")
    print("|---:|---:|---:|---:|---:|")
    for t, rss, fds, threads, ok in samples:
        print(f"| {t:.0f} | {rss:.0f} | {fds} | {threads} | {ok:,} |")
    third = max(1, len(samples) // 3)
    middle, last = samples[third : 2 * third], samples[2 * third :]
    rss_growth = max(s[1] for s in last) / max(s[1] for s in middle) - 1
    fd_growth = max(s[2] for s in last) - max(s[2] for s in middle)
    errors = dict(load.errors)
    print(
        f"\nrequests: {load.ok:,} ok, {load.failed:,} failed; version switches: "
        f"{len(switches)}; model removals/returns: {len(flips)}; exit status {code}"
    )
    for message, count in sorted(errors.items(), key=lambda kv: -kv[1])[:5]:
        print(f"  {count} x {message}")
    verdict = rss_growth <= 0.10 and fd_growth <= 4 and code == 0
    print(
        f"plateau: RSS last third vs middle third {rss_growth:+.1%}, fds {fd_growth:+d} "
        f"-> {'PASS' if verdict else 'FAIL'}"
    )
    raise SystemExit(0 if verdict else 1)


if __name__ == "__main__":
    main()
