"""--backend-config default-max-batch-size: what auto-complete gives a model that can batch."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import tritonclient.http as httpclient

from tests.integration.models import _add_constant_model


@pytest.mark.parametrize(
    ("flags", "batch"),
    [
        (("--backend-config=default-max-batch-size=8",), 8),
        # A backend's own value wins for its models, and only for them.
        (
            (
                "--backend-config=default-max-batch-size=8",
                "--backend-config=onnxruntime,default-max-batch-size=2",
            ),
            2,
        ),
        (("--backend-config=python,default-max-batch-size=2",), 4),
        ((), 4),
    ],
)
def test_auto_completed_models_batch_up_to_the_default(  # type: ignore[no-untyped-def]
    start_server, tmp_path: Path, flags: tuple[str, ...], batch: int
) -> None:
    (tmp_path / "repo" / "auto" / "1").mkdir(parents=True)  # no config.pbtxt
    onnx.save(_add_constant_model(1), str(tmp_path / "repo" / "auto" / "1" / "model.onnx"))
    proc = start_server(tmp_path / "repo", *flags)
    client = httpclient.InferenceServerClient(proc.http_url)
    config = client.get_model_config("auto")
    assert config["max_batch_size"] == batch
    assert "dynamic_batching" in config
    inp = httpclient.InferInput("INPUT0", [batch, 4], "FP32")
    inp.set_data_from_numpy(np.zeros((batch, 4), np.float32))
    assert client.infer("auto", [inp]).as_numpy("OUTPUT0").shape == (batch, 4)
