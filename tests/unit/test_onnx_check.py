"""edge_backends/onnx_check.py: what an .onnx file would read and allocate, checked first."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from onnx import TensorProto, helper

from configs.generate import IR_VERSION, OPSET
from edge_backends.onnx_check import OnnxFileProblem, check_onnx_file
from tests.security.test_hostile_models import _nested_graphs


def _save(folder: Path, weight: TensorProto) -> Path:
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", weight.name], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
        [weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    path = folder / "model.onnx"
    path.write_bytes(model.SerializeToString())
    return path


def _external(location: str, elements: int = 4) -> TensorProto:
    tensor = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[elements])
    tensor.data_location = TensorProto.EXTERNAL
    entry = tensor.external_data.add()
    entry.key, entry.value = "location", location
    return tensor


def test_a_plain_model_passes(tmp_path: Path) -> None:
    check_onnx_file(_save(tmp_path, helper.make_tensor("w", TensorProto.FLOAT, [4], [1] * 4)))


def test_external_data_in_the_folder_passes(tmp_path: Path) -> None:
    (tmp_path / "w.bin").write_bytes(b"\0" * 16)
    check_onnx_file(_save(tmp_path, _external("w.bin")))


@pytest.mark.parametrize("location", ["../w.bin", "/etc/passwd", "a/../../w.bin", ""])
def test_external_data_out_of_the_folder_is_refused(tmp_path: Path, location: str) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    (tmp_path / "w.bin").write_bytes(b"\0" * 16)
    with pytest.raises(OnnxFileProblem, match="outside the model's folder"):
        check_onnx_file(_save(folder, _external(location)))


def test_a_link_out_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    (tmp_path / "w.bin").write_bytes(b"\0" * 16)
    os.symlink(tmp_path / "w.bin", folder / "w.bin")
    with pytest.raises(OnnxFileProblem, match="outside the model's folder"):
        check_onnx_file(_save(folder, _external("w.bin")))


def test_external_data_past_its_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "w.bin").write_bytes(b"\0" * 15)
    with pytest.raises(OnnxFileProblem, match=r"bytes 0\.\.16 of a 15-byte file"):
        check_onnx_file(_save(tmp_path, _external("w.bin")))


def test_weights_over_the_budget_are_refused(tmp_path: Path) -> None:
    with open(tmp_path / "w.bin", "wb") as file:
        file.truncate(1 << 20)  # sparse: nothing written
    path = _save(tmp_path, _external("w.bin", 1 << 18))
    check_onnx_file(path, budget_bytes=1 << 20)
    with pytest.raises(OnnxFileProblem, match="declare 1048576 bytes, more than this load's"):
        check_onnx_file(path, budget_bytes=(1 << 20) - 1)


def test_what_it_cannot_parse_is_left_to_onnx_runtime(tmp_path: Path) -> None:
    (tmp_path / "model.onnx").write_bytes(bytes(range(256)))
    check_onnx_file(tmp_path / "model.onnx")  # ORT refuses it with its own words


def test_graphs_nested_too_deep_are_refused(tmp_path: Path) -> None:
    (tmp_path / "model.onnx").write_bytes(_nested_graphs(33))
    with pytest.raises(OnnxFileProblem, match="nested deeper than 32"):
        check_onnx_file(tmp_path / "model.onnx")
    (tmp_path / "model.onnx").write_bytes(_nested_graphs(32))
    check_onnx_file(tmp_path / "model.onnx")
