"""Model warm-up: config `model_warmup` samples run on every instance before a version serves.

Samples are zeros, random data, or raw tensor files in the model's `warmup/` folder (BYTES
files hold Triton's length-prefixed elements). A sample that fails fails the version's load
with the reason, so a model never reports ready before its first (slow) executions are done.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from appliance.common.errors import ConfigError
from appliance.common.model_config import ModelConfig, datatype_of, model_shape
from appliance.common.serialization import decode_bytes
from edge_backends.api import BackendError, ModelInstance
from edge_backends.datatypes import BY_TRITON

log = logging.getLogger(__name__)

WARMUP_FOLDER = "warmup"


def _sample_array(
    config: ModelConfig, model_dir: Path, sample: Any, name: str, spec: Any
) -> np.ndarray[Any, Any]:
    where = f"model '{config.name}' warm-up sample '{sample.name}' input '{name}'"
    entry = next((i for i in config.input if i.name == name), None)
    if entry is None:
        raise ConfigError(f"{where}: the model has no such input")
    datatype = datatype_of(spec.data_type)
    dtype = BY_TRITON[datatype].numpy
    dims = tuple(spec.dims)
    if any(d < 0 for d in dims):
        raise ConfigError(f"{where}: dims {list(dims)} must be fixed (no -1)")
    batch = (max(1, sample.batch_size),) if config.max_batch_size > 0 else ()
    shape = batch + dims
    which = spec.WhichOneof("input_data_type")
    if which == "input_data_file":
        path = model_dir / WARMUP_FOLDER / spec.input_data_file
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise ConfigError(f"{where}: cannot read '{path}': {exc.strerror}") from exc
        count = math.prod(dims)
        if datatype == "BYTES":
            one = decode_bytes(raw, count, where)
        else:
            if len(raw) != count * dtype.itemsize:
                raise ConfigError(
                    f"{where}: '{path}' has {len(raw)} bytes, expected {count * dtype.itemsize}"
                )
            one = np.frombuffer(raw, dtype=dtype, count=count)
        array = np.broadcast_to(one.reshape(dims), shape).copy()
    elif which == "random_data":
        rng = np.random.default_rng(0)
        if datatype == "BYTES":
            array = np.full(shape, b"warm-up", dtype=np.object_)
        elif datatype == "BOOL":
            array = rng.integers(0, 2, size=shape).astype(np.bool_)
        elif dtype.kind in "iu":
            array = rng.integers(0, 100, size=shape).astype(dtype)
        else:
            array = rng.random(size=shape).astype(dtype)
    else:  # zero_data (also the default)
        array = (
            np.full(shape, b"", dtype=np.object_)
            if datatype == "BYTES"
            else np.zeros(shape, dtype=dtype)
        )
    if entry.HasField("reshape"):
        array = array.reshape(batch + tuple(model_shape(entry)))
    return np.asarray(array)


def warm_up(
    config: ModelConfig, model_dir: Path, version: int, instances: list[ModelInstance]
) -> None:
    """Run each warm-up sample `count` times on every instance (blocking)."""
    outputs = [o.name for o in config.output]
    for sample in config.model_warmup:
        inputs = {
            name: _sample_array(config, model_dir, sample, name, spec)
            for name, spec in sample.inputs.items()
        }
        started = time.monotonic()
        runs = max(1, sample.count)
        for instance in instances:
            for _ in range(runs):
                try:
                    instance.execute(inputs, outputs)
                except BackendError as exc:
                    raise ConfigError(
                        f"model '{config.name}' version {version}: warm-up sample "
                        f"'{sample.name}' failed: {exc}"
                    ) from exc
        log.info(
            "model '%s' version %d: warm-up '%s' done (%d runs on %d instances, %.0f ms)",
            config.name,
            version,
            sample.name,
            runs,
            len(instances),
            (time.monotonic() - started) * 1000,
        )
