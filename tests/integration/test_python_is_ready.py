"""A Python model's is_ready() (sync or async, as python_backend's): asked whenever the model's
readiness is (HTTP /v2/models/m/ready, gRPC ModelReady); ready only when it returns True;
raising, returning something else or taking longer than is_ready_timeout_s is not ready, with
a log line, and the readiness call still answers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.serverproc import ServerProcess

CONFIG = """\
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 4 ] }} ]
parameters [ {{ key: "is_ready_timeout_s", value: {{ string_value: "0.5" }} }} ]
"""

BODY = """\
import asyncio
import time
from pathlib import Path

import triton_python_backend_utils as pb_utils

FLAG = Path(__file__).parent / "ready_flag"


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor(
                    "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
                )]
            )
            for r in requests
        ]

{is_ready}
"""

IS_READY = {
    "py_ready_plain": "",  # no is_ready(): ready
    "py_ready_true": "    def is_ready(self):\n        return True\n",
    "py_ready_false": "    def is_ready(self):\n        return False\n",
    # Whatever the file next to model.py says, read at each check: readiness follows it.
    "py_ready_flag": "    def is_ready(self):\n        return FLAG.read_text() == 'yes'\n",
    "py_ready_async": (
        "    async def is_ready(self):\n"
        "        await asyncio.sleep(0.01)\n"
        "        return FLAG.read_text() == 'yes'\n"
    ),
    "py_ready_raise": (
        "    def is_ready(self):\n        raise RuntimeError('the camera is unplugged')\n"
    ),
    "py_ready_not_bool": "    def is_ready(self):\n        return 1\n",
    "py_ready_slow": "    def is_ready(self):\n        time.sleep(60)\n        return True\n",
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("is_ready")
    for name, is_ready in IS_READY.items():
        (root / "models" / name / "1").mkdir(parents=True)
        (root / "models" / name / "config.pbtxt").write_text(CONFIG.format(name=name))
        (root / "models" / name / "1" / "model.py").write_text(BODY.format(is_ready=is_ready))
        (root / "models" / name / "1" / "ready_flag").write_text("no")
    with ServerProcess(root / "models", log_path=root / "server.log") as proc:
        yield proc


def flag(server: ServerProcess, name: str, value: str) -> None:
    repository = Path(server.proc.args[server.proc.args.index("--model-repository") + 1])
    (repository / name / "1" / "ready_flag").write_text(value)


@pytest.fixture(params=["http", "grpc"])
def client(request: pytest.FixtureRequest, server: ServerProcess) -> object:
    # A network timeout well above the check's bound: a hung readiness call fails the test.
    if request.param == "http":
        return httpclient.InferenceServerClient(server.http_url, network_timeout=20.0)
    return grpcclient.InferenceServerClient(server.grpc_url)


@pytest.mark.parametrize(
    ("name", "ready"),
    [
        ("py_ready_plain", True),
        ("py_ready_true", True),
        ("py_ready_false", False),
        ("py_ready_not_bool", False),
    ],
)
def test_the_model_is_ready_only_when_is_ready_returns_true(
    client: object, name: str, ready: bool
) -> None:
    assert client.is_model_ready(name) is ready  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", ["py_ready_flag", "py_ready_async"])
def test_readiness_asks_the_model_each_time(
    server: ServerProcess, client: object, name: str
) -> None:
    flag(server, name, "no")
    assert client.is_model_ready(name) is False  # type: ignore[attr-defined]
    flag(server, name, "yes")
    assert client.is_model_ready(name) is True  # type: ignore[attr-defined]
    assert client.is_model_ready(name, "1") is True  # type: ignore[attr-defined]
    flag(server, name, "no")
    assert client.is_model_ready(name) is False  # type: ignore[attr-defined]


def test_a_raising_is_ready_is_not_ready_and_says_why(
    server: ServerProcess, client: object
) -> None:
    assert client.is_model_ready("py_ready_raise") is False  # type: ignore[attr-defined]
    assert "RuntimeError: the camera is unplugged" in server.log()


def test_a_slow_is_ready_is_not_ready_within_its_timeout(
    server: ServerProcess, client: object
) -> None:
    assert client.is_model_ready("py_ready_slow") is False  # type: ignore[attr-defined]
    assert "is_ready() did not return within 0.5 s" in server.log()
    # The model still serves, and readiness of the others is unaffected.
    module = httpclient if isinstance(client, httpclient.InferenceServerClient) else grpcclient
    tensor = module.InferInput("INPUT0", [4], "FP32")
    tensor.set_data_from_numpy(np.arange(4, dtype=np.float32))
    result = client.infer("py_ready_slow", [tensor])  # type: ignore[attr-defined]
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.arange(4, dtype=np.float32))
    assert client.is_model_ready("py_ready_true") is True  # type: ignore[attr-defined]


def test_a_not_ready_model_is_still_listed_ready_in_the_index(server: ServerProcess) -> None:
    """As Triton: the repository index shows the load state; is_ready() is for the ready
    endpoint and strict server readiness."""
    index = httpclient.InferenceServerClient(server.http_url).get_model_repository_index()
    states = {row["name"]: row.get("state") for row in index}
    assert states["py_ready_false"] == "READY"


def test_strict_server_readiness_asks_the_models(tmp_path: Path) -> None:
    """With --strict-readiness the server is ready only while every model's is_ready() says
    so (Triton's strict readiness checks each ready version's instances)."""
    folder = tmp_path / "models" / "py_ready_flag"
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(CONFIG.format(name="py_ready_flag"))
    (folder / "1" / "model.py").write_text(BODY.format(is_ready=IS_READY["py_ready_flag"]))
    (folder / "1" / "ready_flag").write_text("yes")
    args = ("--strict-readiness=true",)
    with ServerProcess(tmp_path / "models", *args, log_path=tmp_path / "server.log") as server:
        http = httpclient.InferenceServerClient(server.http_url, network_timeout=20.0)
        grpc = grpcclient.InferenceServerClient(server.grpc_url)
        assert http.is_server_ready()
        assert grpc.is_server_ready()
        (folder / "1" / "ready_flag").write_text("no")
        assert not http.is_server_ready()
        assert not grpc.is_server_ready()
        assert http.is_server_live()
        (folder / "1" / "ready_flag").write_text("yes")
        assert http.is_server_ready()
        assert grpc.is_server_ready()
