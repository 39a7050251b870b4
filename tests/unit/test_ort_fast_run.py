"""The ONNX Runtime instance's hot path (issue 20): a CPU session runs through the binding's own
`run`, skipping InferenceSession.run's Python checks. Pins the internal it uses
(`InferenceSession._sess.run`) and that its answers and errors are the public run's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from configs.generate import save, simple_model, simple_string_model
from edge_backends.api import ExecutionError, InputRejected, InstanceSpec
from edge_backends.ort import OrtBackend, OrtInstance


@pytest.fixture
def instance(tmp_path: Path) -> OrtInstance:
    path = tmp_path / "model.onnx"
    save(simple_model(), path)
    spec = InstanceSpec(
        model_name="simple", model_version=1, model_path=path, instance_name="simple_0"
    )
    return OrtBackend().create_instance(spec)


def test_a_cpu_session_runs_through_the_binding(instance: OrtInstance) -> None:
    session = instance._session
    assert isinstance(session, ort.InferenceSession)
    # The internal this relies on: if onnxruntime renames it, this fails (and the public run
    # would be used, slower but right).
    assert instance._run == session._sess.run
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 3, dtype=np.int32)
    outputs = instance.execute({"INPUT0": a, "INPUT1": b}, ["OUTPUT1", "OUTPUT0"])
    expected = session.run(["OUTPUT1", "OUTPUT0"], {"INPUT0": a, "INPUT1": b})
    assert list(outputs) == ["OUTPUT1", "OUTPUT0"]
    np.testing.assert_array_equal(outputs["OUTPUT0"], expected[1])
    np.testing.assert_array_equal(outputs["OUTPUT1"], a - b)


def test_a_view_over_received_bytes_runs_without_a_copy(instance: OrtInstance) -> None:
    """Inputs arrive as read-only views over the request's bytes, at any offset."""
    body = bytearray(1 + 2 * 64)
    values = np.arange(16, dtype=np.int32)
    body[1:65] = values.tobytes()
    body[65:129] = values.tobytes()
    a = np.frombuffer(memoryview(body)[1:65], dtype=np.int32).reshape(1, 16)  # misaligned
    b = np.frombuffer(bytes(body[65:129]), dtype=np.int32).reshape(1, 16)  # read-only
    assert not a.flags.aligned
    assert not b.flags.writeable
    outputs = instance.execute({"INPUT0": a, "INPUT1": b}, ["OUTPUT0"])
    np.testing.assert_array_equal(outputs["OUTPUT0"], 2 * values.reshape(1, 16))


def test_a_missing_input_is_an_execution_error(instance: OrtInstance) -> None:
    a = np.zeros((1, 16), dtype=np.int32)
    with pytest.raises(ExecutionError, match=r"onnxruntime failed: .*INPUT1"):
        instance.execute({"INPUT0": a}, ["OUTPUT0"])


def test_a_received_tensor_reaches_onnxruntime_without_a_copy(instance: OrtInstance) -> None:
    """Issue 20: the front ends hand the instance np.frombuffer views over the request's bytes
    (the HTTP binary tensor after the JSON header, at any offset); `execute` passes those very
    arrays to the binding, not a contiguous or aligned copy (600 KB a SqueezeNet request)."""
    body = bytearray(3 + 64)
    body[3:] = np.arange(16, dtype=np.int32).tobytes()
    a = np.frombuffer(memoryview(body)[3:], dtype=np.int32).reshape(1, 16)  # misaligned view
    b = np.ones((1, 16), dtype=np.int32)
    handed: list[dict[str, np.ndarray]] = []
    real_run = instance._run

    def recording_run(names: list[str], feed: dict[str, np.ndarray], options: object) -> object:
        handed.append(feed)
        return real_run(names, feed, options)

    instance._run = recording_run
    outputs = instance.execute({"INPUT0": a, "INPUT1": b}, ["OUTPUT0"])
    np.testing.assert_array_equal(outputs["OUTPUT0"], a + b)
    (feed,) = handed
    assert feed["INPUT0"] is a
    assert np.shares_memory(feed["INPUT0"], np.frombuffer(body, dtype=np.uint8))


def test_onnxruntime_wraps_a_misaligned_read_only_view_without_copying_it() -> None:
    """What the no-copy path relies on in onnxruntime's binding: a C-contiguous numpy input is
    wrapped as it is, aligned or not, read-only or not (its CreateTensor copies only arrays that
    are not contiguous). If an onnxruntime release started copying misaligned inputs, every HTTP
    binary image request would pay a copy on the instance thread, and this fails."""
    data = bytes(1) + np.arange(12, dtype=np.float32).tobytes()
    view = np.frombuffer(data, dtype=np.float32, count=12, offset=1).reshape(3, 4)
    assert not view.flags.aligned
    assert not view.flags.writeable
    value = ort.OrtValue.ortvalue_from_numpy(view)
    assert value.data_ptr() == view.ctypes.data
    np.testing.assert_array_equal(value.numpy(), view)


class _DtypeUnread(np.ndarray):
    """An input array whose dtype Python code must not read (onnxruntime's binding reads it in
    C, through the array's descriptor, not through this property)."""

    @property
    def dtype(self) -> np.dtype[Any]:
        raise AssertionError("execute looked at the input's dtype in Python")


def test_a_model_without_string_tensors_passes_arrays_through_unlooked_at(
    instance: OrtInstance,
) -> None:
    """Issue 20: on the server's core the per-array dtype checks ran cache-cold after each
    image model's execution, ~35 us a request; a model with no string tensors skips them."""
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 3, dtype=np.int32)
    outputs = instance.execute(
        {"INPUT0": a.view(_DtypeUnread), "INPUT1": b.view(_DtypeUnread)}, ["OUTPUT0", "OUTPUT1"]
    )
    assert list(outputs) == ["OUTPUT0", "OUTPUT1"]
    np.testing.assert_array_equal(outputs["OUTPUT0"], a + b)
    np.testing.assert_array_equal(outputs["OUTPUT1"], a - b)


def test_a_string_model_still_converts_bytes_in_and_out(tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    save(simple_string_model(), path)
    spec = InstanceSpec(
        model_name="simple_string", model_version=1, model_path=path, instance_name="s_0"
    )
    strings = OrtBackend().create_instance(spec)
    a = np.array([[str(i).encode() for i in range(16)]], dtype=np.object_)
    b = np.array([[b"1"] * 16], dtype=np.object_)
    outputs = strings.execute({"INPUT0": a, "INPUT1": b}, ["OUTPUT0", "OUTPUT1"])
    assert outputs["OUTPUT0"][0, 15] == b"16"
    assert outputs["OUTPUT1"][0, 0] == b"-1"
    with pytest.raises(InputRejected, match="not valid UTF-8"):
        strings.execute({"INPUT0": np.array([[b"\xff"] * 16], dtype=np.object_), "INPUT1": b}, [])
