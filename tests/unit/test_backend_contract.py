"""The backend contract (edge_backends/api.py): its example is a working backend, the bases give
the optional members their defaults, every registered backend declares the contract, the
server calls the members directly, and stopping an instance never hangs on a stuck execution."""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
import re
import textwrap
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, get_type_hints

import numpy as np
import pytest

from appliance.runtime.loader import prepare_model
from appliance.scheduling.instances import BatchResult, InstanceWorker, Job
from edge_backends import api, registry
from edge_backends.api import (
    Arrays,
    Backend,
    BackendBase,
    BackendError,
    CancelCheck,
    ExecutionError,
    InstanceBase,
    InstanceSpec,
    ModelInstance,
    Outputs,
)
from edge_backends.python.backend import PythonBackend

ROOT = Path(__file__).resolve().parents[2]


def docstring_example() -> dict[str, Any]:
    """The classes of api.py's example, defined from the docstring's own text."""
    doc = api.__doc__ or ""
    block = doc.split("::\n", 1)[1]
    lines = []
    for line in block.splitlines():
        if line and not line.startswith("    "):
            break
        lines.append(line)
    namespace: dict[str, Any] = {**vars(api), "Path": Path, "Sequence": Sequence}
    exec(textwrap.dedent("\n".join(lines)), namespace)
    return namespace


def job(x: np.ndarray, emit: Callable[[Outputs], None] | None = None) -> Job:
    return Job(
        inputs={"x": x},
        batch_size=1,
        shape_key=(),
        output_names=("y",),
        future=asyncio.get_running_loop().create_future(),
        emit=emit,
    )


@pytest.fixture
def echo() -> Iterator[Backend]:
    backend: Backend = docstring_example()["EchoBackend"]()
    registry._loaded["echo"] = backend
    try:
        yield backend
    finally:
        registry._loaded.pop("echo", None)


async def test_the_docstring_example_is_served_by_the_loader(
    echo: Backend, tmp_path: Path
) -> None:
    folder = tmp_path / "echo"
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.echo").write_bytes(b"")
    (folder / "config.pbtxt").write_text(
        'backend: "echo"\ndefault_model_filename: "model.echo"\n'
        'instance_group [ { kind: KIND_GPU, count: 1 } ]\n'
    )
    prepared = prepare_model(folder, strict=False)
    assert prepared.failed == {}
    # Completed from the signature (auto_complete added nothing); the GPU group runs on CPU
    # with the base's reason, and the served config says so.
    assert [(i.name, list(i.dims)) for i in prepared.config.input] == [("x", [4])]
    assert [(o.name, list(o.dims)) for o in prepared.config.output] == [("y", [4])]
    assert prepared.config.instance_group[0].kind == prepared.config.instance_group[0].KIND_CPU
    assert any("this backend has no GPU support" in note for note in prepared.notes)
    (worker,) = prepared.versions[0].workers
    try:
        assert worker.inline_ok
        x = np.arange(8, dtype=np.float32).reshape(2, 4)
        (outcome,) = worker.run([job(x)]).outcomes
        assert isinstance(outcome, dict)
        np.testing.assert_array_equal(outcome["y"], x)
    finally:
        assert worker.stop(5)


def test_the_bases_give_the_documented_defaults() -> None:
    example = docstring_example()
    backend, instance = example["EchoBackend"](), example["EchoInstance"]()
    assert backend.auto_complete(Path("model.echo"), {"name": "echo"}, 4) is None
    assert backend.gpu_problem() == "this backend has no GPU support"
    assert instance.runs_inline is True
    assert instance.placement is None
    assert instance.interrupt() is False
    assert instance.asks_readiness is False
    assert instance.ready() is True
    instance.set_cancel_check(lambda: True)  # accepted and ignored
    with pytest.raises(BackendError, match="this backend cannot serve decoupled models"):
        instance.execute_decoupled({"x": np.zeros(1)}, ["y"], lambda outputs: None)


