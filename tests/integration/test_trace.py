"""The trace extension: settings over HTTP and gRPC, sampled timestamps and tensors in a
JSON-lines file."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.serverproc import ServerProcess

ORDER = [
    "REQUEST_START",
    "QUEUE_START",
    "COMPUTE_START",
    "COMPUTE_INPUT_END",
    "COMPUTE_OUTPUT_START",
    "COMPUTE_END",
    "REQUEST_END",
]


def _infer(client: httpclient.InferenceServerClient, model: str, request_id: str) -> None:
    inp = httpclient.InferInput("INPUT0", [1, 2], "UINT8")
    inp.set_data_from_numpy(np.zeros((1, 2), np.uint8))
    client.infer(model, [inp], request_id=request_id)


def _lines(path: Path, count: int) -> list[dict]:  # type: ignore[type-arg]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if path.exists():
            lines = [json.loads(line) for line in path.read_text().splitlines()]
            if len(lines) >= count:
                return lines
        time.sleep(0.02)
    raise AssertionError(f"{count} trace lines not written to {path}")


def test_model_trace_settings_sample_and_record_timestamps(
    model_repository: Path, start_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    trace_file = tmp_path / "trace.jsonl"
    server = start_server(model_repository, f"--trace-file={trace_file}")
    http = httpclient.InferenceServerClient(server.http_url)
    settings = http.update_trace_settings(
        "identity_uint8",
        {
            "trace_level": ["TIMESTAMPS"],
            "trace_rate": "2",
            "trace_count": "2",
        },
    )
    assert settings["trace_level"] == ["TIMESTAMPS"]
    assert settings["trace_rate"] == "2"
    assert settings["trace_file"] == str(trace_file)  # the flag's file
    assert http.get_trace_settings()["trace_level"] == ["OFF"]  # global untouched
    for i in range(8):
        _infer(http, "identity_uint8", f"r{i}")
    _lines(trace_file, 2)
    time.sleep(0.1)  # give a wrongly written third line the time to show up
    lines = _lines(trace_file, 2)
    assert len(lines) == 2  # trace_count
    assert [line["request_id"] for line in lines] == ["r1", "r3"]  # every 2nd request
    for line in lines:
        assert line["model_name"] == "identity_uint8"
        names = [t["name"] for t in line["timestamps"]]
        assert names == ORDER
        stamps = [t["ns"] for t in line["timestamps"]]
        assert stamps == sorted(stamps)
    # clearing the override falls back to the global settings
    cleared = http.update_trace_settings("identity_uint8", {"trace_level": None})
    assert cleared["trace_level"] == ["OFF"]


def test_tritonservers_trace_config_flags_trace_from_the_start(
    model_repository: Path, start_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """A tritonserver command line of today spells the trace flags `--trace-config`."""
    trace_file = tmp_path / "trace.jsonl"
    server = start_server(
        model_repository,
        f"--trace-config=triton,file={trace_file}",
        "--trace-config=level=TIMESTAMPS",
        "--trace-config=rate=3",
        "--trace-config=count=2",
    )
    http = httpclient.InferenceServerClient(server.http_url)
    settings = http.get_trace_settings()
    assert settings["trace_level"] == ["TIMESTAMPS"]
    assert (settings["trace_rate"], settings["trace_count"]) == ("3", "2")
    for i in range(9):
        _infer(http, "identity_uint8", f"r{i}")
    lines = _lines(trace_file, 2)
    assert [line["request_id"] for line in lines] == ["r2", "r5"]  # every 3rd, 2 in all
    assert [t["name"] for t in lines[0]["timestamps"]] == ORDER


def test_trace_log_frequency_splits_the_trace_file(
    model_repository: Path, start_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """--trace-log-frequency N (or triton,log-frequency=N): the traces go to <file>.0, .1, ...
    N each, as tritonserver's; the setting reads back, and a client may change it."""
    trace_file = tmp_path / "trace.jsonl"
    server = start_server(
        model_repository,
        f"--trace-file={trace_file}",
        "--trace-config=level=TIMESTAMPS",
        "--trace-rate=1",
        "--trace-log-frequency=2",
    )
    http = httpclient.InferenceServerClient(server.http_url)
    assert http.get_trace_settings()["log_frequency"] == "2"
    for i in range(5):
        _infer(http, "identity_uint8", f"r{i}")
    parts = [_lines(tmp_path / f"trace.jsonl.{n}", want) for n, want in ((0, 2), (1, 2), (2, 1))]
    assert [[line["request_id"] for line in part] for part in parts] == [
        ["r0", "r1"],
        ["r2", "r3"],
        ["r4"],
    ]
    assert not trace_file.exists()
    assert "--trace-log-frequency is a tritonserver flag" not in server.log()


