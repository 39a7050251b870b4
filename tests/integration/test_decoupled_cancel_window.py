"""A decoupled Python model hears that its request was cancelled even when the client goes in
the window between the model handing its instance back (execute() returned) and the event
loop reading that: the execution's end then finds the request's caller gone and cancels the
rest of the request (scheduling/instances.py `Job.abandoned`). The window is held open here by
keeping the loop busy while the client cancels and execute() returns."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from appliance import tritonserver
from tests.integration.loop_hold import loop_held

# execute() starts a thread that sends one response, then waits for the request to be
# cancelled and leaves a file saying so; execute() itself returns after HOLD_S.
LATE = """\
import os
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils

HERE = os.path.dirname(os.path.abspath(__file__))


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            threading.Thread(target=self.respond, args=(request,), daemon=True).start()
        time.sleep(0.5)
        return None

    def respond(self, request):
        sender = request.get_response_sender()
        sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([1], np.int32))]))
        deadline = time.monotonic() + 30
        while not request.is_cancelled() and time.monotonic() < deadline:
            time.sleep(0.01)
        if request.is_cancelled():
            with open(os.path.join(HERE, "cancelled"), "w") as marker:
                marker.write(request.request_id())
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""
CONFIG = """\
name: "late"
backend: "python"
model_transaction_policy { decoupled: true }
input [{ name: "IN", data_type: TYPE_INT32, dims: [1] }]
output [{ name: "OUT", data_type: TYPE_INT32, dims: [1] }]
"""


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cancel-window-models")
    (root / "late" / "1").mkdir(parents=True)
    (root / "late" / "1" / "model.py").write_text(LATE)
    (root / "late" / "config.pbtxt").write_text(CONFIG)
    return root


@pytest.fixture(scope="module")
def server(
    repository: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tritonserver.Server]:
    options = tritonserver.Options(
        model_repository=str(repository),
        server_args=["--model-store-dir", str(tmp_path_factory.mktemp("cancel-window-store"))],
    )
    started = tritonserver.Server(options).start(wait_until_ready=True)
    yield started
    started.stop()


def test_a_client_gone_as_execute_returns_is_still_told_to_the_model(
    server: tritonserver.Server, repository: Path
) -> None:
    marker = repository / "late" / "1" / "cancelled"
    responses = server.model("late").infer(
        inputs={"IN": np.array([1], np.int32)}, request_id="window-1"
    )
    first = next(iter(responses))
    np.testing.assert_array_equal(np.from_dlpack(first.outputs["OUT"]), [1])
    with loop_held(server):  # the cancel and the execution's end wait behind it
        responses.cancel()  # reaches the loop first, then the end of execute() at 0.5 s
        time.sleep(1.5)  # execute() has returned meanwhile; the loop has read neither
    deadline = time.monotonic() + 10
    while not marker.exists():
        assert time.monotonic() < deadline, "the model never heard that its request was cancelled"
        time.sleep(0.05)
    assert marker.read_text() == "window-1"
