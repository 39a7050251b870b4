"""The log tells a newcomer what runs and how it went (issue 37, item 10): a first line with the
version, commit and main settings; a summary when ready ("2 of 3 models ready, 1 not ready:
broken (...)"); a Python model's lines in the server's format, with its timestamp, in its log
file. Before: no first line, a bare "server is ready", and a Python model's lines written by
its process to stderr without a timestamp (never into --log-file)."""

from __future__ import annotations

import re
from pathlib import Path

import onnx

from tests.integration.models import _add_constant_model
from tests.serverproc import ROOT

TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ ")

LOGGING_MODEL = """\
import logging

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        pb_utils.Logger.log_info("hello from initialize")
        logging.getLogger("mine").warning("a warning of its own")
        pb_utils.Logger.log_info("one line\\nFORGED ERROR appliance.server.app: a forged line")

    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())]
            )
            for r in requests
        ]
"""

LOGGING_CONFIG = """\
backend: "python"
max_batch_size: 0
input [{ name: "IN", data_type: TYPE_INT32, dims: [1] }]
output [{ name: "OUT", data_type: TYPE_INT32, dims: [1] }]
"""


def _repository(root: Path) -> Path:
    (root / "good" / "1").mkdir(parents=True)
    (root / "good" / "config.pbtxt").write_text(
        'name: "good"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 4\n'
    )
    onnx.save(_add_constant_model(1), str(root / "good" / "1" / "model.onnx"))
    (root / "broken" / "1").mkdir(parents=True)
    (root / "broken" / "config.pbtxt").write_text(
        'name: "broken"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 4\n'
    )
    (root / "broken" / "1" / "model.onnx").write_bytes(b"not an onnx file")
    (root / "pylog" / "1").mkdir(parents=True)
    (root / "pylog" / "config.pbtxt").write_text(LOGGING_CONFIG)
    (root / "pylog" / "1" / "model.py").write_text(LOGGING_MODEL)
    return root


def test_the_log_says_what_runs_how_start_up_went_and_stamps_python_model_lines(
    start_server, tmp_path: Path
) -> None:
    repo = _repository(tmp_path / "models")
    log_file = tmp_path / "server-file.log"
    proc = start_server(repo, f"--log-file={log_file}", "--log-format=default")
    lines = log_file.read_text().splitlines()
    first = lines[0]
    assert TIMESTAMP.match(first), first
    assert re.search(r"edge-appliance \S+ \(commit \S+\) starting: ", first), first
    if (ROOT / ".git").exists():  # a checkout: the commit is known (the reshape lost it)
        assert "(commit unknown)" not in first, first
    for part in (
        f"HTTP 127.0.0.1:{proc.http_port}",
        f"gRPC 127.0.0.1:{proc.grpc_port}",
        f"metrics 127.0.0.1:{proc.metrics_port}",
        f"repositories {repo}",
        "model control mode none",
        "state dir ",
    ):
        assert part in first, first
    ready = [line for line in lines if "server is ready" in line]
    assert ready, lines
    assert "server is ready: 2 of 3 models ready, 1 not ready: broken (" in ready[0]
    hello = [line for line in lines if "hello from initialize" in line]
    assert hello, "the Python model's line is not in the server's log file"
    assert TIMESTAMP.match(hello[0]), hello[0]
    assert "INFO python_model: python model 'pylog': hello from initialize" in hello[0]
    own = [line for line in lines if "a warning of its own" in line]
    assert own, lines
    assert TIMESTAMP.match(own[0]), own[0]
    assert "WARNING python_model: python model 'pylog': mine: a warning of its own" in own[0]
    # A model cannot forge the server's lines: a newline in its message is escaped.
    assert not [line for line in lines if line.startswith("FORGED")], lines
    assert any("one line\\x0aFORGED ERROR" in line for line in lines), lines
