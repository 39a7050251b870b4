"""--backend-config default-max-batch-size reaches a tree model (backend "fil") whose config
lists no tensors: FIL's auto-complete gives it the server's default, as ONNX models get."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

_WHY = "tree libraries not installed: pip install edge-appliance[trees]"
xgb = pytest.importorskip("xgboost", reason=_WHY)
pytest.importorskip("onnxmltools", reason=_WHY)
datasets = pytest.importorskip("sklearn.datasets", reason=_WHY)

FEATURES = 4
# backend and model_type only: tensors, max_batch_size and batching are auto-completed.
CONFIG = """name: "forest"
backend: "fil"
parameters [{ key: "model_type" value: { string_value: "xgboost_json" } }]
"""


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fil-batch")
    x, y = datasets.make_classification(n_samples=200, n_features=FEATURES, random_state=0)
    model = xgb.XGBClassifier(n_estimators=4, max_depth=3, random_state=0)
    model.fit(x.astype(np.float32), y)
    (root / "repo" / "forest" / "1").mkdir(parents=True)
    (root / "repo" / "forest" / "config.pbtxt").write_text(CONFIG)
    model.save_model(root / "repo" / "forest" / "1" / "xgboost.json")
    return root


@pytest.mark.parametrize(
    ("flags", "batch"),
    [
        ((), 4),
        (("--backend-config=default-max-batch-size=8",), 8),
        # The backend's own value wins for its models.
        (
            (
                "--backend-config=default-max-batch-size=8",
                "--backend-config=fil,default-max-batch-size=2",
            ),
            2,
        ),
        (("--backend-config=fil,default-max-batch-size=0",), 0),
    ],
)
def test_fil_auto_complete_takes_the_servers_default_max_batch_size(  # type: ignore[no-untyped-def]
    start_server, repo: Path, flags: tuple[str, ...], batch: int
) -> None:
    proc = start_server(
        repo / "repo", *flags, env={"EDGE_APPLIANCE_FIL_CACHE": str(repo / "cache")}
    )
    client = httpclient.InferenceServerClient(proc.http_url)
    config = client.get_model_config("forest")
    assert config.get("max_batch_size", 0) == batch
    # Triton's auto-complete adds the dynamic batcher above 1 only.
    assert ("dynamic_batching" in config) == (batch > 1)
    rows = max(batch, 1)
    shape = [rows, FEATURES]  # [-1, FEATURES] without batching: any rows, one execution
    inp = httpclient.InferInput("input__0", shape, "FP32")
    inp.set_data_from_numpy(np.zeros(shape, np.float32))
    assert client.infer("forest", [inp]).as_numpy("output__0").shape[0] == rows
