"""A model the server cannot serve never stops the others: a config with a datatype this server
does not carry (TYPE_BF16) is refused with the reason, and an unexpected error in one model's
load leaves that model UNAVAILABLE while the rest start."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from appliance.common.settings import ServerSettings
from appliance.runtime import loader, models
from appliance.runtime.models import ModelRuntime
from appliance.runtime.settings import RuntimeSettings
from tests.integration.models import _add_constant_model

BF16 = """name: "bf16"
backend: "identity"
max_batch_size: 0
input [ { name: "INPUT0", data_type: TYPE_BF16, dims: [ 4 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_BF16, dims: [ 4 ] } ]
"""


def _repo(root: Path) -> Path:
    (root / "bf16" / "1").mkdir(parents=True)
    (root / "bf16" / "config.pbtxt").write_text(BF16)
    (root / "add" / "1").mkdir(parents=True)
    onnx.save(_add_constant_model(1), str(root / "add" / "1" / "model.onnx"))
    return root


def test_a_bf16_model_is_refused_and_the_others_serve(start_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    proc = start_server(_repo(tmp_path / "repo"), "--model-control-mode=explicit", "--load-model=*")
    http = httpclient.InferenceServerClient(proc.http_url)
    assert http.is_model_ready("add")
    rows = {row["name"]: row for row in http.get_model_repository_index()}
    assert rows["bf16"]["state"] == "UNAVAILABLE"
    assert "data_type TYPE_BF16 is not supported here" in rows["bf16"]["reason"]
    for client in (http, grpcclient.InferenceServerClient(proc.grpc_url)):
        with pytest.raises(InferenceServerException, match="TYPE_BF16 is not supported") as info:
            client.load_model("bf16")
        assert info.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")


async def test_an_unexpected_error_in_one_load_leaves_the_others_serving(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = loader.prepare_model

    def broken(model_dir: Path, *args, **kwargs):  # type: ignore[no-untyped-def]
        if model_dir.name == "bf16":
            raise KeyError("BF16")  # a bug, as the datatype lookup once was
        return real(model_dir, *args, **kwargs)

    monkeypatch.setattr(models, "prepare_model", broken)
    root = _repo(tmp_path / "repo")
    runtime = ModelRuntime(RuntimeSettings.from_server(ServerSettings(model_repositories=(root,))))
    try:
        await runtime.load_all()
        records = {r.name: r for r in runtime.registry.records()}
        assert records["add"].versions  # served
        assert records["bf16"].state == "UNAVAILABLE"
        assert records["bf16"].reason == "internal error (KeyError); see the log"
    finally:
        await runtime.stop(5.0)
