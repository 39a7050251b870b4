"""A load request's file overrides leave nothing behind when the request ends early (issue 17,
item 7): the control service called directly, cancelled while it writes the files and while
the runtime loads them, as aiohttp and gRPC cancel a handler whose client went away."""

from __future__ import annotations

import asyncio
import json
import tempfile
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from appliance.common.settings import ServerSettings
from appliance.runtime.models import ModelRuntime
from appliance.runtime.settings import RuntimeSettings
from appliance.services import load_requests
from appliance.services.control import ControlService, ServerState
from configs.generate import SIMPLE_CONFIG, save, simple_model
from tests.integration.models import _add_constant_model

FRESH = {
    "name": "fresh",
    "backend": "onnxruntime",
    "max_batch_size": 4,
    "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
    "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
}
PARAMETERS = {
    "config": json.dumps(FRESH),
    "file:1/model.onnx": _add_constant_model(1).SerializeToString(),
}


def _left(folder: Path) -> list[str]:
    """What is in the server's temporary folder (a few names: fine to read on the loop)."""
    return sorted(path.name for path in folder.iterdir())


@pytest.fixture
def temp_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


@pytest.fixture
async def control(tmp_path: Path) -> AsyncIterator[ControlService]:
    root = tmp_path / "models"
    save(simple_model(), root / "simple" / "1" / "model.onnx")
    (root / "simple" / "config.pbtxt").write_text(SIMPLE_CONFIG)
    runtime = ModelRuntime(RuntimeSettings.from_server(ServerSettings(model_repositories=(root,))))
    try:
        yield ControlService(runtime, ServerState(loading_done=True), "explicit", False)
    finally:
        await runtime.stop(5.0)


async def test_a_request_cancelled_while_its_files_are_written_leaves_none(
    control: ControlService, temp_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    written, release = threading.Event(), threading.Event()
    write = load_requests._write_override

    def slow_write(*args: Any) -> None:
        write(*args)
        written.set()
        release.wait(10)

    monkeypatch.setattr(load_requests, "_write_override", slow_write)
    task = asyncio.ensure_future(control.load_model("fresh", dict(PARAMETERS)))
    assert await asyncio.to_thread(written.wait, 10)
    assert _left(temp_dir)  # the thread has written the model file
    task.cancel()
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert _left(temp_dir) == []


async def test_a_request_cancelled_while_the_runtime_loads_leaves_none(
    control: ControlService, temp_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loading = asyncio.Event()

    async def load_forever(*args: Any, **kwargs: Any) -> None:
        loading.set()
        await asyncio.Event().wait()

    monkeypatch.setattr(control.runtime, "load", load_forever)
    task = asyncio.ensure_future(control.load_model("fresh", dict(PARAMETERS)))
    await loading.wait()
    assert _left(temp_dir)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert _left(temp_dir) == []


async def test_a_served_override_stays_until_unloaded(
    control: ControlService, temp_dir: Path
) -> None:
    await control.load_model("fresh", dict(PARAMETERS))
    assert len(_left(temp_dir)) == 1
    await control.unload_model("fresh")
    assert _left(temp_dir) == []