def test_the_protocols_list_what_the_bases_provide() -> None:
    """An instance written against the protocol alone has every member the server calls."""
    instance_members = {"runs_inline", "placement", "execute", "execute_decoupled"}
    instance_members |= {"set_cancel_check", "interrupt", "close", "asks_readiness", "ready"}
    for member in instance_members:
        assert member in vars(ModelInstance), member
        assert hasattr(InstanceBase, member), member
    for member in ("name", "inspect", "create_instance", "auto_complete", "gpu_problem"):
        assert member in vars(Backend) or member in Backend.__annotations__, member
    for member in ("auto_complete", "gpu_problem"):
        assert member in vars(BackendBase), member


@pytest.mark.parametrize("name", registry.known_backends())
def test_every_registered_backend_declares_the_contract(name: str) -> None:
    module_name = registry.backend_module(name)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        pytest.skip(f"backend '{name}' cannot be imported here: {exc}")
    backend_class = vars(module)[registry._BACKENDS[name][1]]
    assert issubclass(backend_class, BackendBase)
    made = get_type_hints(backend_class.create_instance)["return"]
    assert isinstance(made, type)
    assert issubclass(made, InstanceBase), made


def test_the_server_probes_no_backend_member() -> None:
    """The server calls the contract's members; it never asks whether a backend has one."""
    members = [m for m in (*vars(ModelInstance), *vars(Backend)) if not m.startswith("_")]
    members += ["name", "cancel_check", "placement_kind", "placement_note"]  # and old names
    probe = re.compile(
        r"\b(?:getattr|hasattr)\([^,()]+,\s*[\"'](" + "|".join(map(re.escape, members)) + r")[\"']"
    )
    found = [
        f"{path.relative_to(ROOT)}: {match.group(0)}"
        for folder in ("appliance", "edge_backends")
        for path in sorted((ROOT / folder).rglob("*.py"))
        for match in probe.finditer(path.read_text(encoding="utf-8"))
    ]
    assert found == []


# ---- the instance worker: decoupled, cancellation, stop -------------------------------------


class Gated(InstanceBase):
    """Waits on `release` in execute; records close; can be made interruptible."""

    def __init__(self, interruptible: bool = False) -> None:
        self.started = threading.Event()
        self.release = threading.Event()
        self.closed = threading.Event()
        self.executing = False
        self.closed_while_executing = False
        self.interruptible = interruptible
        self.interrupted = False
        self.check: CancelCheck | None = None
        self.saw_cancel = threading.Event()

    def set_cancel_check(self, check: CancelCheck) -> None:
        self.check = check

    def execute(self, inputs: Arrays, output_names: Sequence[str]) -> Outputs:
        self.executing = True
        self.started.set()
        try:
            while not self.release.wait(0.01):
                if self.check is not None and self.check():
                    self.saw_cancel.set()
            if self.interrupted:
                raise ExecutionError("interrupted")
            return {"y": np.asarray(inputs["x"])}
        finally:
            self.executing = False

    def interrupt(self) -> bool:
        if not self.interruptible:
            return False
        self.interrupted = True
        self.release.set()
        return True

    def close(self) -> None:
        self.closed_while_executing = self.executing
        self.closed.set()


def started(instance: Gated) -> InstanceWorker:
    worker = InstanceWorker("m_v1_i_0", instance, batching=False)
    worker.start(asyncio.get_running_loop())
    return worker


def collect() -> tuple[asyncio.Future[BatchResult], Callable[[InstanceWorker, BatchResult], None]]:
    done: asyncio.Future[BatchResult] = asyncio.get_running_loop().create_future()

    def on_done(worker: InstanceWorker, result: BatchResult) -> None:
        done.set_result(result)

    return done, on_done


async def test_a_backend_without_decoupled_support_fails_the_request_with_the_reason() -> None:
    worker = started(Gated())
    sent: list[Outputs] = []
    done, on_done = collect()
    worker.submit([job(np.zeros(1), emit=sent.append)], on_done)
    (outcome,) = (await done).outcomes
    assert isinstance(outcome, BackendError)
    assert str(outcome) == "this backend cannot serve decoupled models"
    assert sent == []
    assert await asyncio.to_thread(worker.stop, 5)


