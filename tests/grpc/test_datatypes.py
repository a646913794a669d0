"""Every datatype the HTTP side serves, both ways over gRPC with the raw generated stubs: in as
raw_input_contents and (where the protocol has a field for it) as typed contents, always out
as raw_output_contents. Tile-13 echoes the sixteen types it takes; Constant-25, whose `value`
travels as an input, the extension types (raw only, as FP16 and BF16 in typed form)."""

import struct

import grpc
import numpy as np
import pytest
from onnx import numpy_helper
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc
from tritonclient.utils import deserialize_bytes_tensor

from api_schemas.v2 import EXTENSION_DATATYPES, V2_DATATYPES
from service.codecs.v2_types import from_datatype
from service.grpc.converters import TYPED_FIELDS

Stub = service_pb2_grpc.GRPCInferenceServiceStub
TILE_TYPES = [t for t in (*V2_DATATYPES, "COMPLEX64", "COMPLEX128")]
CONSTANT_TYPES = [t for t in EXTENSION_DATATYPES if not t.startswith("COMPLEX")]


def _array(datatype: str) -> np.ndarray:
    if datatype == "BYTES":
        return np.array([b"a", "bé".encode(), b"\xff\x00", b""], dtype=np.object_).reshape(2, 2)
    if datatype == "BOOL":
        return np.array([[True, False], [False, True]])
    dtype = from_datatype(datatype).np_dtype
    values = np.array([[0, 1], [-1, 2]] if datatype[0] in "IFC" else [[0, 1], [3, 2]])
    if datatype == "FP8_E8M0":  # powers of two only
        values = np.array([[1, 2], [4, 0.5]])
    return values.astype(np.float32).astype(dtype)


def _raw(array: np.ndarray, datatype: str) -> bytes:
    if datatype == "BYTES":  # each element: its length (4 bytes, little-endian), its bytes
        return b"".join(struct.pack("<I", len(x)) + x for x in array.reshape(-1))
    if datatype in ("INT4", "UINT4", "INT2", "UINT2", "FP4_E2M1"):  # ONNX's packing
        return numpy_helper.from_array(array).raw_data
    return np.ascontiguousarray(array).tobytes()


def _decode(raw: bytes, datatype: str, like: np.ndarray) -> np.ndarray:
    if datatype == "BYTES":
        return deserialize_bytes_tensor(raw).reshape(like.shape)
    if datatype in ("INT4", "UINT4", "INT2", "UINT2", "FP4_E2M1"):
        return _unpack(raw, like)
    return np.frombuffer(raw, dtype=like.dtype).reshape(like.shape)


def _unpack(raw: bytes, like: np.ndarray) -> np.ndarray:
    proto = numpy_helper.from_array(like)
    proto.raw_data = raw
    return numpy_helper.to_array(proto)


def _request(model: str, version: str, name: str, array: np.ndarray, datatype: str,
             typed: bool) -> pb.ModelInferRequest:  # fmt: skip
    request = pb.ModelInferRequest(model_name=model, model_version=version)
    tensor = request.inputs.add(name=name, datatype=datatype, shape=list(array.shape))
    if typed:
        values = array.reshape(-1).tolist()
        getattr(tensor.contents, TYPED_FIELDS[datatype]).extend(values)
    else:
        request.raw_input_contents.append(_raw(array, datatype))
    return request


@pytest.mark.parametrize("typed", [False, True], ids=["raw", "typed"])
@pytest.mark.parametrize("datatype", TILE_TYPES)
def test_tile_echoes_every_datatype(stub: Stub, datatype: str, typed: bool) -> None:
    if typed and datatype not in TYPED_FIELDS:
        pytest.skip(f"{datatype} has no typed contents field: see test_no_typed_field_*")
    array = _array(datatype)
    request = _request("Tile", "13", "input", array, datatype, typed)
    repeats = request.inputs.add(name="repeats", datatype="INT64", shape=[2])
    if typed:
        repeats.contents.int64_contents.extend([1, 2])
    else:
        request.raw_input_contents.append(np.array([1, 2], np.int64).tobytes())
    response = stub.ModelInfer(request)
    (output,) = response.outputs
    assert (output.name, output.datatype, list(output.shape)) == ("output", datatype, [2, 4])
    got = _decode(response.raw_output_contents[0], datatype, np.tile(array, (1, 2)))
    assert got.tolist() == np.tile(array, (1, 2)).tolist()


@pytest.mark.parametrize("datatype", CONSTANT_TYPES)
def test_constant_echoes_every_extension_datatype_raw(stub: Stub, datatype: str) -> None:
    array = _array(datatype)
    response = stub.ModelInfer(_request("Constant", "25", "value", array, datatype, False))
    (output,) = response.outputs
    assert (output.datatype, list(output.shape)) == (datatype, [2, 2])
    got = _decode(response.raw_output_contents[0], datatype, array)
    assert got.astype(np.float32).tolist() == array.astype(np.float32).tolist()


