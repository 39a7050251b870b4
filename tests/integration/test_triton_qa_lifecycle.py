"""Model control behaviours Triton's qa suites check (found running L0_lifecycle's
Python-model-only cases against this server): unloading a model an ensemble calls unloads
the ensemble, as tritonserver's dependency graph does; a Python model may take no inputs (a
folder with only its model.py, as L0_lifecycle's instance-load and config-overwrite cases load)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.serverproc import ServerProcess

STEP = """\
name: "step"
backend: "identity"
max_batch_size: 1
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ 1 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 1 ] } ]
"""

OTHER = STEP.replace('"step"', '"other"')


def _ensemble(name: str, step: str) -> str:
    return f"""\
name: "{name}"
platform: "ensemble"
max_batch_size: 1
input [ {{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 1 ] }} ]
ensemble_scheduling {{ step [ {{
  model_name: "{step}", model_version: -1,
  input_map {{ key: "INPUT0", value: "INPUT0" }},
  output_map {{ key: "OUTPUT0", value: "OUTPUT0" }}
}} ] }}
"""


def _repository(root: Path) -> Path:
    models = root / "models"
    configs = {
        "step": STEP,
        "other": OTHER,
        "pipeline": _ensemble("pipeline", "step"),
        "outer": _ensemble("outer", "pipeline"),
        "elsewhere": _ensemble("elsewhere", "other"),
    }
    for name, config in configs.items():
        (models / name / "1").mkdir(parents=True)
        (models / name / "config.pbtxt").write_text(config)
    return models


def _infer(client: Any, module: Any, model: str) -> Any:
    tensor = module.InferInput("INPUT0", [1, 1], "FP32")
    tensor.set_data_from_numpy(np.array([[3.0]], dtype=np.float32))
    return client.infer(model, [tensor]).as_numpy("OUTPUT0")


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=("http", "grpc"))
def test_unloading_a_step_unloads_the_ensembles_that_call_it(tmp_path: Path, module: Any) -> None:
    models = _repository(tmp_path)
    flags = ("--model-control-mode=explicit", "--load-model=outer", "--load-model=elsewhere")
    with ServerProcess(models, *flags, log_path=tmp_path / "server.log") as proc:
        client = proc.client(module)
        try:
            assert _infer(client, module, "outer").tolist() == [[3.0]]
            client.unload_model("step")
            for name in ("step", "pipeline", "outer"):
                assert not client.is_model_ready(name), name
            assert client.is_model_ready("elsewhere")  # calls another model: still served
            assert client.is_model_ready("other")
            index = client.get_model_repository_index()
            if module is grpcclient:
                reasons = {m.name: m.reason for m in index.models}
            else:
                reasons = {m["name"]: m.get("reason", "") for m in index}
            assert reasons["pipeline"] == (
                "ensemble 'pipeline' depends on 'step' which has no loaded version."
            )
            assert reasons["outer"] == (
                "ensemble 'outer' depends on 'pipeline' which has no loaded version."
            )
            with pytest.raises(InferenceServerException):
                _infer(client, module, "outer")
            client.load_model("outer")  # loads its steps again
            assert _infer(client, module, "outer").tolist() == [[3.0]]
        finally:
            client.close()


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=("http", "grpc"))
def test_a_config_override_may_give_a_repeated_field_one_value(tmp_path: Path, module: Any) -> None:
    """L0_lifecycle's instance-load cases override `instance_group` with one object, not a
    list, which tritonserver's protobuf JSON parser reads as a list of one."""
    models = _repository(tmp_path)
    with ServerProcess(
        models, "--model-control-mode=explicit", log_path=tmp_path / "server.log"
    ) as proc:
        client = proc.client(module)
        try:
            override = STEP_JSON.replace('"instance_group": []', '"instance_group": {"count": 3}')
            client.load_model("step", config=override)
            config = client.get_model_config("step")
            if module is grpcclient:
                counts = [group.count for group in config.config.instance_group]
            else:
                counts = [group["count"] for group in config["instance_group"]]
            assert counts == [3]
            assert _infer(client, module, "step").tolist() == [[3.0]]
            with pytest.raises(InferenceServerException, match="Invalid config override"):
                client.load_model("step", config='{"instance_group": 3}')
        finally:
            client.close()


STEP_JSON = (
    '{"name": "step", "backend": "identity", "max_batch_size": 1, "instance_group": [], '
    '"input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [1]}], '
    '"output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [1]}]}'
)


SOURCE = """\
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(
            [pb_utils.Tensor("OUT", np.array([7], dtype=np.int32))]) for _ in requests]
"""

SOURCE_CONFIGS = {
    "source": 'backend: "python"\noutput [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n',
    "source_batched": 'backend: "python"\nmax_batch_size: 4\n'
    'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n',
    "bare": None,  # only 1/model.py: no config.pbtxt, no auto_complete_config
}


