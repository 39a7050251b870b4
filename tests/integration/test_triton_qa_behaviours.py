"""Behaviours Triton's own test suites rely on, found by running them against this server:
Triton's `identity` backend (no model file; OUTPUT<n> copies INPUT<n>, `execute_delay_ms`),
a Python model whose `auto_complete_config` comes from a module model.py imports, and
tritonserver's case-insensitive `--model-control-mode`."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.serverproc import ServerProcess

IDENTITY = """\
name: "{name}"
backend: "identity"
max_batch_size: {mbs}
input [
  {{ name: "INPUT0", data_type: {dtype}, dims: [ -1 ] }},
  {{ name: "INPUT1", data_type: TYPE_FP32, dims: [ 2 ], optional: true }}
]
output [
  {{ name: "OUTPUT0", data_type: {dtype}, dims: [ -1 ] }},
  {{ name: "OUTPUT1", data_type: TYPE_FP32, dims: [ 2 ] }}
]
{extra}
"""

# Both inputs optional, as Triton's L0_optional_input identity_2_float32.
IDENTITY_PAIR = """\
name: "identity_pair"
backend: "identity"
max_batch_size: 4
input [
  { name: "INPUT0", data_type: TYPE_FP32, dims: [ 1 ], optional: true },
  { name: "INPUT1", data_type: TYPE_FP32, dims: [ 1 ], optional: true }
]
output [
  { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 1 ] },
  { name: "OUTPUT1", data_type: TYPE_FP32, dims: [ 1 ] }
]
"""

# Its second step is given INPUT1 alone: OUTPUT0 comes from a missing optional input.
PIPELINE_PAIR = """\
name: "pipeline_pair"
platform: "ensemble"
max_batch_size: 4
input [
  { name: "INPUT0", data_type: TYPE_FP32, dims: [ 1 ], optional: true },
  { name: "INPUT1", data_type: TYPE_FP32, dims: [ 1 ], optional: true }
]
output [
  { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 1 ] },
  { name: "OUTPUT1", data_type: TYPE_FP32, dims: [ 1 ] }
]
ensemble_scheduling { step [
  { model_name: "identity_pair", model_version: -1,
    input_map { key: "INPUT0", value: "INPUT0" }, input_map { key: "INPUT1", value: "INPUT1" },
    output_map { key: "OUTPUT0", value: "between" } },
  { model_name: "identity_pair", model_version: -1,
    input_map { key: "INPUT1", value: "between" },
    output_map { key: "OUTPUT0", value: "OUTPUT0" },
    output_map { key: "OUTPUT1", value: "OUTPUT1" } }
] }
"""

# No batching; optional inputs with a variable dimension and of strings.
IDENTITY_ZEROS = """\
name: "identity_zeros"
backend: "identity"
max_batch_size: 0
input [
  { name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] },
  { name: "INPUT1", data_type: TYPE_INT32, dims: [ -1, 3 ], optional: true },
  { name: "INPUT2", data_type: TYPE_STRING, dims: [ 2 ], optional: true }
]
output [
  { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] },
  { name: "OUTPUT1", data_type: TYPE_INT32, dims: [ -1, 3 ] },
  { name: "OUTPUT2", data_type: TYPE_STRING, dims: [ 2 ] }
]
"""

DELAYED = 'parameters [ { key: "execute_delay_ms", value: { string_value: "400" } } ]'

# Triton's identity backend refuses a config whose pairs do not match, with these texts.
BAD_IDENTITY = {
    "unequal_pairs": (
        'backend: "identity"\nmax_batch_size: 0\n'
        'input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ 1 ] } ]\n'
        'output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 1 ] },'
        ' { name: "OUTPUT1", data_type: TYPE_FP32, dims: [ 1 ] } ]\n',
        "model configuration must have equal input/output pairs",
    ),
    "type_mismatch": (
        'backend: "identity"\nmax_batch_size: 0\n'
        'input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ 1 ] } ]\n'
        'output [ { name: "OUTPUT0", data_type: TYPE_INT32, dims: [ 1 ] } ]\n',
        "expected input and output datatype to match, got TYPE_FP32 and TYPE_INT32",
    ),
    "bad_name": (
        'backend: "identity"\nmax_batch_size: 0\n'
        'input [ { name: "X", data_type: TYPE_FP32, dims: [ 1 ] } ]\n'
        'output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 1 ] } ]\n',
        "expected input name to follow INPUT<index> pattern, got 'X'",
    ),
}

# The hook lives in a module beside the model: model.py never names auto_complete_config.
SHARED_MODULE = """\
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        if config.as_dict()["input"] or config.as_dict()["output"]:
            return config
        config.add_input({"name": "IN", "data_type": "TYPE_INT32", "dims": [4]})
        config.add_output({"name": "OUT", "data_type": "TYPE_INT32", "dims": [4]})
        return config

    def execute(self, requests):
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor(
                "OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy() * 2)])
            for r in requests
        ]
