"""tritonclient.http, unchanged, against a real server: health, metadata and inference on
operator versions, with binary data on and off both ways and compressed bodies both ways.
Results are checked against onnxruntime running the same one-node model, and by hand."""

from typing import Any

import ml_dtypes
import numpy as np
import pytest
import tritonclient.http as triton
from onnx import helper, numpy_helper
from tritonclient.utils import InferenceServerException

from service.core.dataplane import EXTENSIONS
from tests.conformance.runtimes import one_node_model, run_onnxruntime

X = np.arange(1, 7, dtype=np.float32).reshape(2, 3)
REPEATS = np.array([2, 2], dtype=np.int64)
TILED = np.tile(X, (2, 2))


def _input(name: str, array: np.ndarray, binary: bool) -> triton.InferInput:
    datatype = (
        "BF16" if array.dtype == ml_dtypes.bfloat16 else triton.np_to_triton_dtype(array.dtype)
    )
    tensor = triton.InferInput(name, list(array.shape), datatype)
    return tensor.set_data_from_numpy(array, binary_data=binary)


def _tile(client: triton.InferenceServerClient, binary_in: bool, binary_out: bool | None,
          **options: Any) -> np.ndarray:  # fmt: skip
    inputs = [_input("input", X, binary_in), _input("repeats", REPEATS, binary_in)]
    outputs = (
        None
        if binary_out is None
        else [triton.InferRequestedOutput("output", binary_data=binary_out)]
    )
    result = client.infer("Tile", inputs, model_version="13", outputs=outputs, **options)
    assert result.get_response()["model_version"] == "13"
    output = result.as_numpy("output")
    assert output is not None
    return output


def test_server_health_and_metadata(client: triton.InferenceServerClient) -> None:
    assert client.is_server_live() and client.is_server_ready()
    metadata = client.get_server_metadata()
    assert metadata["name"] == "opserve"
    assert metadata["extensions"] == list(EXTENSIONS)
    assert {"binary_tensor_data", "statistics", "classification"} <= set(EXTENSIONS)


def test_model_ready_and_metadata(client: triton.InferenceServerClient) -> None:
    assert client.is_model_ready("Tile") and client.is_model_ready("Tile", "13")
    assert not client.is_model_ready("Tile", "7")  # not a since_version
    assert not client.is_model_ready("NoSuchOp")
    metadata = client.get_model_metadata("Tile", "13")
    assert metadata["versions"] == ["1", "6", "13"]
    assert [(t["name"], t["datatype"], t["shape"]) for t in metadata["inputs"]] == [
        ("input", "FP32", [-1]), ("repeats", "INT64", [-1])]  # fmt: skip
    assert "BF16" in metadata["inputs"][0]["datatypes"]
    assert metadata["outputs"][0]["name"] == "output"
    shape = client.get_model_metadata("Shape", "15")
    assert {a["name"]: a["travels_as"] for a in shape["attributes"]} == {
        "start": "parameter", "end": "parameter"}  # fmt: skip
    with pytest.raises(InferenceServerException,
                       match=r"^\[404\] Request for unknown model: 'Tile' version 7 is not found"):  # fmt: skip
        client.get_model_metadata("Tile", "7")


@pytest.mark.parametrize("binary_in", [False, True], ids=["json-in", "binary-in"])
@pytest.mark.parametrize(
    "binary_out", [False, True, None], ids=["json-out", "binary-out", "default-out"]
)
def test_tile_13(
    client: triton.InferenceServerClient, binary_in: bool, binary_out: bool | None
) -> None:
    got = _tile(client, binary_in, binary_out)
    np.testing.assert_array_equal(got, TILED)  # by hand: np.tile of the 2x3 twice each way
    model = one_node_model(helper.make_node("Tile", ["input", "repeats"], ["output"]), 13,
                           {"input": X, "repeats": REPEATS}, {"output": TILED})  # fmt: skip
    np.testing.assert_array_equal(got, run_onnxruntime(model, {"input": X, "repeats": REPEATS})[0])


@pytest.mark.parametrize("request_compression", ["gzip", "deflate", None])
@pytest.mark.parametrize("response_compression", ["gzip", "deflate", None])
def test_compression(client: triton.InferenceServerClient, request_compression: str | None,
                     response_compression: str | None) -> None:  # fmt: skip
    for binary in (False, True):
        got = _tile(client, binary, binary, request_compression_algorithm=request_compression,
                    response_compression_algorithm=response_compression)  # fmt: skip
        np.testing.assert_array_equal(got, TILED)


@pytest.mark.parametrize("binary", [False, True])
def test_constant_of_shape_value_as_an_input(
    client: triton.InferenceServerClient, binary: bool
) -> None:
    shape = np.array([2, 3], dtype=np.int64)
    value = np.array([7], dtype=np.int32)
    result = client.infer("ConstantOfShape", [_input("input", shape, binary), _input("value", value, binary)],
                          outputs=[triton.InferRequestedOutput("output", binary_data=binary)])  # fmt: skip
    got = result.as_numpy("output")
    np.testing.assert_array_equal(got, np.full((2, 3), 7, dtype=np.int32))
    node = helper.make_node("ConstantOfShape", ["input"], ["output"],
                            value=numpy_helper.from_array(value))  # fmt: skip
    model = one_node_model(node, 25, {"input": shape}, {"output": got})
    np.testing.assert_array_equal(got, run_onnxruntime(model, {"input": shape})[0])


