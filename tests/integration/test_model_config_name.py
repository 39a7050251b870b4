"""--model-config-name: one repository configured per kind of device, as tritonserver does it.

Each model's config is `configs/<name>.pbtxt` in its folder where that file exists, and
config.pbtxt otherwise; the choice is made at every load, so adding or removing a custom file
takes effect on the next load."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.integration.models import _add_constant_model

CONFIG = 'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: {batch}\n'


def _model(repo: Path, name: str, batch: int | None, **custom: str) -> Path:
    """A model adding 1 to INPUT0; `batch`: config.pbtxt's max_batch_size (None: no file);
    `custom`: configs/<key>.pbtxt files and their text."""
    folder = repo / name
    (folder / "1").mkdir(parents=True)
    onnx.save(_add_constant_model(1), str(folder / "1" / "model.onnx"))
    if batch is not None:
        (folder / "config.pbtxt").write_text(CONFIG.format(name=name, batch=batch))
    for config_name, text in custom.items():
        (folder / "configs").mkdir(exist_ok=True)
        (folder / "configs" / f"{config_name}.pbtxt").write_text(text)
    return folder


def _max_batch(client: httpclient.InferenceServerClient, model: str) -> int:
    return int(client.get_model_config(model)["max_batch_size"])


def _infer(client: grpcclient.InferenceServerClient, model: str, batch: int) -> np.ndarray:
    inp = grpcclient.InferInput("INPUT0", [batch, 4], "FP32")
    inp.set_data_from_numpy(np.zeros((batch, 4), np.float32))
    return client.infer(model, [inp]).as_numpy("OUTPUT0")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    _model(root, "chosen", 4, edge=CONFIG.format(name="chosen", batch=2))
    _model(root, "fallback", 4, other=CONFIG.format(name="fallback", batch=1))
    _model(root, "custom_only", None, edge=CONFIG.format(name="custom_only", batch=3))
    _model(root, "broken", 4, edge="max_batch_size: [nope")
    return root


def test_the_named_config_is_used_where_a_model_has_it(start_server, repo: Path) -> None:  # type: ignore[no-untyped-def]
    proc = start_server(
        repo, "--model-config-name=edge", "--model-control-mode=explicit", "--load-model=*"
    )
    http = httpclient.InferenceServerClient(proc.http_url)
    grpc = grpcclient.InferenceServerClient(proc.grpc_url)
    assert _max_batch(http, "chosen") == 2  # configs/edge.pbtxt
    assert _max_batch(http, "fallback") == 4  # only configs/other.pbtxt: config.pbtxt
    assert _max_batch(http, "custom_only") == 3  # no config.pbtxt needed
    # The chosen config governs serving, not only what the config endpoint says.
    assert _infer(grpc, "fallback", 3)[0, 0] == 1.0
    with pytest.raises(InferenceServerException, match="batch-size must be <= 2"):
        _infer(grpc, "chosen", 3)
    # A broken custom config fails its model alone, and the reason names that file.
    assert not http.is_model_ready("broken")
    rows = {row["name"]: row for row in http.get_model_repository_index()}
    assert "configs/edge.pbtxt" in rows["broken"]["reason"]
    assert rows["chosen"]["state"] == "READY"

    # Chosen again at every load: a custom file removed or added takes effect on a reload.
    (repo / "chosen" / "configs" / "edge.pbtxt").unlink()
    (repo / "fallback" / "configs" / "edge.pbtxt").write_text(
        CONFIG.format(name="fallback", batch=1)
    )
    http.load_model("chosen")
    http.load_model("fallback")
    assert _max_batch(http, "chosen") == 4
    assert _max_batch(http, "fallback") == 1
    assert _infer(grpc, "chosen", 3)[0, 0] == 1.0


def test_without_the_flag_custom_configs_are_not_read(start_server, repo: Path) -> None:  # type: ignore[no-untyped-def]
    proc = start_server(repo)
    http = httpclient.InferenceServerClient(proc.http_url)
    assert _max_batch(http, "chosen") == 4
    assert http.is_model_ready("broken")  # its broken custom file is never read