def test_trace_settings_over_grpc_and_errors(server: ServerProcess) -> None:
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    settings = grpc.update_trace_settings("identity_int8", {"trace_rate": "5"}, as_json=True)
    assert settings["settings"]["trace_rate"]["value"] == ["5"]
    with pytest.raises(InferenceServerException, match="Unable to parse 'trace_rate', got: "):
        grpc.update_trace_settings("identity_int8", {"trace_rate": "often"})
    http = httpclient.InferenceServerClient(server.http_url)
    with pytest.raises(
        InferenceServerException, match="supports \\['OFF', 'TIMESTAMPS', 'TENSORS'\\]"
    ):
        http.update_trace_settings(settings={"trace_level": ["LOUD"]})
    with pytest.raises(InferenceServerException, match="Request for unknown model : nope"):
        http.get_trace_settings("nope")


@pytest.mark.parametrize("model", ["", "identity_int8"])
def test_a_client_cannot_choose_the_trace_file(
    server: ServerProcess, tmp_path: Path, model: str
) -> None:
    """As in tritonserver: the file is the --trace-file flag's, never a network client's."""
    target = tmp_path / "chosen-by-a-client.log"
    refused = "trace file location can not be updated through network protocol"
    http = httpclient.InferenceServerClient(server.http_url)
    with pytest.raises(InferenceServerException, match=refused) as caught:
        http.update_trace_settings(
            model, {"trace_file": str(target), "trace_level": ["TIMESTAMPS"], "trace_rate": "1"}
        )
    assert caught.value.status() == "501"  # UNSUPPORTED, as tritonserver and log_file
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException, match=refused) as caught:
        grpc.update_trace_settings(
            model, {"trace_file": str(target), "trace_level": ["TIMESTAMPS"], "trace_rate": "1"}
        )
    assert caught.value.status() == "StatusCode.UNIMPLEMENTED"
    # Nothing of the refused request was applied, and nothing is written.
    assert http.get_trace_settings(model)["trace_level"] == ["OFF"]
    assert http.get_trace_settings(model)["trace_file"] == ""
    _infer(http, "identity_uint8", "after-refusal")
    time.sleep(0.1)  # give a wrongly written trace line the time to show up
    assert not target.exists()


def _tensor_lines(lines: list[dict], trace_id: int) -> list[tuple[str, dict]]:  # type: ignore[type-arg]
    return [
        (line["activity"], line["tensor"])
        for line in lines
        if line["id"] == trace_id and "activity" in line
    ]


