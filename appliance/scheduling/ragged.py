"""Ragged batching: inputs with `allow_ragged_batch` and the config's `batch_input` tensors.

Pure: a batch's requests in, the model's tensors out, as Triton's backends build them (the
backend repository's `BackendInputCollector`, onnxruntime_backend's ragged inputs):

- requests whose ragged inputs differ in shape batch together (the batcher leaves those
  inputs' shapes out of its shape key); the model gets each ragged input as one 1-D tensor,
  every request's elements one after the other;
- each `batch_input` is a tensor the server makes from the batch (the model's own input,
  never sent by a client), from one `source_input`'s shape in each request:
  `BATCH_ELEMENT_COUNT` [requests]: each request's element count;
  `BATCH_ACCUMULATED_ELEMENT_COUNT` [requests]: their running sum;
  `BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO` [requests + 1]: 0, then the running sum;
  `BATCH_MAX_ELEMENT_COUNT_AS_SHAPE` [largest element count]: only its shape says anything
  (zeros here; Triton leaves it uninitialized);
  `BATCH_ITEM_SHAPE` [batch size, source dims]: each batch item's shape without the batch
  dimension; `BATCH_ITEM_SHAPE_FLATTEN`: the same values, flattened.

- each `batch_output` (`BATCH_SCATTER_WITH_INPUT_SHAPE`) is cut back into the requests by
  their source input's shape: a request's part has the output's config shape (batch first)
  with each -1 the source's dimension at the same place, its elements taken in order.

A Python model sees each request's own tensors (as with Triton's Python backend, which makes
no batch inputs): its worker cuts them back out of the 1-D tensor by the shapes each request's
`RequestInfo.ragged_shapes` gives.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from appliance.common.types import Array

KINDS = (
    "BATCH_ELEMENT_COUNT",
    "BATCH_ACCUMULATED_ELEMENT_COUNT",
    "BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO",
    "BATCH_MAX_ELEMENT_COUNT_AS_SHAPE",
    "BATCH_ITEM_SHAPE",
    "BATCH_ITEM_SHAPE_FLATTEN",
)


@dataclass(frozen=True)
class BatchInputSpec:
    """One config `batch_input`: its kind, the model inputs it fills, its type, its source."""

    kind: str
    targets: tuple[str, ...]
    dtype: np.dtype[Any]  # int32 or float32
    source: str


@dataclass(frozen=True)
class ScatterSpec:
    """One config `batch_output`: the output it cuts, the input whose shapes say how."""

    target: str
    source: str
    shape: tuple[int, ...]  # the output's config dims, the batch dimension (-1) first


@dataclass(frozen=True)
class BatchShaping:
    """A model's ragged inputs, batch inputs and batch outputs (all empty: plain batches)."""

    ragged: frozenset[str] = frozenset()
    batch_inputs: tuple[BatchInputSpec, ...] = ()
    scatter: tuple[ScatterSpec, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.ragged or self.batch_inputs or self.scatter)


def batch_input(spec: BatchInputSpec, shapes: Sequence[tuple[int, ...]]) -> Array:
    """The tensor of one batch input from its source's shape in each request (batch first)."""
    counts = [int(np.prod(shape, dtype=np.int64)) for shape in shapes]
    kind = spec.kind
    if kind == "BATCH_ELEMENT_COUNT":
        values: Any = counts
    elif kind == "BATCH_ACCUMULATED_ELEMENT_COUNT":
        values = np.cumsum(counts)
    elif kind == "BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO":
        values = [0, *np.cumsum(counts)]
    elif kind == "BATCH_MAX_ELEMENT_COUNT_AS_SHAPE":
        return np.zeros(max(counts, default=0), dtype=spec.dtype)
    elif kind in ("BATCH_ITEM_SHAPE", "BATCH_ITEM_SHAPE_FLATTEN"):
        rows = [list(shape[1:]) for shape in shapes for _ in range(shape[0] if shape else 0)]
        width = len(shapes[0]) - 1 if shapes and shapes[0] else 0
        items = np.array(rows, dtype=spec.dtype).reshape(len(rows), width)
        return items.reshape(-1) if kind == "BATCH_ITEM_SHAPE_FLATTEN" else items
    else:  # the config check refuses other kinds
        raise ValueError(f"unknown batch input kind '{kind}'")
    return np.asarray(values, dtype=spec.dtype).reshape(-1)


def gather(
    inputs: Sequence[Mapping[str, Array]], shaping: BatchShaping, batch_inputs: bool = True
) -> dict[str, Array]:
    """A batch's tensors from its requests' (in order): ragged inputs as one 1-D tensor of
    every request's elements, the others concatenated along the batch dimension, and (with
    `batch_inputs`) the batch inputs added."""
    gathered: dict[str, Array] = {}
    for name in inputs[0]:
        parts = [request[name] for request in inputs]
        if name in shaping.ragged:
            gathered[name] = np.concatenate([part.reshape(-1) for part in parts])
        else:
            gathered[name] = parts[0] if len(parts) == 1 else np.concatenate(parts)
    if batch_inputs:
        for spec in shaping.batch_inputs:
            shapes = [tuple(request[spec.source].shape) for request in inputs]
            tensor = batch_input(spec, shapes)
            for target in spec.targets:
                gathered[target] = tensor
    return gathered


def scatter(
    spec: ScatterSpec, output: Array, inputs: Sequence[Mapping[str, Array]]
) -> list[Array]:
    """A batch output cut into each request's part (`inputs`: the requests' tensors)."""
    flat = output.reshape(-1)
    parts = []
    taken = 0
    for request in inputs:
        source = request[spec.source].shape
        shape = tuple(
            source[i] if d == -1 and i < len(source) else d for i, d in enumerate(spec.shape)
        )
        count = int(np.prod(shape, dtype=np.int64))
        if taken + count > flat.size:
            raise ValueError(
                f"batch output '{spec.target}' has {flat.size} elements, fewer than its "
                f"requests' shapes take"
            )
        parts.append(flat[taken : taken + count].reshape(shape))
        taken += count
    return parts
