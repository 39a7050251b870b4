"""The benchmark's ceilings (bench/ceiling_http.py, bench/ceiling_grpc.py) still answer real
tritonclient inferences, so `python -m bench.run` never divides by a broken reference; the ORT
references (`--simple-compute ort`) really run `simple` through ONNX Runtime, and never stand in
for the numpy ceilings in a ratio or a target."""

from __future__ import annotations

import queue
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from bench import cpu_per_request
from bench import run as bench_run
from bench.ceiling_models import _add_sub, load_model
from bench.ceilings import (
    CEILINGS,
    KINDS,
    ORT_CEILINGS,
    for_protocol,
    inference_count,
    ort_for_protocol,
    start_ceiling,
    wait_listening,
)
from bench.common import Stats
from bench.raw import open_session
from bench.report import (
    RAW,
    RAW_ORT,
    SERVER,
    Row,
    best_ceiling,
    of_ceiling,
    paired_ratios,
    pct_of_raw,
    target_checks,
)
from bench.server import Server, stop_server
from configs.generate import write_repository

MODELS = ["simple", "squeezenet_onnx"]
GRPC_CEILINGS = for_protocol("grpc", CEILINGS)
StartCeiling = Callable[..., Server]


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_repository(tmp_path_factory.mktemp("ceilings") / "models")