@pytest.mark.parametrize("datatype", ["FP16", "BF16", "FP8_E4M3FN", "INT4"])
def test_no_typed_field_for_16_bit_floats_and_extension_types(stub: Stub, datatype: str) -> None:
    request = pb.ModelInferRequest(model_name="Constant", model_version="25")
    tensor = request.inputs.add(name="value", datatype=datatype, shape=[2])
    tensor.contents.fp32_contents.extend([1.0, 2.0])
    with pytest.raises(grpc.RpcError) as refused:
        stub.ModelInfer(request)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details() == (f"Constant-25: inputs.value: datatype {datatype} has no "
                                       "typed contents field: send input 'value' as raw_input_contents")  # fmt: skip


@pytest.mark.parametrize(("datatype", "value", "refusal"), [
    ("INT8", 300, "300 is out of the range of int8 [-128, 127]"),
    ("UINT16", 70000, "70000 is out of the range of uint16 [0, 65535]"),
])  # fmt: skip
def test_narrow_typed_integers_are_checked_not_wrapped(stub: Stub, datatype: str, value: int,
                                                        refusal: str) -> None:  # fmt: skip
    request = _request("Tile", "13", "input", np.zeros(1), datatype, False)
    del request.raw_input_contents[:]
    request.inputs[0].contents.ClearField(TYPED_FIELDS[datatype])
    getattr(request.inputs[0].contents, TYPED_FIELDS[datatype]).append(value)
    request.inputs.add(name="repeats", datatype="INT64", shape=[1]).contents.int64_contents.append(
        1
    )
    with pytest.raises(grpc.RpcError) as refused:
        stub.ModelInfer(request)
    assert refused.value.details() == f"Tile-13: inputs.input: {refusal}"


def test_typed_contents_of_another_type_and_count(stub: Stub) -> None:
    request = pb.ModelInferRequest(model_name="simple")
    for name in ("INPUT0", "INPUT1"):
        request.inputs.add(name=name, datatype="INT32", shape=[1, 16]).contents.int_contents.extend(
            range(16)
        )
    request.inputs[1].contents.ClearField("int_contents")
    request.inputs[1].contents.fp32_contents.extend([1.0] * 16)
    with pytest.raises(grpc.RpcError) as refused:
        stub.ModelInfer(request)
    assert refused.value.details() == ("inputs.INPUT1: unexpected explicit tensor data for input "
                                       "tensor 'INPUT1' for model 'simple' of type 'FP32', "
                                       "expected datatype 'INT32'")  # fmt: skip
    request.inputs[1].contents.ClearField("fp32_contents")
    request.inputs[1].contents.int_contents.extend(range(15))
    with pytest.raises(grpc.RpcError) as refused:
        stub.ModelInfer(request)
    assert "has 15 elements in its contents, but shape [1, 16] holds 16" in refused.value.details()


def test_explicit_byte_contents_as_triton_examples_send_them(stub: Stub) -> None:
    """grpc_explicit_byte_content_client.py: typed BYTES in, raw BYTES out, in asked order."""
    request = pb.ModelInferRequest(model_name="simple_string")
    for name, values in (("INPUT0", [str(i).encode() for i in range(16)]), ("INPUT1", [b"1"] * 16)):
        request.inputs.add(
            name=name, datatype="BYTES", shape=[1, 16]
        ).contents.bytes_contents.extend(values)
    for name in ("OUTPUT0", "OUTPUT1"):
        request.outputs.add(name=name)
    response = stub.ModelInfer(request)
    sums, differences = (deserialize_bytes_tensor(raw) for raw in response.raw_output_contents)
    assert [int(x) for x in sums] == [i + 1 for i in range(16)]
    assert [int(x) for x in differences] == [i - 1 for i in range(16)]


def test_typed_and_raw_contents_are_not_mixed(stub: Stub) -> None:
    """grpc_explicit_int_content_client.py's second call (Triton's rule and text)."""
    mixed = pb.ModelInferRequest(model_name="simple")
    for name in ("INPUT0", "INPUT1"):
        mixed.inputs.add(name=name, datatype="INT32", shape=[1, 16]).contents.int_contents.extend(
            range(16)
        )
    mixed.raw_input_contents.append(bytes(64))
    with pytest.raises(grpc.RpcError) as refused:
        stub.ModelInfer(mixed)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert ("contents field must not be specified when using raw_input_contents for 'INPUT0' for "
            "model 'simple'") in refused.value.details()  # fmt: skip