def _names(tensors: Any) -> list[str]:
    return [t["name"] if isinstance(t, dict) else t.name for t in tensors]


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=("http", "grpc"))
def test_a_python_model_may_take_no_inputs(tmp_path: Path, module: Any) -> None:
    models = tmp_path / "models"
    for name, config in SOURCE_CONFIGS.items():
        (models / name / "1").mkdir(parents=True)
        (models / name / "1" / "model.py").write_text(SOURCE)
        if config is not None:
            (models / name / "config.pbtxt").write_text(config)
    with ServerProcess(models, log_path=tmp_path / "server.log") as proc:
        client = proc.client(module)
        try:
            assert client.infer("source", []).as_numpy("OUT").tolist() == [7]
            # no output in its config: what execute() returns is not sent (as tritonserver)
            assert client.infer("bare", []).as_numpy("OUT") is None
            for name, outputs in (("source", ["OUT"]), ("bare", [])):
                meta = client.get_model_metadata(name)
                if module is grpcclient:
                    assert (_names(meta.inputs), _names(meta.outputs)) == ([], outputs)
                    config = client.get_model_config(name).config
                    assert (config.backend, list(config.input)) == ("python", [])
                else:
                    assert (meta["inputs"], _names(meta["outputs"])) == ([], outputs)
                    config = client.get_model_config(name)
                    assert (config["backend"], config["input"]) == ("python", [])
            # a batching model takes its batch size from the first input: there is none
            with pytest.raises(
                InferenceServerException,
                match=r"\[request id: <id_unknown>\] out of bounds index 0: request has 0 inputs",
            ):
                client.infer("source_batched", [])
        finally:
            client.close()


def test_an_identity_model_may_have_no_tensors(tmp_path: Path) -> None:
    """L0_lifecycle's config-overwrite case reloads a Python model with the override
    `{"backend": "identity", "instance_group": [{"count": 2}]}`: no inputs, no outputs, which
    the identity backend allows (as many inputs as outputs). A TorchScript model still needs
    its tensors listed (test_torch_models.py::test_models_that_cannot_load_say_why)."""
    models = _repository(tmp_path)
    with ServerProcess(
        models, "--model-control-mode=explicit", log_path=tmp_path / "server.log"
    ) as proc:
        client = httpclient.InferenceServerClient(proc.http_url)
        override = '{"name": "step", "backend": "identity", "instance_group": [{"count": 2}]}'
        client.load_model("step", config=override)
        config = client.get_model_config("step")
        assert (config["input"], config["output"]) == ([], [])
        assert [g["count"] for g in config["instance_group"]] == [2]
        assert client.infer("step", []).get_response()["outputs"] == []
        with pytest.raises(InferenceServerException, match="model configuration must have equal"):
            client.load_model(
                "step",
                config=override.replace(
                    '"instance_group"',
                    '"output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", '
                    '"dims": [1]}], "instance_group"',
                ),
            )


def test_a_load_without_override_keeps_the_last_one_while_the_folder_is_unchanged(
    tmp_path: Path,
) -> None:
    """L0_lifecycle's config-overwrite case, as tritonserver 2.51 answers it side by side: a
    load without a config keeps the previous load's override until the model folder changes
    (a file touched) or the model is unloaded."""
    models = tmp_path / "models"
    (models / "bare" / "1").mkdir(parents=True)
    (models / "bare" / "1" / "model.py").write_text(SOURCE)
    flags = ("--model-control-mode=explicit", "--load-model=bare")
    with ServerProcess(models, *flags, log_path=tmp_path / "server.log") as proc:
        client = httpclient.InferenceServerClient(proc.http_url)

        def count() -> int:
            return int(client.get_model_config("bare")["instance_group"][0]["count"])

        def override(n: int) -> str:
            return f'{{"backend": "python", "instance_group": [{{"count": {n}}}]}}'

        assert count() == 1
        client.load_model("bare", config=override(2))
        client.load_model("bare")
        assert count() == 2  # kept: nothing changed
        client.unload_model("bare")
        client.load_model("bare")
        assert count() == 1  # forgotten with the unload
        client.load_model("bare", config=override(3))
        time.sleep(0.01)
        (models / "bare" / "1" / "model.py").touch()
        client.load_model("bare")
        assert count() == 1  # the folder changed: read again


def test_a_python_models_instances_load_at_once(tmp_path: Path) -> None:
    """L0_lifecycle's instance-load speedup case: instances whose initialize() takes 2 s each
    load together (3 of them: 6 s one after the other)."""
    models = tmp_path / "models"
    (models / "slow" / "1").mkdir(parents=True)
    (models / "slow" / "1" / "model.py").write_text(
        SOURCE + "\n    def initialize(self, args):\n        import time\n        time.sleep(2)\n"
    )
    with ServerProcess(
        models, "--model-control-mode=explicit", log_path=tmp_path / "server.log"
    ) as proc:
        client = httpclient.InferenceServerClient(proc.http_url)
        start = time.monotonic()
        client.load_model("slow", config='{"instance_group": [{"kind": "KIND_CPU", "count": 3}]}')
        took = time.monotonic() - start
        assert 2.0 <= took < 4.5, took
        assert client.infer("slow", []).get_response()["outputs"] == []
        assert client.get_model_config("slow")["instance_group"][0]["count"] == 3
