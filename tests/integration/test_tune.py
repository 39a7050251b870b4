"""`edge-appliance tune`: short runs whose table, choice and written config agree."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from google.protobuf import text_format

from appliance.common.protocol import model_config_pb2 as mc
from configs.generate import write_repository
from tests.serverproc import ROOT, ServerProcess


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_repository(tmp_path_factory.mktemp("tune") / "models")


def _tune(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "appliance", "tune", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=timeout,
        check=False,
    )


def _check_choice(out_dir: Path, budget_ms: float) -> mc.ModelConfig:
    """The written config is the best-throughput configuration within the p99 budget."""
    rows = list(csv.DictReader((out_dir / "tune.csv").open()))
    assert rows
    fitting = [r for r in rows if r["p99_ms"] and float(r["p99_ms"]) <= budget_ms]
    assert fitting, rows
    # Score per configuration: its best throughput within the budget.
    scores: dict[tuple[str, ...], float] = {}
    for r in fitting:
        key = (
            r["instances"],
            r["max_batch"],
            r["queue_delay_us"],
            r["threads"],
            r["preferred_batch"],
        )
        scores[key] = max(scores.get(key, 0.0), float(r["throughput"]))
    best = max(scores, key=lambda k: scores[k])
    config = text_format.Parse((out_dir / "config.pbtxt").read_text(), mc.ModelConfig())
    assert config.instance_group[0].count == int(best[0])
    if int(best[1]):
        assert config.max_batch_size == int(best[1])
        assert config.dynamic_batching.max_queue_delay_microseconds == int(best[2])
    threads = (
        config.parameters["intra_op_thread_count"].string_value
        if ("intra_op_thread_count" in config.parameters)
        else "0"
    )
    assert threads == best[3]
    if int(best[1]) and int(best[4]) >= 0:
        assert list(config.dynamic_batching.preferred_batch_size) == (
            [int(best[4])] if int(best[4]) else []
        )
    assert (out_dir / "tune.html").read_text().startswith("<!doctype html>")
    return config


def test_tune_simple(repo: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    before = (repo / "simple" / "config.pbtxt").read_text()
    result = _tune(
        "--model-repository",
        str(repo),
        "--model",
        "simple",
        "--latency-budget-ms",
        "20",
        "--concurrency",
        "1,4",
        "--time-budget-s",
        "6",
        "--seconds-per-point",
        "0.2",
        "--output",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    assert "best: instances=" in result.stdout
    assert "*" in result.stdout
    config = _check_choice(out, 20.0)
    assert config.name == "simple"
    assert (repo / "simple" / "config.pbtxt").read_text() == before  # untouched without --apply


def test_tune_densenet_and_apply(repo: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = _tune(
        "--model-repository",
        str(repo),
        "--model",
        "densenet_onnx",
        "--latency-budget-ms",
        "2000",
        "--concurrency",
        "2",
        "--time-budget-s",
        "8",
        "--seconds-per-point",
        "0.5",
        "--output",
        str(out),
        "--apply",
    )
    assert result.returncode == 0, result.stderr
    config = _check_choice(out, 2000.0)
    applied = repo / "densenet_onnx" / "config.pbtxt"
    assert text_format.Parse(applied.read_text(), mc.ModelConfig()) == config
    backup = repo / "densenet_onnx" / "config.pbtxt.bak"
    assert backup.exists()
    assert text_format.Parse(backup.read_text(), mc.ModelConfig()).max_batch_size == 0
    assert f"previous kept as {backup}" in result.stdout


def test_tune_never_lowers_max_batch_size(repo: Path, tmp_path: Path) -> None:
    """Issue 37: the search tried max_batch_size 1, 2, 4 and could choose 2 for a model of 8,
    after which an applied config refused clients' batches of 3 to 8. It now tunes the
    dynamic batcher's preferred size and leaves max_batch_size as the config has it."""
    out = tmp_path / "out"
    result = _tune(
        "--model-repository",
        str(repo),
        "--model",
        "simple",
        "--concurrency",
        "1,4",
        "--time-budget-s",
        "8",
        "--seconds-per-point",
        "0.2",
        "--output",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    rows = list(csv.DictReader((out / "tune.csv").open()))
    assert {r["max_batch"] for r in rows} == {"8"}, rows  # simple's max_batch_size
    assert {r["preferred_batch"] for r in rows} - {"-1"}, "the preferred size was not explored"
    config = text_format.Parse((out / "config.pbtxt").read_text(), mc.ModelConfig())
    assert config.max_batch_size == 8


def test_tune_warns_of_a_p99_from_few_requests(repo: Path) -> None:
    result = _tune(
        "--model-repository",
        str(repo),
        "--model",
        "densenet_onnx",
        "--concurrency",
        "1",
        "--time-budget-s",
        "1",
        "--seconds-per-point",
        "0.5",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    warning = [line for line in result.stdout.splitlines() if line.startswith("warning:")]
    assert warning, result.stdout
    assert "fewer than 100 requests" in warning[0]
    assert "--seconds-per-point" in warning[0]
    assert "(few)" in result.stdout


def test_apply_without_a_config_claims_no_backup(tmp_path: Path) -> None:
    """identity_fp32 has no config.pbtxt (auto-complete): --apply said it kept a
    config.pbtxt.bak that was never written."""
    repo = write_repository(tmp_path / "models")
    result = _tune(
        "--model-repository",
        str(repo),
        "--model",
        "identity_fp32",
        "--concurrency",
        "1",
        "--time-budget-s",
        "1",
        "--seconds-per-point",
        "0.1",
        "--apply",
    )
    assert result.returncode == 0, result.stderr
    folder = repo / "identity_fp32"
    assert (folder / "config.pbtxt").exists()
    assert not list(folder.glob("config.pbtxt.bak*"))
    assert "nothing to keep" in result.stdout
    assert "config.pbtxt.bak" not in result.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "nope"], "no model 'nope'"),
        (["--model", "simple", "--concurrency", "a,b"], "expected integers"),
        (["--model", "simple", "--concurrency", "0"], "each >= 1"),
        (["--model", "simple", "--latency-budget-ms", "-1"], "must be > 0"),
        (["--model", "simple", "--shape", "INPUT0"], "expected INPUT:D1xD2"),
    ],
)
def test_bad_arguments_are_refused(repo: Path, args: list[str], message: str) -> None:
    result = _tune("--model-repository", str(repo), *args, timeout=60)
    assert result.returncode == 2
    assert message in result.stderr


def test_refuses_a_model_serving_traffic(server: ServerProcess, repo: Path) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    inputs = [
        httpclient.InferInput("INPUT0", [1, 16], "INT32"),
        httpclient.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    for inp in inputs:
        inp.set_data_from_numpy(np.ones((1, 16), np.int32))
    client.infer("simple", inputs)
    args = ["--model-repository", str(repo), "--model", "simple", "--server-url", server.http_url]
    refused = _tune(*args, timeout=60)
    assert refused.returncode == 2
    assert "is serving 'simple'" in refused.stderr
    assert "--force" in refused.stderr
