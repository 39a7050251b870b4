"""The embedding API's plain lane (appliance/services/plain.py): a request that looks exactly
like one already validated for its model version skips validation. Shown here against the
general path on the real server: the same outputs, the same errors (word for word), the same
statistics (issue 38)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from appliance import tritonserver
from configs.generate import SIMPLE_CONFIG, save, simple_model

RESHAPED = """\
name: "reshaped"
backend: "identity"
max_batch_size: 0
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ 4 ], reshape: { shape: [ 2, 2 ] } } ]
output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 4 ], reshape: { shape: [ 2, 2 ] } } ]
"""
# Batching, so that a request finding the instance busy is queued on the loop (the lane does
# not wait for it), and slow enough for concurrent callers to find it busy.
SLOW = """\
name: "slow"
backend: "identity"
max_batch_size: 4
dynamic_batching { }
input [ { name: "INPUT0", data_type: TYPE_INT32, dims: [ 2 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_INT32, dims: [ 2 ] } ]
parameters [ { key: "execute_delay_ms", value: { string_value: "20" } } ]
"""
SIMPLE_COPIES = ("simple", "general", "fresh")


def _repository(root: Path) -> Path:
    for name in SIMPLE_COPIES:
        save(simple_model(), root / name / "1" / "model.onnx")
        (root / name / "config.pbtxt").write_text(SIMPLE_CONFIG.replace('"simple"', f'"{name}"'))
    for name, config in (("reshaped", RESHAPED), ("slow", SLOW)):
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(config)
    return root


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tritonserver.Server]:
    repo = _repository(tmp_path_factory.mktemp("plain-models"))
    options = tritonserver.Options(
        model_repository=str(repo),
        model_control_mode=tritonserver.ModelControlMode.EXPLICIT,
        startup_models=[*SIMPLE_COPIES, "reshaped", "slow"],
        server_args=["--model-store-dir", str(tmp_path_factory.mktemp("plain-store"))],
    )
    started = tritonserver.Server(options).start(wait_until_ready=True)
    yield started
    started.stop()


def _lanes(server: tritonserver.Server, name: str) -> tuple[Any, ...]:
    """The signatures the model's plain lane has learned (none: every request validated)."""
    running = server._require()
    return running.appliance.runtime.get(name, "").plain


def _inputs(i: int = 0, batch: int = 1) -> dict[str, np.ndarray[Any, Any]]:
    return {
        "INPUT0": np.full((batch, 16), i, np.int32),
        "INPUT1": np.arange(16, dtype=np.int32).reshape(1, 16).repeat(batch, axis=0),
    }


def _outputs(model: tritonserver.Model, **kwargs: Any) -> dict[str, np.ndarray[Any, Any]]:
    (response,) = model.infer(**kwargs)
    return {name: np.from_dlpack(tensor) for name, tensor in response.outputs.items()}


def _error(model: tritonserver.Model, inputs: dict[str, Any]) -> tuple[type, str]:
    (response,) = model.infer(inputs=inputs, raise_on_error=False)
    assert response.error is not None
    assert response.final
    return type(response.error), str(response.error)


def _counts(model: tritonserver.Model) -> dict[str, Any]:
    """The statistics' counts (not the times, which differ from run to run)."""
    stats = model.statistics()["model_stats"][0]
    inference = stats["inference_stats"]
    return {
        "inference": {name: int(value["count"]) for name, value in inference.items()},
        "execution_count": int(stats["execution_count"]),
        "inference_count": int(stats["inference_count"]),
        "batch_stats": sorted(
            (int(b["batch_size"]), {k: int(v["count"]) for k, v in b.items() if k != "batch_size"})
            for b in stats["batch_stats"]
        ),
    }


def test_plain_requests_give_the_general_paths_outputs(server: tritonserver.Server) -> None:
    model = server.model("simple")
    assert _lanes(server, "simple") == ()  # nothing learned before a request was validated
    first = _outputs(model, inputs=_inputs(3))
    assert len(_lanes(server, "simple")) == 1
    for i in range(50):  # the lane's
        got = _outputs(model, inputs=_inputs(i))
        np.testing.assert_array_equal(got["OUTPUT0"], _inputs(i)["INPUT0"] + _inputs(i)["INPUT1"])
        np.testing.assert_array_equal(got["OUTPUT1"], _inputs(i)["INPUT0"] - _inputs(i)["INPUT1"])
    # The same request through the general path (an output selection is not plain)
    general = _outputs(model, inputs=_inputs(3), output_names=["OUTPUT0", "OUTPUT1"])
    assert general.keys() == first.keys()
    for name in first:
        np.testing.assert_array_equal(general[name], first[name])
    assert len(_lanes(server, "simple")) == 1  # a request that is not plain is not learned
    (response,) = model.infer(inputs=_inputs(1), request_id="abc")
    assert response.request_id == "abc"
    assert response.outputs["OUTPUT0"].data_type == tritonserver.DataType.INT32
    assert response.outputs["OUTPUT0"].shape == [1, 16]


def test_inputs_unlike_the_signature_still_work(server: tritonserver.Server) -> None:
    model = server.model("simple")
    _outputs(model, inputs=_inputs(1))
    reordered = dict(reversed(list(_inputs(5).items())))  # another order: the general path
    got = _outputs(model, inputs=reordered)["OUTPUT0"][0]
    np.testing.assert_array_equal(got, 5 + np.arange(16))
    listed = {"INPUT0": [[2] * 16], "INPUT1": [list(range(16))]}  # lists: converted
    np.testing.assert_array_equal(_outputs(model, inputs=listed)["OUTPUT0"][0], 2 + np.arange(16))
    wide = np.zeros((1, 32), np.int32)
    view = {"INPUT0": wide[:, ::2], "INPUT1": _inputs()["INPUT1"]}  # a strided view, same shape
    np.testing.assert_array_equal(_outputs(model, inputs=view)["OUTPUT0"][0], np.arange(16))
    batch = _outputs(model, inputs=_inputs(7, batch=3))  # another shape: another signature
    three = _inputs(7, batch=3)
    np.testing.assert_array_equal(batch["OUTPUT0"], three["INPUT0"] + three["INPUT1"])
    assert len(_lanes(server, "simple")) >= 2


BAD: dict[str, dict[str, Any]] = {
    "shape": {"INPUT0": np.zeros((1, 15), np.int32), "INPUT1": np.zeros((1, 16), np.int32)},
    "dtype": {"INPUT0": np.zeros((1, 16), np.float32), "INPUT1": np.zeros((1, 16), np.int32)},
    "batch": {"INPUT0": np.zeros((9, 16), np.int32), "INPUT1": np.zeros((9, 16), np.int32)},
    "batches": {"INPUT0": np.zeros((1, 16), np.int32), "INPUT1": np.zeros((2, 16), np.int32)},
    "missing": {"INPUT0": np.zeros((1, 16), np.int32)},
    "unknown": {
        "INPUT0": np.zeros((1, 16), np.int32),
        "INPUT1": np.zeros((1, 16), np.int32),
        "INPUT2": np.zeros((1, 16), np.int32),
    },
    "renamed": {"INPUT0": np.zeros((1, 16), np.int32), "INPUTX": np.zeros((1, 16), np.int32)},
}


def test_bad_requests_after_good_ones_get_the_general_paths_errors(
    server: tritonserver.Server,
) -> None:
    model = server.model("fresh")
    assert _lanes(server, "fresh") == ()
    before = {case: _error(model, inputs) for case, inputs in BAD.items()}  # all validated
    assert _lanes(server, "fresh") == ()  # a refused request is not learned
    assert "unexpected shape for input 'INPUT0'" in before["shape"][1]
    assert "data-type is 'FP32'" in before["dtype"][1]
    for i in range(20):
        _outputs(model, inputs=_inputs(i))
    assert len(_lanes(server, "fresh")) == 1
    after = {case: _error(model, inputs) for case, inputs in BAD.items()}
    assert after == before
    counts = _counts(model)
    assert counts["inference"]["success"] == 20  # refusals are not counted, as before
    assert counts["inference"]["fail"] == 0


def test_statistics_after_plain_requests_equal_the_general_paths(
    server: tritonserver.Server,
) -> None:
    lane, general = server.model("simple"), server.model("general")
    server.load("simple")  # a new version: its statistics from 0, nothing learned
    assert _lanes(server, "simple") == ()
    n = 40
    for i in range(n):
        _outputs(lane, inputs=_inputs(i))
        _outputs(general, inputs=_inputs(i), output_names=["OUTPUT0", "OUTPUT1"])
    for i in range(5):  # a batch of 2 each: inference_count counts their items
        _outputs(lane, inputs=_inputs(i, batch=2))
        _outputs(general, inputs=_inputs(i, batch=2), output_names=["OUTPUT0", "OUTPUT1"])
    assert len(_lanes(server, "simple")) == 2
    assert _lanes(server, "general") == ()
    counts = _counts(lane)
    assert counts == _counts(general)
    assert counts["inference"]["success"] == n + 5
    assert counts["inference"]["queue"] == n + 5
    assert counts["inference"]["compute_infer"] == n + 5
    assert counts["execution_count"] == n + 5
    assert counts["inference_count"] == n + 2 * 5
    assert counts["batch_stats"][0][0] == 1
    assert counts["batch_stats"][0][1]["compute_infer"] == n
    assert counts["batch_stats"][1][0] == 2
    assert counts["batch_stats"][1][1]["compute_infer"] == 5


def test_reshaped_inputs_and_outputs_in_the_lane(server: tritonserver.Server) -> None:
    model = server.model("reshaped")
    for i in range(5):
        x = np.arange(4, dtype=np.float32) + i
        (response,) = model.infer(inputs={"INPUT0": x})
        out = response.outputs["OUTPUT0"]
        assert out.shape == [4]  # the config's dims, not the model's [2, 2]
        np.testing.assert_array_equal(np.from_dlpack(out), x)
    assert len(_lanes(server, "reshaped")) == 1
    assert "Expected [4], got [2,2]" in _error(model, {"INPUT0": np.zeros((2, 2), np.float32)})[1]


def test_lane_requests_that_find_the_instance_busy_are_queued(
    server: tritonserver.Server,
) -> None:
    model = server.model("slow")
    _outputs(model, inputs={"INPUT0": np.zeros((1, 2), np.int32)})  # learned
    assert len(_lanes(server, "slow")) == 1
    wrong: list[str] = []

    def calls(start: int) -> None:
        for i in range(start, start + 8):
            got = _outputs(model, inputs={"INPUT0": np.full((1, 2), i, np.int32)})["OUTPUT0"]
            if got.tolist() != [[i, i]]:
                wrong.append(f"{i}: {got.tolist()}")

    threads = [threading.Thread(target=calls, args=(k * 100,)) for k in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert wrong == []
    counts = _counts(model)
    assert counts["inference"]["success"] == 1 + 3 * 8
    assert counts["inference_count"] == 1 + 3 * 8
    assert len(_lanes(server, "slow")) == 1
