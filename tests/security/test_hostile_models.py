"""Hostile model files (issue 31): each is refused at load with its reason, or contained, and
the server stays up: the model is not ready, a canary model answers, no 5xx, no traceback,
memory within +50 MB.

The files are made here: ONNX graphs whose declared shapes or constant-folded outputs are
terabytes, graphs nested deeper than any real model, external data pointing out of the
model's folder or at a 10 GB sparse file, protobuf bombs, a TorchScript archive whose pickle
would run a command, zip slip names in an archive, an OpenVINO IR with an external entity,
and links out of the repository.
"""

from __future__ import annotations

import io
import os
import pickle
import warnings
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from configs.generate import IR_VERSION, OPSET, SIMPLE_CONFIG, save, simple_model
from tests.security.harness import Http, Watch
from tests.serverproc import ServerProcess

TB = 1 << 40


@pytest.fixture(scope="module")
def watch(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Watch]:
    root = tmp_path_factory.mktemp("hostile_models")
    save(simple_model(), root / "simple" / "1" / "model.onnx")
    (root / "simple" / "config.pbtxt").write_text(SIMPLE_CONFIG)
    # Good models of the other backends, so that their libraries (torch: 220 MB) are in
    # before the memory baseline.
    import torch

    (root / "good_torch" / "1").mkdir(parents=True)
    with warnings.catch_warnings():  # torch 2.13: "torch.jit.script is deprecated"
        warnings.simplefilter("ignore", DeprecationWarning)
        scripted = torch.jit.script(torch.nn.Identity())
    scripted.save(str(root / "good_torch" / "1" / "model.pt"))
    (root / "good_torch" / "config.pbtxt").write_text(
        'name: "good_torch"\nbackend: "pytorch"\nmax_batch_size: 0\n'
        'input [ { name: "INPUT__0", data_type: TYPE_FP32, dims: [ 1 ] } ]\n'
        'output [ { name: "OUTPUT__0", data_type: TYPE_FP32, dims: [ 1 ] } ]\n'
    )
    save(
        _model([helper.make_node("Identity", ["x"], ["y"])], [_in()], [_in("y")]),
        root / "good_openvino" / "1" / "model.onnx",
    )
    (root / "good_openvino" / "config.pbtxt").write_text(
        'name: "good_openvino"\nbackend: "openvino"\ndefault_model_filename: "model.onnx"\n'
    )
    proc = ServerProcess(
        root,
        "--model-control-mode=explicit",
        "--load-model=simple",
        "--load-model=good_torch",
        "--load-model=good_openvino",
        log_path=tmp_path_factory.mktemp("hostile_models_logs") / "server.log",
    )
    try:
        proc.wait_ready(timeout_s=120)
        found = Watch(proc)
        found.root = root  # type: ignore[attr-defined]
        yield found
    finally:
        proc.stop()


def _model(nodes, inputs, outputs, initializers=()) -> onnx.ModelProto:  # type: ignore[no-untyped-def]
    graph = helper.make_graph(nodes, "hostile", inputs, outputs, list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    return model


def _out(name: str = "y", elem: int = TensorProto.FLOAT) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, None)


def _in(name: str = "x", shape: list[int] | None = None) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape or [1])


def _ints(name: str, values: list[int]) -> onnx.TensorProto:
    return helper.make_tensor(name, TensorProto.INT64, [len(values)], values)


def _add_x(model_out: str = "big") -> onnx.NodeProto:
    return helper.make_node("Add", ["x", model_out], ["y"])


def _external(name: str, location: str, elements: int, **extra: str) -> onnx.TensorProto:
    tensor = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=[elements])
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in {"location": location, **extra}.items():
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    return tensor


def _with_weight(weight: onnx.TensorProto) -> onnx.ModelProto:
    return _model([helper.make_node("Add", ["x", weight.name], ["y"])], [_in()], [_out()], [weight])


def _field(number: int, payload: bytes) -> bytes:
    """One length-delimited protobuf field."""
    size, length = len(payload), b""
    while True:
        byte, size = size & 0x7F, size >> 7
        length += bytes([byte | (0x80 if size else 0)])
        if not size:
            break
    return bytes([number << 3 | 2]) + length + payload


