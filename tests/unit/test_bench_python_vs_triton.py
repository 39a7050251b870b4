"""bench.python_vs_triton's opt-in `squeeze` model (a model.py running SqueezeNet in its own ONNX
Runtime session): only in the repository when asked for, and served by the real server over
both protocols with the answer ONNX Runtime gives for the same input."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from bench.python_vs_triton import SQUEEZE, build
from tests.serverproc import ServerProcess


def test_squeeze_is_opt_in(tmp_path: Path) -> None:
    assert sorted(p.name for p in build(tmp_path / "plain").iterdir()) == [
        "add_sub",
        "bls",
        "repeat",
    ]
    with_squeeze = build(tmp_path / "squeeze", {SQUEEZE})
    assert (with_squeeze / SQUEEZE / "1" / "model.onnx").is_file()


def test_squeeze_answers_what_onnxruntime_computes(tmp_path: Path) -> None:
    repository = build(tmp_path / "models", {SQUEEZE})
    session = ort.InferenceSession(
        str(repository / SQUEEZE / "1" / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    data = np.random.default_rng(0).random((1, 3, 224, 224), dtype=np.float32)
    (expected,) = session.run(["softmaxout_1"], {"data_0": data})
    with ServerProcess(repository, log_path=tmp_path / "server.log") as server:
        for module in (httpclient, grpcclient):
            client = server.client(module)
            tensor = module.InferInput("data_0", [1, 3, 224, 224], "FP32")
            tensor.set_data_from_numpy(data)
            for _ in range(3):  # the same input arena again: the answer follows each input
                answer = client.infer(SQUEEZE, [tensor]).as_numpy("softmaxout_1")
                assert answer.shape == (1, 1000, 1, 1)
                np.testing.assert_allclose(answer, expected, rtol=1e-5, atol=1e-6)
            other = data[:, ::-1].copy()
            tensor.set_data_from_numpy(other)
            (expected_other,) = session.run(["softmaxout_1"], {"data_0": other})
            answer = client.infer(SQUEEZE, [tensor]).as_numpy("softmaxout_1")
            np.testing.assert_allclose(answer, expected_other, rtol=1e-5, atol=1e-6)
            tensor.set_data_from_numpy(data)