@pytest.mark.parametrize(
    ("start", "end", "want"), [(1, None, [3, 4]), (-1, None, [4]), (0, 2, [2, 3])]
)
def test_shape_with_parameters(client: triton.InferenceServerClient, start: int, end: int | None,
                               want: list[int]) -> None:  # fmt: skip
    data = np.zeros((2, 3, 4), dtype=np.float32)
    parameters = {"start": start} if end is None else {"start": start, "end": end}
    result = client.infer("Shape", [_input("data", data, True)], model_version="15",
                          parameters=parameters)  # fmt: skip
    got = result.as_numpy("shape")
    np.testing.assert_array_equal(got, np.array(want, dtype=np.int64))
    node = helper.make_node("Shape", ["data"], ["shape"], **parameters)
    model = one_node_model(node, 15, {"data": data}, {"shape": got})
    np.testing.assert_array_equal(got, run_onnxruntime(model, {"data": data})[0])


def test_constant_with_a_list_parameter(client: triton.InferenceServerClient) -> None:
    result = client.infer("Constant", [], parameters={"value_floats": "[1.5, -2, 3]"})
    np.testing.assert_array_equal(result.as_numpy("output"), np.array([1.5, -2, 3], np.float32))


@pytest.mark.parametrize("binary", [False, True])
def test_strings_and_bfloat16(client: triton.InferenceServerClient, binary: bool) -> None:
    words = np.array([["a", "bé"], ["", "\x00z"]], dtype=object)
    result = client.infer("Tile", [_input("input", words, binary), _input("repeats", np.array([1, 2]), binary)],
                          outputs=[triton.InferRequestedOutput("output", binary_data=binary)])  # fmt: skip
    got = result.as_numpy("output")
    want = np.tile(words, (1, 2))
    assert [x.decode() if isinstance(x, bytes) else x for x in got.reshape(-1)] == list(
        want.reshape(-1)
    )
    halves = np.array([1.5, -2.25, 3], dtype=ml_dtypes.bfloat16)
    result = client.infer("Tile", [_input("input", halves, True), _input("repeats", np.array([2]), binary)],
                          outputs=[triton.InferRequestedOutput("output", binary_data=True)])  # fmt: skip
    np.testing.assert_array_equal(result.as_numpy("output"), np.tile(halves, 2))


def test_refusals_carry_the_v1_words(client: triton.InferenceServerClient) -> None:
    bad = np.array([-1, 2], dtype=np.int64)
    with pytest.raises(InferenceServerException) as caught:
        client.infer("Tile", [_input("input", X, True), _input("repeats", bad, True)])
    assert caught.value.status() == "400"
    assert (
        caught.value.message()
        == "Tile-13: inputs.repeats: repeats must not be negative, got [-1, 2]"
    )
    with pytest.raises(InferenceServerException,
                       match=r"^\[404\] Request for unknown model: 'NoSuch' is not found"):  # fmt: skip
        client.infer("NoSuch", [_input("input", X, True)])


@pytest.mark.parametrize("binary", [True, False])
def test_classification(client: triton.InferenceServerClient, binary: bool) -> None:
    """The top 3 of the tiled [4, 6] output (an operator does not batch: over all of it), each
    "value:index" with six decimals as Triton prints floats; ties go to the lower index."""
    result = client.infer("Tile", [_input("input", X, True), _input("repeats", REPEATS, True)],
                          outputs=[triton.InferRequestedOutput("output", binary_data=binary,
                                                               class_count=3)])  # fmt: skip
    flat = TILED.reshape(-1)
    top = sorted(range(flat.size), key=lambda i: (-flat[i], i))[:3]
    expected = [f"{flat[i]:.6f}:{i}".encode() for i in top]
    assert [x if isinstance(x, bytes) else x.encode() for x in result.as_numpy("output")] == (
        expected)  # fmt: skip
    assert expected == [b"6.000000:8", b"6.000000:11", b"6.000000:20"]


def test_request_id_is_echoed(client: triton.InferenceServerClient) -> None:
    inputs = [_input("input", X, False), _input("repeats", REPEATS, False)]
    result = client.infer("Tile", inputs, request_id="req-7")
    assert result.get_response()["id"] == "req-7"


def test_bytes_elements_are_any_bytes_on_the_binary_path(
    client: triton.InferenceServerClient,
) -> None:
    """BYTES elements are arbitrary bytes in the protocol (raw image bytes, say): they come
    back as they went; JSON can carry only text, and says so."""
    raw = np.array([b"\xff\xd8\xff\xe0 not text", "text"], dtype=np.object_)
    inputs = [_input("input", raw, True), _input("repeats", np.array([2]), True)]
    binary = [triton.InferRequestedOutput("output", binary_data=True)]
    result = client.infer("Tile", inputs, outputs=binary)
    assert result.as_numpy("output").tolist() == [b"\xff\xd8\xff\xe0 not text", b"text"] * 2
    as_json = [triton.InferRequestedOutput("output", binary_data=False)]
    with pytest.raises(InferenceServerException, match="which JSON cannot carry") as caught:
        client.infer("Tile", inputs, outputs=as_json)
    assert caught.value.status() == "400"