def _nested_graphs(depth: int) -> bytes:
    """A model whose graph nests `depth` If nodes, each holding the next graph in its
    then_branch: written as bytes, as protobuf's own writers refuse past 100 levels."""
    graph = _field(1, b"")  # an empty node
    for _ in range(depth):
        attribute = _field(1, b"then_branch") + b"\xa0\x01\x05" + _field(6, graph)  # type: GRAPH
        graph = _field(1, _field(4, b"If") + _field(5, attribute))
    return bytes([1 << 3, IR_VERSION]) + _field(8, _field(2, bytes([OPSET]))) + _field(7, graph)


def _bytes(model: onnx.ModelProto) -> bytes:
    return model.SerializeToString()


ONNX_CONFIG = 'name: "{name}"\nbackend: "onnxruntime"\n'


def _write_onnx(folder: Path, model: onnx.ModelProto | bytes) -> None:
    (folder / "1").mkdir(parents=True)
    data = model if isinstance(model, bytes) else _bytes(model)
    (folder / "1" / "model.onnx").write_bytes(data)


def _sparse_size() -> int:
    """10 GB, or more than this machine's memory where that is more."""
    return max(10 << 30, os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


class _Evil:
    """A pickle that would run a command when unpickled."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (os.system, (f"touch {self.marker}",))


def _torchscript(folder: Path, marker: Path, slip: bool) -> None:
    (folder / "1").mkdir(parents=True)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("archive/data.pkl", pickle.dumps(_Evil(marker), protocol=2))
        archive.writestr("archive/constants.pkl", pickle.dumps(_Evil(marker), protocol=2))
        archive.writestr("archive/version", "3\n")
        if slip:
            archive.writestr(f"../../../../../../{marker}", b"x")
            archive.writestr(str(marker), b"x")
    (folder / "1" / "model.pt").write_bytes(buffer.getvalue())
    (folder / "config.pbtxt").write_text(
        f'name: "{folder.name}"\nbackend: "pytorch"\nmax_batch_size: 0\n'
        'input [ { name: "INPUT__0", data_type: TYPE_FP32, dims: [ 1 ] } ]\n'
        'output [ { name: "OUTPUT__0", data_type: TYPE_FP32, dims: [ 1 ] } ]\n'
    )


XXE = """<?xml version="1.0"?>
<!DOCTYPE net [ <!ENTITY leak SYSTEM "file:///etc/passwd"> <!ENTITY a "&leak;&leak;"> ]>
<net name="&leak;" version="11"><layers/><edges/></net>
"""

Maker = Callable[[Path, Path], None]  # (model folder, a path outside that must stay absent)


def _onnx_case(model: Callable[[Path], onnx.ModelProto | bytes]) -> Maker:
    def make(folder: Path, outside: Path) -> None:
        _write_onnx(folder, model(outside))
        (folder / "config.pbtxt").write_text(ONNX_CONFIG.format(name=folder.name))

    return make


def _huge_constant(op: str) -> Callable[[Path], onnx.ModelProto]:
    """A node with constant inputs whose output would be terabytes (folded at load)."""

    def model(_: Path) -> onnx.ModelProto:
        side = 1 << 21  # [2**21, 2**21] FP32: 16 TB
        if op == "ConstantOfShape":
            nodes = [helper.make_node("ConstantOfShape", ["shape"], ["big"])]
            inits = [_ints("shape", [side, side])]
        elif op == "Tile":
            nodes = [helper.make_node("Tile", ["one", "reps"], ["big"])]
            inits = [
                helper.make_tensor("one", TensorProto.FLOAT, [1, 1], [1.0]),
                _ints("reps", [side, side]),
            ]
        elif op == "Expand":
            nodes = [helper.make_node("Expand", ["one", "shape"], ["big"])]
            inits = [
                helper.make_tensor("one", TensorProto.FLOAT, [1, 1], [1.0]),
                _ints("shape", [side, side]),
            ]
        else:  # Range: 2**42 FP32 elements
            nodes = [helper.make_node("Range", ["start", "limit", "delta"], ["big"])]
            inits = [
                helper.make_tensor(n, TensorProto.FLOAT, [], [v])
                for n, v in (("start", 0.0), ("limit", float(1 << 42)), ("delta", 1.0))
            ]
        return _model([*nodes, _add_x()], [_in()], [_out()], inits)

    return model


def _protobuf_bomb(_: Path) -> bytes:
    # ModelProto.graph (field 7) declaring 2**31 bytes, then a few: the length lies.
    return bytes([0x3A, 0x80, 0x80, 0x80, 0x80, 0x08]) + b"\0" * 16


def _deep_messages(_: Path) -> bytes:
    # 100,000 nested graph -> node -> attribute -> graph messages' headers, truncated.
    return (
        b"\x3a\xff\xff\xff\x07"
        + b"\x0a\xff\xff\xff\x07\x2a\xff\xff\xff\x07\x32\xff\xff\xff\x07" * 100_000
    )


def _sparse_external(folder_root: Path) -> Callable[[Path, Path], None]:
    def make(folder: Path, outside: Path) -> None:
        elements = _sparse_size() // 4
        _write_onnx(folder, _with_weight(_external("w", "w.bin", elements)))
        with open(folder / "1" / "w.bin", "wb") as file:
            file.truncate(elements * 4)
        (folder / "config.pbtxt").write_text(ONNX_CONFIG.format(name=folder.name))

    return make


def _symlinked_external(folder: Path, outside: Path) -> None:
    outside.write_bytes(b"\0" * 64)
    _write_onnx(folder, _with_weight(_external("w", "w.bin", 16)))
    os.symlink(outside, folder / "1" / "w.bin")
    (folder / "config.pbtxt").write_text(ONNX_CONFIG.format(name=folder.name))


def _model_link_out(folder: Path, outside: Path) -> None:
    outside.mkdir()
    save(simple_model(), outside / "model.onnx")
    (folder / "1").mkdir(parents=True)
    os.symlink(outside / "model.onnx", folder / "1" / "model.onnx")
    (folder / "config.pbtxt").write_text(ONNX_CONFIG.format(name=folder.name))


def _python_link_out(folder: Path, outside: Path) -> None:
    outside.write_text(f"import os\nos.system('touch {outside}.ran')\n")
    (folder / "1").mkdir(parents=True)
    os.symlink(outside, folder / "1" / "model.py")
    (folder / "config.pbtxt").write_text(
        SIMPLE_CONFIG.replace('platform: "onnxruntime_onnx"', 'backend: "python"').replace(
            '"simple"', f'"{folder.name}"'
        )
    )


def _fifo(folder: Path, outside: Path) -> None:
    (folder / "1").mkdir(parents=True)
    os.mkfifo(folder / "1" / "model.onnx")
    (folder / "config.pbtxt").write_text(ONNX_CONFIG.format(name=folder.name))


def _directory(folder: Path, outside: Path) -> None:
    (folder / "1" / "model.onnx").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(ONNX_CONFIG.format(name=folder.name))


def _openvino_xxe(folder: Path, outside: Path) -> None:
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.xml").write_text(XXE)
    (folder / "1" / "model.bin").write_bytes(b"")
    (folder / "config.pbtxt").write_text(
        f'name: "{folder.name}"\nbackend: "openvino"\nmax_batch_size: 0\n'
        'input [ { name: "x", data_type: TYPE_FP32, dims: [ 1 ] } ]\n'
        'output [ { name: "y", data_type: TYPE_FP32, dims: [ 1 ] } ]\n'
    )


def _huge_config_dims(folder: Path, outside: Path) -> None:
    _write_onnx(
        folder,
        _model(
            [helper.make_node("Identity", ["x"], ["y"])],
            [_in("x", [4])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
        ),
    )
    (folder / "config.pbtxt").write_text(
        f'name: "{folder.name}"\nbackend: "onnxruntime"\nmax_batch_size: 0\n'
        f'input [ {{ name: "x", data_type: TYPE_FP32, dims: [ {2**62}, {2**62} ] }} ]\n'
        'output [ { name: "y", data_type: TYPE_FP32, dims: [ 4 ] } ]\n'
    )


# name -> (maker, a part of the refusal's reason)
CASES: dict[str, tuple[Maker, str]] = {
    "external_dotdot": (
        _onnx_case(
            lambda o: _with_weight(_external("w", "../../../../../../../../etc/passwd", 16))
        ),
        "outside the model's folder",
    ),
    "external_absolute": (
        _onnx_case(lambda o: _with_weight(_external("w", "/etc/passwd", 16))),
        "outside the model's folder",
    ),
    "external_symlink_out": (_symlinked_external, "outside the model's folder"),
    "external_past_its_file": (
        _onnx_case(lambda o: _with_weight(_external("w", "model.onnx", 1 << 20))),
        "-byte file",
    ),
    "external_offset_overflow": (
        _onnx_case(lambda o: _with_weight(_external("w", "model.onnx", 4, offset=str(2**63)))),
        "-byte file",
    ),
    "external_sparse_10gb": (_sparse_external(Path()), "budget"),
    "initializer_terabytes": (
        _onnx_case(
            lambda o: _with_weight(
                TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[TB], raw_data=b"\0" * 4)
            )
        ),
        "budget",
    ),
    "initializer_negative_dims": (
        _onnx_case(
            lambda o: _with_weight(
                TensorProto(
                    name="w", data_type=TensorProto.FLOAT, dims=[-1, 4], raw_data=b"\0" * 16
                )
            )
        ),
        "budget",
    ),
    "constant_of_shape_16tb": (_onnx_case(_huge_constant("ConstantOfShape")), ""),
    "tile_16tb": (_onnx_case(_huge_constant("Tile")), ""),
    "expand_16tb": (_onnx_case(_huge_constant("Expand")), ""),
    "range_16tb": (_onnx_case(_huge_constant("Range")), ""),
    "graphs_nested_200": (_onnx_case(lambda o: _nested_graphs(200)), "nested deeper"),
    "protobuf_length_lies": (_onnx_case(_protobuf_bomb), "Protobuf parsing failed"),
    "protobuf_deep_headers": (_onnx_case(_deep_messages), "Protobuf parsing failed"),
    "garbage_bytes": (_onnx_case(lambda o: bytes(range(256)) * 64), ""),
    "empty_file": (_onnx_case(lambda o: b""), ""),
    "model_is_a_fifo": (_fifo, "does not exist"),
    "model_is_a_directory": (_directory, "does not exist"),
    "model_links_out_of_the_repository": (_model_link_out, "outside the model folder"),
    "python_model_links_out": (_python_link_out, "outside the model folder"),
    "torchscript_pickle_runs_code": (
        lambda f, o: _torchscript(f, o.with_name("pwned"), slip=False),
        "",
    ),
    "torchscript_zip_slip": (lambda f, o: _torchscript(f, o.with_name("pwned"), slip=True), ""),
    "openvino_external_entity": (_openvino_xxe, ""),
    "config_dims_2_62": (_huge_config_dims, ""),
}


# Contained rather than refused: ONNX Runtime skips constant folding of an output over 1 GB,
# so these load, and the first inference fails to allocate (or Tile refuses over 4 GB): an
# error naming the allocation, answered, with the model and the server serving on. The
# OpenVINO IR's XML parser (pugixml) does not expand entities: it loads and leaks nothing.
CONTAINED = {
    "constant_of_shape_16tb": b"Failed to allocate memory",
    "expand_16tb": b"Failed to allocate memory",
    "range_16tb": b"Failed to allocate memory",
    "tile_16tb": b"exceeds the supported maximum",
    "openvino_external_entity": b"",
}


def _contained(watch: Watch, http: Http, case: str) -> None:
    for path in (f"/v2/models/{case}", f"/v2/models/{case}/config"):
        status, answer = http.request("GET", path)
        assert status == 200, answer[:400]
        assert b"root:" not in answer, answer[:400]
    if case.startswith("openvino"):
        return
    body = b'{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}]}'
    status, answer = http.request("POST", f"/v2/models/{case}/infer", body)
    # The model's own failure to allocate is the model's error (500, as tritonserver), not
    # the server's: answered with its reason, and not counted as a 5xx of the server.
    assert status in (400, 500), answer[:400]
    assert CONTAINED[case] in answer, answer[:400]
    assert http.request("GET", f"/v2/models/{case}/ready")[0] == 200


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_hostile_model_is_refused_or_contained_and_the_server_stays_up(
    watch: Watch, tmp_path: Path, case: str
) -> None:
    make, reason = CASES[case]
    root: Path = watch.root  # type: ignore[attr-defined]
    outside = tmp_path / "outside"
    make(root / case, outside)
    http = Http("127.0.0.1", watch.proc.http_port)
    status, answer = http.request("POST", f"/v2/repository/models/{case}/load")
    watch.seen(f"load {case}", status)
    if case in CONTAINED:
        assert status == 200, (status, answer[:400])
        _contained(watch, http, case)
    else:
        assert status == 400, (status, answer[:400])
        assert reason.encode() in answer, answer[:400]
        assert http.request("GET", f"/v2/models/{case}/ready")[0] != 200
    # Nothing the files named ran or was written outside.
    assert not Path(f"{outside}.ran").exists(), "a model's code ran"
    assert not (tmp_path / "pwned").exists(), "a pickle's command ran"
    assert not list(Path("/").glob("pwned")), "a zip entry was written out of its folder"
    watch.check()