@pytest.fixture(scope="module")
def start(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[StartCeiling]:
    """Each ceiling (with a set of models) starts once for the module and stops after it."""
    started: dict[tuple[str, tuple[str, ...]], Server] = {}
    logs = tmp_path_factory.mktemp("ceiling-logs")

    def run(kind: str, models: list[str] = MODELS) -> Server:
        key = (kind, tuple(models))
        if key not in started or not started[key].alive():
            log = logs / f"{kind}-{len(started)}.log"
            started[key] = start_ceiling(kind, repository, models, None, log)
            wait_listening(started[key], timeout_s=60)
        return started[key]

    yield run
    for ceiling in started.values():
        stop_server(ceiling)


def simple_inputs() -> tuple[np.ndarray, np.ndarray]:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    return a, np.full((1, 16), 3, dtype=np.int32)


def image() -> np.ndarray:
    return np.random.default_rng(0).random((1, 3, 224, 224), dtype=np.float32)


def raw_scores(repository: Path, data: np.ndarray, model: str = "squeezenet_onnx") -> np.ndarray:
    session = open_session(str(repository / model / "1" / "model.onnx"))
    return np.asarray(session.run(None, {"data_0": data})[0])


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_aiohttp_ceiling_answers_tritonclient_http(start: StartCeiling, binary: bool) -> None:
    ceiling = start("aiohttp")
    client = httpclient.InferenceServerClient(ceiling.http_url)
    assert client.is_server_ready()
    assert client.get_model_metadata("simple")["inputs"][0]["shape"] == [-1, 16]
    assert client.get_model_config("simple")["max_batch_size"] == 8
    a, b = simple_inputs()
    inputs = [httpclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    inputs[0].set_data_from_numpy(a, binary_data=binary)
    inputs[1].set_data_from_numpy(b, binary_data=binary)
    outputs = [
        httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("OUTPUT0", "OUTPUT1")
    ]
    before = inference_count("aiohttp", ceiling, "simple")
    result = client.infer("simple", inputs, outputs=outputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    assert before is not None
    assert inference_count("aiohttp", ceiling, "simple") == before + 1  # bench.run's CPU us


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_aiohttp_ceiling_runs_the_image_model(
    start: StartCeiling, repository: Path, binary: bool
) -> None:
    """Also as JSON: ~3 MB, past aiohttp's default 1 MiB body limit."""
    ceiling = start("aiohttp")
    client = httpclient.InferenceServerClient(ceiling.http_url)
    data = image()
    tensor = httpclient.InferInput("data_0", list(data.shape), "FP32")
    tensor.set_data_from_numpy(data, binary_data=binary)
    result = client.infer("squeezenet_onnx", [tensor])
    np.testing.assert_allclose(
        result.as_numpy("softmaxout_1"), raw_scores(repository, data), rtol=1e-5, atol=1e-6
    )


@pytest.mark.parametrize("kind", GRPC_CEILINGS)
def test_grpc_ceiling_answers_tritonclient_grpc(start: StartCeiling, kind: str) -> None:
    ceiling = start(kind)
    client = grpcclient.InferenceServerClient(ceiling.grpc_url)
    assert client.is_server_ready()
    assert client.get_model_config("simple").config.max_batch_size == 8
    a, b = simple_inputs()
    inputs = [grpcclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    before = inference_count(kind, ceiling, "simple")
    result = client.infer("simple", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    assert before is not None
    assert inference_count(kind, ceiling, "simple") == before + 1  # bench.run's CPU us
    with pytest.raises(Exception, match="unknown model 'nope'"):
        client.get_model_metadata("nope")


@pytest.mark.parametrize("kind", GRPC_CEILINGS)
async def test_grpc_ceiling_answers_tritonclient_grpc_aio(
    start: StartCeiling, repository: Path, kind: str
) -> None:
    ceiling = start(kind)
    client = grpcaio.InferenceServerClient(ceiling.grpc_url)
    try:
        metadata = await client.get_model_metadata("squeezenet_onnx")
        assert [list(t.shape) for t in metadata.inputs] == [[-1, 3, 224, 224]]
        data = image()
        tensor = grpcaio.InferInput("data_0", list(data.shape), "FP32")
        tensor.set_data_from_numpy(data)
        result = await client.infer("squeezenet_onnx", [tensor])
    finally:
        await client.close()
    np.testing.assert_allclose(
        result.as_numpy("softmaxout_1"), raw_scores(repository, data), rtol=1e-5, atol=1e-6
    )


def test_grpc_ceiling_applies_the_configs_reshape(start: StartCeiling, repository: Path) -> None:
    """densenet_onnx takes an unbatched [3,224,224] and answers [1000] (reshape in its config)."""
    ceiling = start("grpc-sync", ["densenet_onnx"])
    client = grpcclient.InferenceServerClient(ceiling.grpc_url)
    data = image()
    tensor = grpcclient.InferInput("data_0", [3, 224, 224], "FP32")
    tensor.set_data_from_numpy(data[0])
    result = client.infer("densenet_onnx", [tensor])
    scores = result.as_numpy("fc6_1")
    assert scores.shape == (1000,)
    expected = raw_scores(repository, data, "densenet_onnx").reshape(1000)
    np.testing.assert_allclose(scores, expected, rtol=1e-4, atol=1e-5)


def test_report_divides_by_the_best_ceiling_of_the_same_point() -> None:
    def row(protocol: str, server: str, rate: float, concurrency: int = 8) -> Row:
        return Row("m", protocol, concurrency, Stats(rate, 1.0, 2.0, 100), "pa", server=server)

    server = row("grpc", "edge-appliance", 50.0)
    rows = [
        row(RAW_ORT, RAW, 100.0, 1),
        server,
        row("grpc", "grpc-aio", 80.0),
        row("grpc", "grpc-sync", 125.0),
        row("grpc", "grpc-sync", 500.0, concurrency=1),  # another point
        row("http-binary", "aiohttp", 1000.0),  # another protocol
    ]
    ceiling = best_ceiling(rows, server)
    assert ceiling is not None
    assert ceiling.server == "grpc-sync"
    assert of_ceiling(rows, server) == pytest.approx(0.4)
    assert pct_of_raw(rows, server) == pytest.approx(50.0)
    assert best_ceiling(rows, rows[2]) is None  # a ceiling has no ceiling


def test_repeated_rounds_pair_each_point_with_its_own_round() -> None:
    """A busy round (everything at half speed) does not skew the ratio: each round is divided
    by its own ceiling and raw ORT, then the median is taken."""

    def round_rows(scale: float, server_rate: float) -> list[Row]:
        def row(protocol: str, server: str, rate: float, concurrency: int = 8) -> Row:
            stats = Stats(rate * scale, 1.0, 2.0, 100)
            return Row("m", protocol, concurrency, stats, "pa", server=server)

        return [
            row(RAW_ORT, RAW, 100.0, 1),
            row("grpc", "edge-appliance", server_rate),
            row("grpc", "grpc-sync", 100.0),
        ]

    rounds = [round_rows(1.0, 60.0), round_rows(0.5, 70.0), round_rows(1.0, 90.0)]
    x_raw, x_ceiling = paired_ratios(rounds, ("grpc", 8, "edge-appliance"))
    assert x_raw == pytest.approx(0.7)
    assert x_ceiling == pytest.approx(0.7)
    assert paired_ratios(rounds, ("http-binary", 8, "edge-appliance")) == (None, None)


@pytest.mark.parametrize("kind", GRPC_CEILINGS)
def test_grpc_ceiling_streams_beside_unary_calls(start: StartCeiling, kind: str) -> None:
    """Nine open streams (one per perf_analyzer context) leave room for unary calls: a sync pool
    of eight threads hung perf_analyzer --streaming."""
    ceiling = start(kind)
    replies: queue.Queue[Any] = queue.Queue()
    clients = [grpcclient.InferenceServerClient(ceiling.grpc_url) for _ in range(9)]
    a, b = simple_inputs()
    inputs = [grpcclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    try:
        for client in clients:
            client.start_stream(callback=lambda result, error: replies.put(error or result))
            client.async_stream_infer("simple", inputs)
        for _ in clients:
            reply = replies.get(timeout=10)
            np.testing.assert_array_equal(reply.as_numpy("OUTPUT0"), a + b)
        unary = grpcclient.InferenceServerClient(ceiling.grpc_url)
        stats = unary.get_inference_statistics("simple", client_timeout=10)
        assert stats.model_stats[0].name == "simple"
        result = unary.infer("simple", inputs, client_timeout=10)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    finally:
        for client in clients:
            client.stop_stream()


@pytest.mark.parametrize("kind", CEILINGS)
def test_ceilings_refuse_inputs_the_model_cannot_take(start: StartCeiling, kind: str) -> None:
    """A 400 / INVALID_ARGUMENT, never a 500 or a dropped connection."""
    ceiling = start(kind)
    module = httpclient if kind == "aiohttp" else grpcclient
    client = module.InferenceServerClient(ceiling.http_url)
    a = np.zeros((1, 16), dtype=np.int32)
    b = np.zeros((1, 8), dtype=np.int32)  # add/sub cannot broadcast [1,16] with [1,8]
    inputs = [
        module.InferInput("INPUT0", [1, 16], "INT32"),
        module.InferInput("INPUT1", [1, 8], "INT32"),
    ]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    with pytest.raises(InferenceServerException) as caught:
        client.infer("simple", inputs)
    assert "model 'simple'" in caught.value.message()
    expected = "400" if kind == "aiohttp" else "StatusCode.INVALID_ARGUMENT"
    assert caught.value.status() == expected


# ---- the ceilings that compute `simple` with ONNX Runtime (references only) ------------------

ORT_UNDER_TEST = ["aiohttp-ort", "grpc-sync-ort"]  # grpc-aio-ort: the same flag, one start less


def simple_infer(kind: str, url: str, a: np.ndarray, b: np.ndarray) -> Any:
    module = httpclient if kind.startswith("aiohttp") else grpcclient
    inputs = []
    for name, data in (("INPUT0", a), ("INPUT1", b)):
        inputs.append(module.InferInput(name, list(data.shape), "INT32"))
        inputs[-1].set_data_from_numpy(data)
    return module.InferenceServerClient(url).infer("simple", inputs)


@pytest.mark.parametrize("kind", ORT_UNDER_TEST)
def test_ort_ceiling_answers_simple_through_onnx_runtime(start: StartCeiling, kind: str) -> None:
    """The right sum and difference, counted; and ONNX Runtime (not numpy) refuses a [1,8]
    second input: its own error comes back, so the flag reached the server."""
    ceiling = start(kind, ["simple"])
    a = np.arange(-8, 8, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 5, dtype=np.int32)
    before = inference_count(kind, ceiling, "simple")
    result = simple_infer(kind, ceiling.http_url, a, b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    assert before is not None
    assert inference_count(kind, ceiling, "simple") == before + 1
    with pytest.raises(InferenceServerException) as caught:
        simple_infer(kind, ceiling.http_url, a, np.zeros((1, 8), dtype=np.int32))
    assert "ONNXRuntimeError" in caught.value.message()
    assert caught.value.status() == (
        "400" if kind == "aiohttp-ort" else "StatusCode.INVALID_ARGUMENT"
    )


def test_numpy_ceiling_does_not_run_simple_through_onnx_runtime(start: StartCeiling) -> None:
    """The default stays numpy: its error for the same input is numpy's broadcasting one."""
    ceiling = start("grpc-sync")
    a = np.zeros((1, 16), dtype=np.int32)
    with pytest.raises(InferenceServerException) as caught:
        simple_infer("grpc-sync", ceiling.grpc_url, a, np.zeros((1, 8), dtype=np.int32))
    assert "broadcast" in caught.value.message()
    assert "ONNXRuntimeError" not in caught.value.message()


def test_load_model_picks_the_simple_compute(repository: Path) -> None:
    numpy_model = load_model(repository, "simple")
    ort_model = load_model(repository, "simple", "ort")
    assert (numpy_model.computed_by, ort_model.computed_by) == ("numpy", "onnxruntime")
    assert numpy_model.compute._compute is _add_sub
    assert ort_model.compute._compute is not _add_sub
    a, b = simple_inputs()
    outputs = ort_model.compute({"INPUT0": a, "INPUT1": b})
    np.testing.assert_array_equal(outputs["OUTPUT0"], a + b)
    np.testing.assert_array_equal(outputs["OUTPUT1"], a - b)
    with pytest.raises(ValueError, match="simple_compute"):
        load_model(repository, "simple", "torch")


def test_ort_ceilings_never_stand_for_a_protocol() -> None:
    assert for_protocol("grpc", KINDS) == ["grpc-aio", "grpc-sync"]
    assert for_protocol("http-binary", KINDS) == ["aiohttp"]
    assert for_protocol("grpc", ORT_CEILINGS) == []
    assert ort_for_protocol("grpc", KINDS) == ["grpc-aio-ort", "grpc-sync-ort"]
    assert ort_for_protocol("http-json", KINDS) == ["aiohttp-ort"]
    assert set(ORT_CEILINGS).isdisjoint(CEILINGS)


def ort_point_rows(scale: float = 1.0, numpy_ceiling: bool = True) -> list[Row]:
    """`simple` over gRPC: the server at 300, the numpy ceiling at 400, an ORT reference made
    (unrealistically) faster than both at 1000, so picking it would change every ratio."""

    def row(protocol: str, server: str, rate: float, cpu_us: float, c: int = 8) -> Row:
        stats = Stats(rate * scale, 1.0, 2.0, 100)
        return Row("simple", protocol, c, stats, "pa", server=server, cpu_us=cpu_us)

    rows = [row(RAW_ORT, RAW, 5000.0, 200.0, 1), row("grpc", SERVER, 300.0, 300.0)]
    if numpy_ceiling:
        rows.append(row("grpc", "grpc-sync", 400.0, 240.0))
    rows.append(row("grpc", "grpc-sync-ort", 1000.0, 100.0))
    return rows


def test_the_ratio_and_the_targets_never_use_an_ort_reference() -> None:
    rows = ort_point_rows()
    server = rows[1]
    text = bench_run.render(["header"], rows, markdown=True)
    main_table, _, rest = text.partition(bench_run.ORT_NOTE)
    assert "| grpc-sync 400 | 0.75 (0.80) |" in main_table  # x ceiling: 300 / 400 (CPU 240 / 300)
    assert "grpc-sync-ort" not in main_table
    assert "grpc-sync-ort" in rest  # shown, as its own table
    assert "simple grpc c=8: edge-appliance 0.30 of the grpc-sync-ort reference" in rest
    assert "(by CPU per inference 0.33)" in rest
    checks = [c for c in text.splitlines() if "of the" in c and "ceiling (goal" in c]
    assert checks == [
        "- PASS simple grpc c=8: 0.75 of the grpc-sync ceiling (goal >= 0.70); by CPU per "
        "inference 0.80"
    ]
    # Without a numpy ceiling there is no ratio and no ceiling target, rather than the ORT one.
    alone = ort_point_rows(numpy_ceiling=False)
    counted = bench_run.counted_rows(alone)
    assert best_ceiling(counted, alone[1]) is None
    assert not [c for c in target_checks(counted) if "ceiling" in c]
    assert "of the grpc-sync-ort ceiling" not in bench_run.render([], alone, markdown=True)
    # With --repeat, each round's paired ratio is against the numpy ceiling too.
    rounds = [ort_point_rows(1.0), ort_point_rows(0.5), ort_point_rows(1.0)]
    [chosen] = [r for r in bench_run.medians(rounds) if r.is_server]
    assert chosen.x_ceiling == pytest.approx(0.75)
    # bench.report alone would take the fastest row of the point: the filter is what keeps it out.
    assert of_ceiling(rows, server) == pytest.approx(0.3)


def test_bench_run_measures_ort_references_on_simple_only(tmp_path: Path) -> None:
    parser = bench_run.build_parser()
    args = parser.parse_args(
        ["--models", "simple,squeezenet_onnx", "--ceilings", "grpc-sync,grpc-sync-ort"]
    )
    plan = bench_run.make_plan(args, parser)
    assert plan.ceilings == ("grpc-sync", "grpc-sync-ort")
    assert bench_run.make_plan(parser.parse_args([]), parser).ceilings == CEILINGS  # default
    servers = {kind: cast(Server, kind) for kind in plan.ceilings}  # only their names are read
    ctx = bench_run.Context(plan, cast(Server, SERVER), None, tmp_path, servers, tmp_path)
    assert [n for n, _ in ctx.targets("grpc", "simple")] == [SERVER, "grpc-sync", "grpc-sync-ort"]
    assert [n for n, _ in ctx.targets("grpc", "squeezenet_onnx")] == [SERVER, "grpc-sync"]
    assert [n for n, _ in ctx.targets("http-binary", "simple")] == [SERVER]
    with pytest.raises(SystemExit):
        bench_run.make_plan(
            parser.parse_args(["--models", "squeezenet_onnx", "--ceilings", "grpc-sync-ort"]),
            parser,
        )


def test_cpu_per_request_knows_the_ort_ceilings() -> None:
    args = cpu_per_request.CEILING_ARGS
    for kind in ("http", "aio", "sync"):
        assert args[kind + "-ort"] == [*args[kind], "--simple-compute", "ort"]
        assert "--simple-compute" not in args[kind]
    points = [("simple", "grpc"), ("simple", "http"), ("squeezenet_onnx", "grpc")]
    assert cpu_per_request.ceiling_points("sync", points) == [points[0], points[2]]
    assert cpu_per_request.ceiling_points("sync-ort", points) == [points[0]]
    assert cpu_per_request.ceiling_points("http-ort", points) == [points[1]]


def test_bench_run_turns_the_order_round_by_round(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server goes first in even rounds and last in odd ones, so that neither it nor its
    ceilings always get the same turn."""
    parser = bench_run.build_parser()
    args = parser.parse_args(
        ["--models", "simple", "--protocols", "grpc", "--concurrency", "8", "--repeat", "3",
         "--ceilings", "grpc-aio,grpc-sync"]
    )  # fmt: skip
    plan = bench_run.make_plan(args, parser)
    servers = {kind: cast(Server, kind) for kind in plan.ceilings}
    ctx = bench_run.Context(plan, cast(Server, SERVER), None, tmp_path, servers, tmp_path)
    order: list[str] = []

    def measured(
        ctx: Any, target: tuple[str, Server], model: str, protocol: str, concurrency: int
    ) -> bench_run.Row:
        order.append(target[0])
        return bench_run.Row(model, protocol, concurrency, None, "-", "not run", server=target[0])

    monkeypatch.setattr(bench_run, "measure_target", measured)
    monkeypatch.setattr(
        bench_run, "raw_row", lambda *a: bench_run.Row("simple", "raw ORT", 1, None, "-", "no")
    )
    monkeypatch.setattr(bench_run.Context, "pids", lambda self: [])
    bench_run.measure_server(ctx)
    forward = [SERVER, "grpc-aio", "grpc-sync"]
    assert order == forward + forward[::-1] + forward


def test_the_grpc_floor_answers_python_vs_tritons_add_sub(tmp_path: Path) -> None:
    """bench.python_vs_triton --floors: the sync ceiling serves its add_sub (a Python model's
    repository, no model.onnx) with numpy, and counts what it answered."""
    from bench.python_vs_triton import build

    repository = build(tmp_path / "models")
    server = start_ceiling("grpc-sync", repository, ["add_sub"], None, tmp_path / "floor.log")
    try:
        wait_listening(server, timeout_s=60)
        a, b = np.arange(4, dtype=np.float32), np.full(4, 2.5, dtype=np.float32)
        inputs = [
            grpcclient.InferInput("INPUT0", [4], "FP32"),
            grpcclient.InferInput("INPUT1", [4], "FP32"),
        ]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(b)
        with grpcclient.InferenceServerClient(server.grpc_url) as client:
            result = client.infer("add_sub", inputs)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
        assert inference_count("grpc-sync", server, "add_sub") == 1
    finally:
        stop_server(server)
