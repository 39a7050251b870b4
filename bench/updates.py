"""Over-the-air update benchmark against a real S3 server (moto) on loopback.

    python -m bench.updates [--models N] [--size-mib M] [--trials T]

Measures, beside what Triton's documented S3 polling would cost on the same bucket (one
listing plus one HEAD per object per poll; a changed model re-downloaded whole):
1. S3 requests per idle poll, for a bucket of N models (config + one version + manifest).
2. Bytes downloaded when one small file of a version changes.
3. Time from an upload finishing to the new version answering requests, for a small and an
   M MiB model, with the poll interval (0.2 s) subtracted at its mean (0.1 s).
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

import numpy as np
import onnx
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.integration.models import _add_constant_model
from tests.s3servers import S3Server, moto_server
from tests.serverproc import ServerProcess

POLL_S = 0.2
CONFIG = 'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 4\n'


def model_bytes(value: int, padding: int) -> bytes:
    model = _add_constant_model(value)
    if padding:
        rng = np.random.default_rng(value)
        weights = rng.integers(0, 255, padding, dtype=np.uint8)
        model.graph.initializer.append(onnx.numpy_helper.from_array(weights, "padding"))
    return bytes(model.SerializeToString())


def put_version(client, bucket: str, name: str, version: int, value: int, padding: int) -> int:  # type: ignore[no-untyped-def]
    files = {"model.onnx": model_bytes(value, padding), "notes.txt": b"release notes\n"}
    manifest = "".join(f"{hashlib.sha256(d).hexdigest()}  {n}\n" for n, d in files.items())
    files["SHA256SUMS"] = manifest.encode()
    for file, data in files.items():
        client.put_object(Bucket=bucket, Key=f"models/{name}/{version}/{file}", Body=data)
    return sum(len(d) for d in files.values())


def metric(proc: ServerProcess, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{proc.metrics_port}/metrics") as resp:
        lines = resp.read().decode().splitlines()
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith(name))


def answers(url: str, name: str) -> float | None:
    client = httpclient.InferenceServerClient(url)
    inp = httpclient.InferInput("INPUT0", [1, 4], "FP32")
    inp.set_data_from_numpy(np.zeros((1, 4), np.float32))
    try:
        return float(client.infer(name, [inp]).as_numpy("OUTPUT0")[0, 0])
    except InferenceServerException:
        return None


def run(models: int, size_mib: int, trials: int) -> list[tuple[str, str, str]]:
    rows: list[tuple[str, str, str]] = []
    with moto_server() as s3, tempfile.TemporaryDirectory() as tmp:
        bucket = f"bench-{uuid.uuid4().hex[:8]}"
        s3.make_bucket(bucket)
        client = s3.client()
        total_bytes = 0
        for i in range(models):
            name = f"m{i}"
            client.put_object(
                Bucket=bucket, Key=f"models/{name}/config.pbtxt", Body=CONFIG.format(name=name)
            )
            total_bytes += put_version(client, bucket, name, 1, 1, 0)
        big = "big"
        client.put_object(
            Bucket=bucket, Key=f"models/{big}/config.pbtxt", Body=CONFIG.format(name=big)
        )
        big_bytes = put_version(client, bucket, big, 1, 1, size_mib * 1024 * 1024)
        objects = 3 * models + 4
        proc = ServerProcess(
            f"s3://{s3.host_port}/{bucket}/models",
            f"--model-store-dir={tmp}/store",
            "--model-control-mode=poll",
            f"--repository-poll-secs={POLL_S}",
            # Ready once the first sync brought every model in (by default the server is
            # ready on an empty store and the first downloads would fall in the idle window).
            "--repository-sync-wait-secs=300",
            log_path=Path(tmp) / "server.log",
            env=s3.env(),
        )
        try:
            proc.wait_ready(300)
            rows += idle_poll(proc, objects)
            rows += changed_file(proc, client, bucket, big_bytes)
            rows += switch_times(proc, s3, client, bucket, size_mib, trials)
        finally:
            proc.stop()
    return rows


def idle_poll(proc: ServerProcess, objects: int) -> list[tuple[str, str, str]]:
    time.sleep(1.0)
    before, bytes_before = (
        metric(proc, "edge_repository_requests_total"),
        metric(proc, "edge_repository_download_bytes_total"),
    )
    window = 10.0
    time.sleep(window)
    requests = metric(proc, "edge_repository_requests_total") - before
    downloaded = metric(proc, "edge_repository_download_bytes_total") - bytes_before
    polls = requests  # one listing page per poll when nothing changed
    return [
        (
            f"S3 requests per idle poll ({objects} objects)",
            f"{requests / polls:.0f} (list); {downloaded:.0f} bytes in {polls:.0f} polls",
            f"{1 + objects} (1 list + {objects} HEAD)",
        )
    ]


def changed_file(proc: ServerProcess, client, bucket: str, version_bytes: int):  # type: ignore[no-untyped-def]
    before = metric(proc, "edge_repository_download_bytes_total")
    notes = b"release notes, corrected\n"
    body = client.get_object(Bucket=bucket, Key="models/big/1/SHA256SUMS")["Body"].read().decode()
    lines = [ln for ln in body.splitlines() if not ln.endswith("notes.txt")]
    lines.append(f"{hashlib.sha256(notes).hexdigest()}  notes.txt")
    manifest = ("\n".join(lines) + "\n").encode()
    client.put_object(Bucket=bucket, Key="models/big/1/notes.txt", Body=notes)
    client.put_object(Bucket=bucket, Key="models/big/1/SHA256SUMS", Body=manifest)
    deadline = time.monotonic() + 60
    while metric(proc, "edge_repository_download_bytes_total") - before < len(notes) + len(
        manifest
    ):
        assert time.monotonic() < deadline, "the change was not fetched"
        time.sleep(0.1)
    time.sleep(1.0)
    fetched = metric(proc, "edge_repository_download_bytes_total") - before
    return [
        (
            f"bytes downloaded when notes.txt changes in a {version_bytes / 2**20:.1f} MiB version",
            f"{fetched:.0f}",
            f"{version_bytes} (whole model)",
        )
    ]


def switch_times(
    proc: ServerProcess, s3: S3Server, client, bucket: str, size_mib: int, trials: int
):  # type: ignore[no-untyped-def]
    rows = []
    for label, name, padding in (
        ("small (1 KiB) model", "m0", 0),
        (f"{size_mib} MiB model", "big", size_mib * 1024 * 1024),
    ):
        times, fetch, load = [], [], []
        for trial in range(trials):
            version, value = trial + 2, trial + 2
            put_version(client, bucket, name, version, value, padding)
            uploaded, uploaded_wall = time.monotonic(), time.time()
            while answers(proc.http_url, name) != float(value):
                assert time.monotonic() - uploaded < 120, proc.log()
                time.sleep(0.005)
            times.append(time.monotonic() - uploaded - POLL_S / 2)
            log = proc.log()
            fetched = logged_at(log, f"model '{name}' version {version}: fetched")
            ready = logged_at(log, f"model '{name}' version {version} is READY")
            fetch.append(fetched - uploaded_wall - POLL_S / 2)
            load.append(ready - fetched)
        ms = lambda xs: f"{statistics.median(xs) * 1000:.0f} ms"  # noqa: E731
        rows.append(
            (
                f"upload done -> new version serving, {label} (median of {trials})",
                f"{ms(times)} (list + download + verify + fsync: {ms(fetch)}, load: {ms(load)})",
                "poll interval + full re-download + load",
            )
        )
    return rows


def logged_at(log: str, text: str) -> float:
    """Wall-clock time of the first log line containing `text`."""
    import datetime

    for line in log.splitlines():
        if text in line:
            stamp = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
            return stamp.timestamp()
    raise AssertionError(f"no log line with {text!r}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", type=int, default=20)
    parser.add_argument("--size-mib", type=int, default=64)
    parser.add_argument("--trials", type=int, default=5)
    args = parser.parse_args()
    rows = run(args.models, args.size_mib, args.trials)
    print("| measure | edge-appliance | Triton (documented behaviour) |")
    print("|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