"""

IMPORTING_MODEL = """\
import os
import sys

sys.path.append(os.path.join(os.path.dirname(__file__), "..", ".."))
from shared_addsub import *  # noqa: F401,F403
"""


def _repository(root: Path) -> Path:
    models = root / "models"
    for name, mbs, dtype, extra in (
        ("identity_fp32", 8, "TYPE_FP32", ""),
        ("identity_bytes", 0, "TYPE_STRING", ""),
        ("identity_delayed", 8, "TYPE_FP32", DELAYED),
    ):
        (models / name / "1").mkdir(parents=True)  # the version folder stays empty
        (models / name / "config.pbtxt").write_text(
            IDENTITY.format(name=name, mbs=mbs, dtype=dtype, extra=extra)
        )
    for name, config in (
        ("identity_pair", IDENTITY_PAIR),
        ("pipeline_pair", PIPELINE_PAIR),
        ("identity_zeros", IDENTITY_ZEROS),
    ):
        (models / name / "1").mkdir(parents=True)
        (models / name / "config.pbtxt").write_text(config)
    for name, (config, _) in BAD_IDENTITY.items():
        (models / name / "1").mkdir(parents=True)
        (models / name / "config.pbtxt").write_text(config)
    (models / "shared_addsub.py").write_text(SHARED_MODULE)
    (models / "imported_hook" / "1").mkdir(parents=True)
    (models / "imported_hook" / "1" / "model.py").write_text(IMPORTING_MODEL)
    return models


@pytest.fixture(scope="module")
def qa_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("triton_qa")
    # tritonserver lowercases the control mode: EXPLICIT as its own test scripts spell it.
    proc = ServerProcess(
        _repository(root),
        "--model-control-mode=EXPLICIT",
        "--load-model=identity_fp32",
        "--load-model=identity_bytes",
        "--load-model=identity_delayed",
        "--load-model=imported_hook",
        "--load-model=identity_pair",
        "--load-model=pipeline_pair",
        "--load-model=identity_zeros",
        log_path=root / "server.log",
    )
    with proc:
        yield proc


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_identity_backend_copies_each_input_to_its_output(
    qa_server: ServerProcess, module: Any
) -> None:
    client = qa_server.client(module)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    y = np.array([[1.5, -2.0], [3.0, 4.0]], dtype=np.float32)
    inputs = [
        module.InferInput("INPUT0", [2, 3], "FP32"),
        module.InferInput("INPUT1", [2, 2], "FP32"),
    ]
    inputs[0].set_data_from_numpy(x)
    inputs[1].set_data_from_numpy(y)
    result = client.infer("identity_fp32", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), y)

    # An optional input left out: its output is zeros, of the batch given (tests below).
    only = [module.InferInput("INPUT0", [1, 2], "FP32")]
    only[0].set_data_from_numpy(np.array([[7.0, 8.0]], dtype=np.float32))
    result = client.infer("identity_fp32", only)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), [[7.0, 8.0]])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), np.zeros((1, 2), np.float32))

    # BYTES pass through unchanged, in a model that does not batch.
    words = np.array([b"hello", b"\x00\xffraw", b""], dtype=np.object_)
    strings = [module.InferInput("INPUT0", [3], "BYTES")]
    strings[0].set_data_from_numpy(words)
    result = client.infer("identity_bytes", strings)
    assert list(result.as_numpy("OUTPUT0")) == list(words)


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_identity_backend_zeros_for_a_missing_optional_input(
    qa_server: ServerProcess, module: Any
) -> None:
    """Triton's identity backend: a requested OUTPUT<n> whose optional INPUT<n> is missing is
    zeros of the input's config dims (-1 as 1), after the batch when the model batches."""
    client = qa_server.client(module)
    given = [module.InferInput("INPUT0", [3, 2], "FP32")]
    given[0].set_data_from_numpy(np.ones((3, 2), dtype=np.float32))
    asked = [module.InferRequestedOutput("OUTPUT1")]
    result = client.infer("identity_fp32", given, outputs=asked)
    zeros = result.as_numpy("OUTPUT1")
    assert (zeros.dtype, zeros.shape) == (np.float32, (3, 2))
    assert not zeros.any()
    assert result.as_numpy("OUTPUT0") is None  # not asked for

    # Given INPUT1 alone, as the pipeline's second step below: OUTPUT0 is [[0.]].
    second = [module.InferInput("INPUT1", [1, 1], "FP32")]
    second[0].set_data_from_numpy(np.array([[5.0]], dtype=np.float32))
    result = client.infer("identity_pair", second)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.zeros((1, 1), np.float32))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), [[5.0]])

    # Triton's L0_optional_input test_ensemble_optional_pipeline: OUTPUT0 is always zero,
    # OUTPUT1 is INPUT0 (OUTPUT0 was None before).
    both = [
        module.InferInput("INPUT0", [1, 1], "FP32"),
        module.InferInput("INPUT1", [1, 1], "FP32"),
    ]
    both[0].set_data_from_numpy(np.array([[2.5]], dtype=np.float32))
    both[1].set_data_from_numpy(np.array([[9.0]], dtype=np.float32))
    result = client.infer("pipeline_pair", both)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.zeros((1, 1), np.float32))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), [[2.5]])

    # No batching: no batch dimension; -1 is 1; strings are empty.
    plain = [module.InferInput("INPUT0", [4], "FP32")]
    plain[0].set_data_from_numpy(np.arange(4, dtype=np.float32))
    result = client.infer("identity_zeros", plain)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.arange(4, dtype=np.float32))
    ints = result.as_numpy("OUTPUT1")
    assert (ints.dtype, ints.shape) == (np.int32, (1, 3))
    assert not ints.any()
    assert list(result.as_numpy("OUTPUT2")) == [b"", b""]


