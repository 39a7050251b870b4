"""Triton's generate extension: `/generate` (one JSON response) and `/generate_stream` (SSE).

The body's fields name the model's inputs: a scalar becomes a one-element tensor, a list a
tensor of its length (with a batch dimension of 1 for batching models), converted to the
input's datatype; `parameters` become request parameters. Each response maps output names
to values (a scalar for one element, else a flat list; BYTES as text).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from appliance.common.errors import InvalidInput
from appliance.common.tensors import from_list
from appliance.common.types import InferRequest, InferResponse, Tensor


def decode_generate(doc: Any, model: str, version: str, metadata: dict[str, Any]) -> InferRequest:
    if not isinstance(doc, dict):
        raise InvalidInput("generate request body must be a JSON object")
    inputs_meta = {i["name"]: i for i in metadata["inputs"]}
    batching = bool(metadata["inputs"]) and metadata["inputs"][0]["shape"][:1] == [-1]
    parameters = doc.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise InvalidInput("'parameters' must be a JSON object")
    inputs = []
    for name, value in doc.items():
        if name == "parameters":
            continue
        meta = inputs_meta.get(name)
        if meta is None:
            parameters.setdefault(name, value)  # unknown fields are parameters, as in Triton
            continue
        values = value if isinstance(value, list) else [value]
        shape = ((1,) if batching else ()) + (len(values),)
        where = f"model '{model}' input '{name}'"
        inputs.append(
            Tensor(
                name, meta["datatype"], shape, from_list(values, meta["datatype"], shape, where)
            )
        )
    return InferRequest(
        model_name=model, model_version=version, inputs=inputs, parameters=parameters
    )


def encode_generate(response: InferResponse) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "model_name": response.model_name,
        "model_version": response.model_version,
    }
    for tensor in response.outputs:
        flat = np.asarray(tensor.data).ravel()
        values = [
            v.decode("utf-8", errors="replace") if isinstance(v, bytes) else v
            for v in flat.tolist()
        ]
        doc[tensor.name] = values[0] if len(values) == 1 else values
    return doc
