"""The gRPC codec's fast paths for unary ModelInfer (frontends/grpc/codec.py): a response's raw
output bytes for every datatype and memory layout, a request's inputs and requested outputs
with and without parameters, and the refusals on the same paths (the server end to end:
tests/integration)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from appliance.common.errors import InvalidInput
from appliance.common.protocol import service_pb2 as pb
from appliance.common.serialization import encode_bytes
from appliance.common.types import InferResponse, Tensor
from appliance.frontends.grpc.codec import decode_request, encode_response, names_regions
from appliance.services.shared_memory import SharedMemoryRegistry
from tests.unit.test_tensors import NUMERIC  # datatype -> numpy type, one table for the tests


def _encoded(array: np.ndarray[Any, Any], datatype: str) -> bytes:
    response = InferResponse("m", "1", "r", [Tensor("y", datatype, array.shape, array)])
    message = pb.ModelInferResponse.FromString(encode_response(response).SerializeToString())
    assert [(o.name, o.datatype, list(o.shape)) for o in message.outputs] == [
        ("y", datatype, list(array.shape))
    ]
    assert (message.model_name, message.model_version, message.id) == ("m", "1", "r")
    return bytes(message.raw_output_contents[0])


@pytest.mark.parametrize("datatype", sorted(NUMERIC))
def test_raw_output_bytes_are_the_wire_dtype_in_row_major_order(datatype: str) -> None:
    wire = np.dtype(NUMERIC[datatype])
    values = np.arange(12).reshape(3, 4) % 2 if datatype == "BOOL" else np.arange(12).reshape(3, 4)
    expected = values.astype(wire).tobytes(order="C")
    as_wire = values.astype(wire)
    layouts = {
        "row-major": as_wire,
        "column-major": np.asfortranarray(as_wire),
        "strided": np.ascontiguousarray(np.repeat(as_wire, 2, axis=1))[:, ::2],
        "another dtype": values.astype(np.float64 if datatype != "FP64" else np.float32),
    }
    if wire.itemsize > 1:
        layouts["other byte order"] = as_wire.astype(wire.newbyteorder())
    for layout, array in layouts.items():
        assert _encoded(array, datatype) == expected, layout


def test_raw_output_of_an_empty_tensor_and_of_bytes() -> None:
    assert _encoded(np.zeros((0, 4), np.float32), "FP32") == b""
    strings = np.array([b"ab", b"", b"xyz"], dtype=np.object_)
    assert _encoded(strings, "BYTES") == bytes(encode_bytes(strings))


def _request(**fields: Any) -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name="m", **fields)
    # As received: parsed from bytes, as the server's handler does.
    return pb.ModelInferRequest.FromString(message.SerializeToString())


def _tensor(name: str, **fields: Any) -> pb.ModelInferRequest.InferInputTensor:
    tensor = pb.ModelInferRequest.InferInputTensor
    return tensor(name=name, datatype="INT32", shape=[1, 2], **fields)


def test_inputs_from_raw_contents_with_and_without_parameters() -> None:
    other = {"binary_data_size": pb.InferParameter(int64_param=8)}  # no region named
    message = _request(
        id="7",
        model_version="2",
        inputs=[_tensor("a"), _tensor("b", parameters=other)],
        raw_input_contents=[
            np.array([1, 2], np.int32).tobytes(),
            np.array([3, 4], np.int32).tobytes(),
        ],
        parameters={"p": pb.InferParameter(string_param="v")},
    )
    assert names_regions(message)
    decoded = decode_request(message, SharedMemoryRegistry())
    assert (decoded.model_name, decoded.model_version, decoded.id) == ("m", "2", "7")
    assert [(t.name, t.datatype, t.shape, t.data.tolist()) for t in decoded.inputs] == [
        ("a", "INT32", (1, 2), [[1, 2]]),
        ("b", "INT32", (1, 2), [[3, 4]]),
    ]
    assert decoded.parameters == {"p": "v"}
    assert decoded.outputs is None  # every output


def test_requested_outputs_with_and_without_parameters() -> None:
    message = _request(
        inputs=[_tensor("a")],
        raw_input_contents=[np.array([1, 2], np.int32).tobytes()],
        outputs=[
            pb.ModelInferRequest.InferRequestedOutputTensor(name="x"),
            pb.ModelInferRequest.InferRequestedOutputTensor(
                name="y", parameters={"classification": pb.InferParameter(int64_param=3)}
            ),
        ],
    )
    assert names_regions(message)
    decoded = decode_request(message, SharedMemoryRegistry())
    assert decoded.outputs is not None
    assert [(o.name, o.class_count, o.shm) for o in decoded.outputs] == [
        ("x", 0, None),
        ("y", 3, None),
    ]
    plain = _request(
        inputs=[_tensor("a")],
        raw_input_contents=[np.array([1, 2], np.int32).tobytes()],
        outputs=[pb.ModelInferRequest.InferRequestedOutputTensor(name="x")],
    )
    assert not names_regions(plain)


def test_refusals_on_the_raw_path_name_the_model_and_input() -> None:
    registry = SharedMemoryRegistry()
    both = _request(
        inputs=[_tensor("a", contents=pb.InferTensorContents(int_contents=[1, 2]))],
        raw_input_contents=[np.array([1, 2], np.int32).tobytes()],
    )
    with pytest.raises(
        InvalidInput,
        match="contents field must not be specified when using "
        "raw_input_contents for 'a' for model 'm'",
    ):
        decode_request(both, registry)
    short = _request(inputs=[_tensor("a"), _tensor("b")], raw_input_contents=[b"\0" * 8])
    with pytest.raises(
        InvalidInput, match="unable to find data for input tensor 'b' for model 'm' in request"
    ):
        decode_request(short, registry)
    wrong_size = _request(inputs=[_tensor("a")], raw_input_contents=[b"\0" * 4])
    with pytest.raises(
        InvalidInput,
        match=r"input byte size mismatch for input 'a' for model 'm'\. Expected 8, got 4",
    ):
        decode_request(wrong_size, registry)


def test_a_region_named_without_a_registry_is_refused_by_its_size() -> None:
    """A named region's input has no raw entry: one raw entry for two inputs is right."""
    region = {
        "shared_memory_region": pb.InferParameter(string_param="nowhere"),
        "shared_memory_byte_size": pb.InferParameter(int64_param=8),
    }
    message = _request(
        inputs=[_tensor("a", parameters=region), _tensor("b")],
        raw_input_contents=[np.array([3, 4], np.int32).tobytes()],
    )
    assert names_regions(message)
    with pytest.raises(InvalidInput, match="nowhere"):  # not registered
        decode_request(message, SharedMemoryRegistry())