def test_identity_backend_execute_delay_ms(qa_server: ServerProcess) -> None:
    client = qa_server.client(grpcclient)
    inputs = [grpcclient.InferInput("INPUT0", [1, 1], "FP32")]
    inputs[0].set_data_from_numpy(np.ones((1, 1), dtype=np.float32))
    started = time.monotonic()
    client.infer("identity_delayed", inputs)
    assert time.monotonic() - started >= 0.4
    # The server's own requests go on meanwhile: the sleep is not on its event loop.
    assert client.is_server_live()


@pytest.mark.parametrize("name", sorted(BAD_IDENTITY))
def test_identity_backend_refuses_configs_as_triton(qa_server: ServerProcess, name: str) -> None:
    client = qa_server.client(httpclient)
    with pytest.raises(InferenceServerException) as caught:
        client.load_model(name)
    assert BAD_IDENTITY[name][1] in str(caught.value)
    assert not client.is_model_ready(name)


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_auto_complete_config_from_an_imported_module(
    qa_server: ServerProcess, module: Any
) -> None:
    client = qa_server.client(module)
    metadata = client.get_model_metadata("imported_hook")
    names = (
        [t["name"] for t in metadata["inputs"]]
        if module is httpclient
        else [t.name for t in metadata.inputs]
    )
    assert names == ["IN"]
    inputs = [module.InferInput("IN", [4], "INT32")]
    inputs[0].set_data_from_numpy(np.arange(4, dtype=np.int32))
    result = client.infer("imported_hook", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUT"), [0, 2, 4, 6])


def test_model_control_mode_is_case_insensitive(qa_server: ServerProcess) -> None:
    """Started with `--model-control-mode=EXPLICIT`: explicit mode, only the models named
    with --load-model are loaded."""
    client = qa_server.client(httpclient)
    assert client.is_model_ready("identity_fp32")
    assert not client.is_model_ready("type_mismatch")
    client.unload_model("identity_bytes")
    deadline = time.monotonic() + 10
    while client.is_model_ready("identity_bytes") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not client.is_model_ready("identity_bytes")
    client.load_model("identity_bytes")
    assert client.is_model_ready("identity_bytes")


def test_a_shape_whose_element_count_overflows_is_a_400_in_tritons_words(
    qa_server: ServerProcess,
) -> None:
    """Triton's http_test.py test_buffer_size_overflow: 400 and its words, not a 413."""
    import json
    import urllib.error
    import urllib.request

    shape = [4, 2**62]
    body = {"inputs": [{"name": "INPUT0", "shape": shape, "datatype": "FP32", "data": [1.0]}]}
    request = urllib.request.Request(
        f"http://{qa_server.http_url}/v2/models/identity_fp32/infer",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=10)
    assert caught.value.code == 400
    error = json.loads(caught.value.read())["error"]
    assert "causes total element count to exceed maximum size of 9223372036854775807" in error

    grpc_input = grpcclient.InferInput("INPUT0", shape, "FP32")
    grpc_input._raw_content = b"\x00" * 4  # the data does not matter: the shape is refused
    with pytest.raises(InferenceServerException) as refused:
        qa_server.client(grpcclient).infer("identity_fp32", [grpc_input])
    assert refused.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "causes total element count to exceed maximum size of" in str(refused.value)
