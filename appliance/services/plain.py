"""The plain lane: a request known valid because it looks exactly like one already validated.

An in-process caller (the embedding API, appliance/embed/model.py) sends the same request
shape over and over: the same input names in the same order, the same numpy dtypes and
shapes, no parameters, every output. Once the general path (`validate`) has accepted such a
request for a served version, `PlainLane` remembers its signature on that version
(`ServedVersion.plain`); a later request whose inputs match it by identity of dtype and
equality of shape is valid for the same reasons, so its job is made from what was computed
then (model shapes, shape key, size), without the checks, the request objects or the error
texts. Anything else (another dtype, shape, name, order, an array subclass, a parameter) takes
the general path, which gives the same answer or the exact error it always gave.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import numpy as np

from appliance.common.types import Array, InferRequest, InferResponse, Tensor
from appliance.runtime.registry import ServedVersion
from appliance.scheduling.instances import Job
from edge_backends.datatypes import from_numpy


class PlainLane:
    """The signature of one validated plain request of one served version, and what its
    validation computed (see the module docstring). Immutable once made."""

    __slots__ = (
        "_batching",
        "batch_size",
        "datatypes",
        "dtypes",
        "model_shapes",
        "names",
        "nbytes",
        "output_names",
        "outputs",
        "shape_key",
        "shapes",
        "version",
    )

    def __init__(self, served: ServedVersion, request: InferRequest, job: Job) -> None:
        self.names = tuple(t.name for t in request.inputs)
        self.datatypes = tuple(t.datatype for t in request.inputs)
        self.dtypes = tuple(t.data.dtype for t in request.inputs)
        self.shapes = tuple(tuple(t.shape) for t in request.inputs)
        # The model-shaped form of each input (validate's reshape to the model's dims), or
        # None where the caller's shape is the model's.
        self.model_shapes = tuple(
            None if job.inputs[t.name].shape == tuple(t.shape) else job.inputs[t.name].shape
            for t in request.inputs
        )
        self.nbytes = job.nbytes
        self.batch_size = job.batch_size
        self.shape_key = job.shape_key
        self.version = str(served.version)
        self.output_names = served.all_outputs
        # Every output, as `InferenceService._response` makes it: (name, datatype, the
        # config's dims to reshape to, or None).
        self.outputs = tuple(
            (
                name,
                rule.datatype,
                rule.dims if rule.model_dims is not None and rule.dims.count(-1) <= 1 else None,
            )
            for name, rule in served.outputs.items()
        )
        self._batching = served.max_batch_size > 0

    @staticmethod
    def learnable(served: ServedVersion, request: InferRequest) -> bool:
        """Whether a request the general path validated may become the version's signature:
        no parameters, every output, numeric numpy inputs as their datatype says."""
        if request.parameters or request.outputs is not None:
            return False
        if served.ensemble is not None or served.sequence or served.decoupled:
            return False
        for tensor in request.inputs:
            data = tensor.data
            if type(data) is not np.ndarray or data.dtype.kind not in "biuf":
                return False
            if tuple(data.shape) != tuple(tensor.shape):
                return False
            # A later request's datatype is its dtype's (embed/tensor.py's input_array): the
            # signature's must be too (a list made BF16's storage dtype is not UINT16's).
            if from_numpy(data.dtype).triton != tensor.datatype:
                return False
        return True

    def matches(self, inputs: Mapping[str, Any]) -> bool:
        """The inputs are this signature's: same names in the same order, plain numpy arrays
        of the same dtype object and shape."""
        if len(inputs) != len(self.names):
            return False
        names, dtypes, shapes = self.names, self.dtypes, self.shapes
        for i, (name, value) in enumerate(inputs.items()):
            if (
                name != names[i]
                or type(value) is not np.ndarray
                or value.dtype is not dtypes[i]
                or value.shape != shapes[i]
            ):
                return False
        return True

    def job(
        self, inputs: Mapping[str, Array], request_id: str, loop: asyncio.AbstractEventLoop
    ) -> Job:
        """The job `validate` makes of matching inputs."""
        arrays = dict(inputs)
        for i, shape in enumerate(self.model_shapes):
            if shape is not None:
                name = self.names[i]
                arrays[name] = arrays[name].reshape(shape)
        job = Job(
            inputs=arrays,
            batch_size=self.batch_size,
            shape_key=self.shape_key,
            output_names=self.output_names,
            future=loop.create_future(),
            nbytes=self.nbytes,
        )
        job.request_id, job.parameters = request_id, {}
        return job

    def request(
        self, inputs: Mapping[str, Array], model: str, version: str, request_id: str
    ) -> InferRequest:
        """The general path's request for matching inputs (when the lane cannot run it)."""
        return InferRequest(
            model_name=model,
            model_version=version,
            id=request_id,
            inputs=[
                Tensor(name, self.datatypes[i], self.shapes[i], inputs[name])
                for i, name in enumerate(self.names)
            ],
            outputs=None,
            parameters={},
        )

    def response(self, model: str, request_id: str, outputs: dict[str, Array]) -> InferResponse:
        """`InferenceService._response` for a plain request: every output the model made."""
        tensors = []
        for name, datatype, dims in self.outputs:
            array = outputs.get(name)
            if array is None:  # not produced (an optional output): left out, as Triton does
                continue
            if dims is not None:
                array = array.reshape(((array.shape[0],) if self._batching else ()) + dims)
            tensors.append(Tensor(name, datatype, array.shape, array))
        return InferResponse(
            model_name=model, model_version=self.version, id=request_id, outputs=tensors
        )
