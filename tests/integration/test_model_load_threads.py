"""--model-load-thread-count: how many models load at once (each load's peak memory adds up on a
small device). Python models whose `initialize` takes a while record how many loads were under
way while they ran."""

from __future__ import annotations

from pathlib import Path

import pytest
import tritonclient.http as httpclient

SLOW_INIT = '''
import json
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        folder = json.loads(args["model_config"])["parameters"]["dir"]["string_value"]
        me = args["model_name"]
        open(os.path.join(folder, me + ".start"), "w").close()
        time.sleep(1.5)
        under_way = [
            name[: -len(".start")]
            for name in os.listdir(folder)
            if name.endswith(".start")
            and not os.path.exists(os.path.join(folder, name[: -len(".start")] + ".end"))
        ]
        with open(os.path.join(folder, me + ".seen"), "w") as out:
            out.write(str(len(under_way)))
        open(os.path.join(folder, me + ".end"), "w").close()

    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())]
            )
            for r in requests
        ]
'''

CONFIG = """name: "{name}"
backend: "python"
input [ {{ name: "IN", data_type: TYPE_FP32, dims: [ 1 ] }} ]
output [ {{ name: "OUT", data_type: TYPE_FP32, dims: [ 1 ] }} ]
parameters {{ key: "dir" value {{ string_value: "{folder}" }} }}
"""

MODELS = ("slow_a", "slow_b", "slow_c")


def _repo(root: Path, marks: Path) -> Path:
    marks.mkdir()
    for name in MODELS:
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.py").write_text(SLOW_INIT)
        (root / name / "config.pbtxt").write_text(CONFIG.format(name=name, folder=marks))
    return root


def _most_under_way(start_server, tmp_path: Path, label: str, *flags: str) -> int:  # type: ignore[no-untyped-def]
    marks = tmp_path / f"marks_{label}"
    proc = start_server(_repo(tmp_path / f"repo_{label}", marks), *flags)
    client = httpclient.InferenceServerClient(proc.http_url)
    assert all(client.is_model_ready(name) for name in MODELS)
    return max(int((marks / f"{name}.seen").read_text()) for name in MODELS)


@pytest.mark.parametrize(("flags", "most"), [(("--model-load-thread-count=1",), 1), ((), 2)])
def test_models_load_at_most_as_many_at_once_as_the_flag_says(  # type: ignore[no-untyped-def]
    start_server, tmp_path: Path, flags: tuple[str, ...], most: int
) -> None:
    assert _most_under_way(start_server, tmp_path, str(most), *flags) == most