async def test_the_cancel_check_says_when_every_caller_has_gone() -> None:
    instance = Gated()
    worker = started(instance)
    assert instance.check is not None
    assert not instance.check()  # nothing running
    done, on_done = collect()
    request = job(np.zeros(1))
    worker.submit([request], on_done)
    await asyncio.to_thread(instance.started.wait, 5)
    assert not instance.check()  # its caller still waits
    request.future.cancel()
    assert await asyncio.to_thread(instance.saw_cancel.wait, 5)
    instance.release.set()
    await done
    assert await asyncio.to_thread(worker.stop, 5)


async def test_stop_closes_the_instance_once_after_its_last_batch() -> None:
    instance = Gated()
    instance.release.set()
    worker = started(instance)
    done, on_done = collect()
    worker.submit([job(np.ones(1))], on_done)
    assert await asyncio.to_thread(worker.stop, None)
    assert isinstance((await done).outcomes[0], dict)
    assert instance.closed.is_set()
    assert not instance.closed_while_executing
    assert await asyncio.to_thread(worker.stop, 1)  # again: nothing more to do


def test_stop_closes_an_instance_whose_thread_never_started() -> None:
    instance = Gated()
    assert InstanceWorker("never", instance, batching=False).stop(1)
    assert instance.closed.is_set()


async def test_stop_gives_up_on_a_stuck_execution_without_closing_under_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    instance = Gated()  # in-process: cannot be interrupted
    worker = started(instance)
    done, on_done = collect()
    worker.submit([job(np.ones(1))], on_done)
    await asyncio.to_thread(instance.started.wait, 5)
    began = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="appliance.scheduling.instances"):
        assert not await asyncio.to_thread(worker.stop, 0.2)
    assert time.monotonic() - began < 2
    assert "instance m_v1_i_0 did not finish its execution within 0.2 s" in caplog.text
    assert not instance.closed.is_set()  # never closed while it executes
    instance.release.set()  # the execution returns at last: the thread closes the instance
    assert await asyncio.to_thread(instance.closed.wait, 5)
    assert not instance.closed_while_executing
    await done


async def test_stop_interrupts_an_instance_that_can_be_interrupted() -> None:
    instance = Gated(interruptible=True)
    worker = started(instance)
    done, on_done = collect()
    worker.submit([job(np.ones(1))], on_done)
    await asyncio.to_thread(instance.started.wait, 5)
    assert await asyncio.to_thread(worker.stop, 0.2)
    assert instance.closed.is_set()
    assert not instance.closed_while_executing
    (outcome,) = (await done).outcomes
    assert isinstance(outcome, ExecutionError)


STUCK_MODEL = """
import os
import time
from pathlib import Path


class TritonPythonModel:
    def initialize(self, args):
        (Path(__file__).parent / "pid").write_text(str(os.getpid()))

    def execute(self, requests):
        time.sleep(600)
"""


async def test_stopping_a_stuck_python_model_ends_its_process(tmp_path: Path) -> None:
    version = tmp_path / "stuck" / "1"
    version.mkdir(parents=True)
    (version / "model.py").write_text(STUCK_MODEL)
    spec = InstanceSpec("stuck", 1, version / "model.py", "stuck_0")
    instance = await asyncio.to_thread(PythonBackend().create_instance, spec)
    pid = int((version / "pid").read_text())
    worker = InstanceWorker("stuck_v1_stuck_0", instance, batching=False)
    assert not worker.inline_ok
    worker.start(asyncio.get_running_loop())
    done, on_done = collect()
    worker.submit([job(np.ones(1, dtype=np.float32))], on_done)
    began = time.monotonic()
    assert await asyncio.to_thread(worker.stop, 0.5)
    assert time.monotonic() - began < 5
    (outcome,) = (await done).outcomes
    assert isinstance(outcome, ExecutionError)
    assert "stopped while executing" in str(outcome)
    with pytest.raises(ProcessLookupError):  # killed and reaped, not restarted
        os.kill(pid, 0)