def test_trace_level_tensors_writes_the_values_of_a_traced_requests_tensors(
    model_repository: Path, start_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """TENSORS, as tritonserver: each input (TENSOR_QUEUE_INPUT) and output
    (TENSOR_BACKEND_OUTPUT) of a traced request is an entry of its own, its values in `data`;
    a huge tensor is cut with a marker; TIMESTAMPS alone writes the timestamps only."""
    trace_file = tmp_path / "trace.jsonl"
    server = start_server(
        model_repository,
        f"--trace-file={trace_file}",
        "--trace-level=TENSORS",  # combined with --trace-config's level, as there
        "--trace-config=level=TIMESTAMPS",
        "--trace-rate=1",
    )
    http = httpclient.InferenceServerClient(server.http_url)
    assert http.get_trace_settings()["trace_level"] == ["TIMESTAMPS", "TENSORS"]
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 3, np.int32)
    inputs = [
        httpclient.InferInput("INPUT0", [1, 16], "INT32"),
        httpclient.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    http.infer("simple", inputs, request_id="add")
    lines = _lines(trace_file, 5)
    head = lines[0]
    assert (head["model_name"], head["request_id"]) == ("simple", "add")
    assert [t["name"] for t in head["timestamps"]] == ORDER
    joined = lambda array: ",".join(str(v) for v in array.reshape(-1))  # noqa: E731
    assert _tensor_lines(lines, head["id"]) == [
        (
            "TENSOR_QUEUE_INPUT",
            {"name": "INPUT0", "data": joined(a), "shape": "1,16", "dtype": "INT32"},
        ),
        (
            "TENSOR_QUEUE_INPUT",
            {"name": "INPUT1", "data": joined(b), "shape": "1,16", "dtype": "INT32"},
        ),
        (
            "TENSOR_BACKEND_OUTPUT",
            {"name": "OUTPUT0", "data": joined(a + b), "shape": "1,16", "dtype": "INT32"},
        ),
        (
            "TENSOR_BACKEND_OUTPUT",
            {"name": "OUTPUT1", "data": joined(a - b), "shape": "1,16", "dtype": "INT32"},
        ),
    ]

    # A huge tensor adds a bounded entry, cut with a marker (trace.MAX_TENSOR_ELEMENTS).
    big = httpclient.InferInput("INPUT0", [1, 300_000], "FP32")
    big.set_data_from_numpy(np.full((1, 300_000), 0.5, np.float32))
    before = trace_file.stat().st_size
    http.infer("identity_fp32", [big], request_id="big")
    lines = _lines(trace_file, 8)
    assert trace_file.stat().st_size - before < 20_000  # 2.4 MB of values in the request
    entries = _tensor_lines(lines, lines[5]["id"])
    assert [(activity, t["name"], t["shape"]) for activity, t in entries] == [
        ("TENSOR_QUEUE_INPUT", "INPUT0", "1,300000"),
        ("TENSOR_BACKEND_OUTPUT", "OUTPUT0", "1,300000"),
    ]
    for _, tensor in entries:
        assert tensor["truncated"] is True
        assert tensor["data"].startswith("0.5,0.5,")
        assert tensor["data"].endswith(",0.5...(truncated: 300000 elements in all)")
        assert tensor["data"].count("0.5") == 1024

    # Over gRPC, a model's override: TENSORS alone, no timestamps; BYTES elements quoted.
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    override = grpc.update_trace_settings(
        "identity_bytes", {"trace_level": ["TENSORS"]}, as_json=True
    )
    assert override["settings"]["trace_level"]["value"] == ["TENSORS"]
    words = grpcclient.InferInput("INPUT0", [1, 2], "BYTES")
    words.set_data_from_numpy(np.array([[b"hello", b"tensor"]], dtype=np.object_))
    grpc.infer("identity_bytes", [words], request_id="words")
    lines = _lines(trace_file, 11)
    assert lines[8]["request_id"] == "words"
    assert "timestamps" not in lines[8]
    assert _tensor_lines(lines, lines[8]["id"]) == [
        (
            "TENSOR_QUEUE_INPUT",
            {"name": "INPUT0", "data": '"hello","tensor"', "shape": "1,2", "dtype": "BYTES"},
        ),
        (
            "TENSOR_BACKEND_OUTPUT",
            {"name": "OUTPUT0", "data": '"hello","tensor"', "shape": "1,2", "dtype": "BYTES"},
        ),
    ]

    # TIMESTAMPS alone: one line a trace, as before.
    assert http.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"]})["trace_level"] == [
        "TIMESTAMPS"
    ]
    http.infer("simple", inputs, request_id="plain")
    _infer(http, "identity_uint8", "last")  # the line after it shows "plain" wrote one line
    lines = _lines(trace_file, 13)
    assert [line["request_id"] for line in lines[11:]] == ["plain", "last"]
    assert [t["name"] for t in lines[11]["timestamps"]] == ORDER
