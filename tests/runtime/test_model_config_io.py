"""Requests against a completed config: Triton's refusal texts, reshape to the graph and back,
batch dims; onnxruntime runs the arrays the checks hand over."""

from typing import Any

import numpy as np
import onnxruntime
import pytest
from onnx import ModelProto, TensorProto, helper

from service.errors import InvalidInput, ServiceError
from service.runtime.config.complete import complete_config
from service.runtime.config.request_io import RequestIO, request_io

from .config_models import (
    DENSENET_PBTXT,
    SIMPLE_PBTXT,
    SIMPLE_SEQUENCE_PBTXT,
    SIMPLE_STRING_PBTXT,
    densenet,
    loaded,
    pbtxt,
    simple,
    simple_sequence,
    simple_string,
)
from .models import model, value

NOTE = (
    "NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension to "
    "be prepended to each input shape. If you want to specify the full shape including the "
    "batch dim in your input dims config, try setting max_batch_size to zero. See the model "
    "configuration docs for more info on max_batch_size."
)


def _io(text: str | None, proto: ModelProto, name: str) -> RequestIO:
    graph = loaded(proto)
    config = pbtxt(text) if text is not None else None
    done = complete_config(config, name, graph.inputs, graph.outputs,
                           initialized=graph.initializers.keys())  # fmt: skip
    return request_io(done, graph.inputs, graph.outputs)


def _run(proto: ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """onnxruntime, the oracle: what the graph makes of the arrays the checks hand over."""
    session = onnxruntime.InferenceSession(proto.SerializeToString(),
                                           providers=["CPUExecutionProvider"])  # fmt: skip
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds), strict=True))


SIMPLE = _io(SIMPLE_PBTXT, simple(), "simple")
IN0 = np.arange(16, dtype=np.int32).reshape(1, 16)
IN1 = np.full((1, 16), -1, np.int32)


def test_simple_runs_as_the_example_client_expects() -> None:
    feeds = SIMPLE.graph_inputs({"INPUT0": IN0, "INPUT1": IN1})
    assert feeds["INPUT0"] is IN0  # nothing to reshape: handed over as sent
    produced = _run(simple(), feeds)
    answer = SIMPLE.client_outputs(produced)
    np.testing.assert_array_equal(answer["OUTPUT0"], IN0 + IN1)
    np.testing.assert_array_equal(answer["OUTPUT1"], IN0 - IN1)
    batch = SIMPLE.graph_inputs({"INPUT1": np.zeros((8, 16), np.int32),
                                 "INPUT0": np.ones((8, 16), np.int32)})  # fmt: skip
    assert _run(simple(), batch)["OUTPUT0"].shape == (8, 16)


def _i32(*shape: int) -> np.ndarray:
    return np.zeros(shape, np.int32)


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        ({"INPUT0": IN0.astype(np.float32), "INPUT1": IN1},
         "inference input 'INPUT0' data-type is 'FP32', but model 'simple' expects 'INT32'"),
        ({"INPUT0": IN0, "INPUT1": IN1.astype(np.int64)},
         "inference input 'INPUT1' data-type is 'INT64', but model 'simple' expects 'INT32'"),
        ({"INPUT0": _i32(2, 8), "INPUT1": _i32(2, 8)},
         f"unexpected shape for input 'INPUT0' for model 'simple'. Expected [-1,16], got [2,8]. "
         f"{NOTE}"),
        ({"INPUT0": _i32(4), "INPUT1": _i32(4)},
         f"unexpected shape for input 'INPUT0' for model 'simple'. Expected [-1,16], got [4]. "
         f"{NOTE}"),
        ({"INPUT0": _i32(16), "INPUT1": _i32(16)},  # the 16 reads as the batch
         "inference request batch-size must be <= 8 for 'simple'"),
        ({"INPUT0": _i32(9, 16), "INPUT1": _i32(9, 16)},
         "inference request batch-size must be <= 8 for 'simple'"),
        ({"INPUT0": _i32(1, 16), "INPUT1": _i32(2, 16)},
         "input 'INPUT1' batch size does not match other inputs for 'simple'"),
        ({"INPUT0": _i32(0, 16), "INPUT1": _i32(2, 16)}, None),  # Triton keeps the first non-0
        ({"INPUT0": np.int32(3), "INPUT1": IN1},
         "input 'INPUT0' has no shape but model requires batch dimension for 'simple'"),
        ({"INPUT0": IN0},
         "expected 2 inputs but got 1 inputs for model 'simple'. Got input(s) ['INPUT0'], but "
         "missing required input(s) ['INPUT1']. Please provide all required input(s)."),
        ({}, "expected 2 inputs but got 0 inputs for model 'simple'. Got input(s) [], but "
             "missing required input(s) ['INPUT0','INPUT1']. Please provide all required "
             "input(s)."),
        ({"INPUT0": IN0, "INPUT1": IN1, "EXTRA": IN1},
         "expected 2 inputs but got 3 inputs for model 'simple'. Got input(s) "
         "['INPUT0','INPUT1','EXTRA'], but missing required input(s) []. Please provide all "
         "required input(s)."),
        ({"INPUT0": IN0, "FOO": IN1}, "unexpected inference input 'FOO' for model 'simple'"),
        ({"INPUT0": IN0, "F" * 300: IN1},
         f"unexpected inference input '{'F' * 100}...' for model 'simple'"),
    ],
)  # fmt: skip
def test_simple_refusals(inputs: dict[str, Any], message: str | None) -> None:
    if message is None:
        assert set(SIMPLE.graph_inputs(inputs)) == set(inputs)
        return
    with pytest.raises(InvalidInput) as caught:
        SIMPLE.graph_inputs(inputs)
    assert str(caught.value) == message


def test_many_sent_names_are_cut() -> None:
    inputs = {f"X{i}": IN0 for i in range(50)}
    with pytest.raises(InvalidInput) as caught:
        SIMPLE.graph_inputs(inputs)
    listed = ",".join(f"'X{i}'" for i in range(20))
    assert f"Got input(s) [{listed},...], but" in str(caught.value)


def test_densenet_reshapes_both_ways() -> None:
    io = _io(DENSENET_PBTXT, densenet(), "densenet_onnx")
    image = np.random.default_rng(0).random((3, 4, 4), dtype=np.float32)
    feeds = io.graph_inputs({"data_0": image})
    assert feeds["data_0"].shape == (1, 3, 4, 4)
    produced = _run(densenet(), feeds)
    assert produced["fc6_1"].shape == (1, 10, 1, 1)
    answer = io.client_outputs(produced)["fc6_1"]
    assert answer.shape == (10,)
    weights = np.arange(30, dtype=np.float32).reshape(10, 3) / 10
    np.testing.assert_allclose(answer, weights @ image.mean(axis=(1, 2)), rtol=1e-6)
    with pytest.raises(InvalidInput) as caught:
        io.graph_inputs({"data_0": image[None]})
    assert str(caught.value) == (  # no batching: no NOTE, Triton's trailing space kept
        "unexpected shape for input 'data_0' for model 'densenet_onnx'. Expected [3,4,4], got "
        "[1,3,4,4]. "
    )


def _identity(shape: list[Any]) -> ModelProto:
    return model([helper.make_node("Identity", ["x"], ["y"])],
                 [value("x", TensorProto.FLOAT, shape)], [value("y", TensorProto.FLOAT, shape)])  # fmt: skip


@pytest.mark.parametrize(
    ("text", "graph_shape", "sent", "fed"),
    [
        # variable dims travel through the reshape, in order, batch dim kept
        ('max_batch_size: 4 input [ { name: "x" data_type: TYPE_FP32 dims: [ -1 ] reshape { '
         'shape: [ -1, 1 ] } } ] output [ { name: "y" data_type: TYPE_FP32 dims: [ -1 ] reshape '
         "{ shape: [ -1, 1 ] } } ]", [None, None, 1], (2, 5), (2, 5, 1)),
        ('input [ { name: "x" data_type: TYPE_FP32 dims: [ 2, 6, -1 ] reshape { shape: [ 12, -1 '
         '] } } ] output [ { name: "y" data_type: TYPE_FP32 dims: [ 2, 6, -1 ] reshape { shape: '
         "[ 12, -1 ] } } ]", [12, None], (2, 6, 3), (12, 3)),
        (None, [None], (3, 1), (3,)),  # auto-complete: dims [1], reshape [] under batching
        (None, [], (1,), ()),  # a scalar graph tensor: dims [1] without batching
    ],
)  # fmt: skip
def test_reshapes_with_onnxruntime(text: str | None, graph_shape: list[Any],
                                   sent: tuple[int, ...], fed: tuple[int, ...]) -> None:  # fmt: skip
    proto = _identity(graph_shape)
    io = _io(text, proto, "m")
    array = np.arange(int(np.prod(sent)), dtype=np.float32).reshape(sent)
    feeds = io.graph_inputs({"x": array})
    assert feeds["x"].shape == fed
    answer = io.client_outputs(_run(proto, feeds))["y"]
    np.testing.assert_array_equal(answer, array)  # back in the client's shape


def test_an_output_that_breaks_its_reshape_is_a_server_error() -> None:
    io = _io(DENSENET_PBTXT, densenet(), "densenet_onnx")
    with pytest.raises(ServiceError) as caught:
        io.client_outputs({"fc6_1": np.zeros((1, 9, 1, 1), np.float32)})
    assert type(caught.value) is ServiceError and caught.value.status_code == 500
    assert str(caught.value) == (
        "model 'densenet_onnx' made output 'fc6_1' of shape [1,9,1,1], which does not fit its "
        "configured reshape [1,10,1,1]"
    )


def test_outputs_named_or_not() -> None:
    assert SIMPLE.output_names(None) == ["OUTPUT0", "OUTPUT1"]
    assert SIMPLE.output_names(["OUTPUT1", "OUTPUT0", "OUTPUT1"]) == ["OUTPUT1", "OUTPUT0"]
    with pytest.raises(InvalidInput) as caught:
        SIMPLE.output_names(["OUTPUT2"])
    assert str(caught.value) == "unexpected inference output 'OUTPUT2' for model 'simple'"


def test_controls_are_no_client_inputs() -> None:
    io = _io(SIMPLE_SEQUENCE_PBTXT, simple_sequence(), "simple_sequence")
    one = np.ones((1, 1), np.int32)
    assert list(io.graph_inputs({"INPUT": one})) == ["INPUT"]
    with pytest.raises(InvalidInput) as caught:
        io.graph_inputs({"START": one})
    assert str(caught.value) == "unexpected inference input 'START' for model 'simple_sequence'"
    with pytest.raises(InvalidInput) as caught:
        io.graph_inputs({"INPUT": one, "START": one})
    assert str(caught.value).startswith("expected 1 inputs but got 2 inputs for model")
    feeds = {**io.graph_inputs({"INPUT": one * 5}), "START": one, "READY": one}
    assert _run(simple_sequence(), feeds)["OUTPUT"].tolist() == [[6]]  # READY * (INPUT + START)


def test_strings() -> None:
    io = _io(SIMPLE_STRING_PBTXT, simple_string(), "simple_string")
    texts = np.array([[str(i) for i in range(16)]], dtype=object)
    assert io.graph_inputs({"INPUT0": texts, "INPUT1": texts})["INPUT0"] is texts
    with pytest.raises(InvalidInput) as caught:
        io.graph_inputs({"INPUT0": texts, "INPUT1": IN0.astype(np.float32)})
    assert str(caught.value) == (
        "inference input 'INPUT1' data-type is 'FP32', but model 'simple_string' expects 'BYTES'"
    )


def test_an_optional_input_may_be_left_out() -> None:
    graph = model([helper.make_node("Add", ["x", "bias"], ["y"])],
                  [value("x", TensorProto.FLOAT, [2]), value("bias", TensorProto.FLOAT, [2])],
                  [value("y", TensorProto.FLOAT, [2])], {"bias": np.ones(2, np.float32)})  # fmt: skip
    text = ('input [ { name: "x" data_type: TYPE_FP32 dims: [ 2 ] }, { name: "bias" data_type: '
            'TYPE_FP32 dims: [ 2 ] optional: true } ] output [ { name: "y" data_type: TYPE_FP32 '
            "dims: [ 2 ] } ]")  # fmt: skip
    io = _io(text, graph, "m")
    x = np.array([1, 2], np.float32)
    assert _run(graph, io.graph_inputs({"x": x}))["y"].tolist() == [2, 3]
    with pytest.raises(InvalidInput) as caught:
        io.graph_inputs({"bias": x})
    assert str(caught.value) == (
        "expected number of inputs between 1 and 2 but got 1 inputs for model 'm'. Got input(s) "
        "['bias'], but missing required input(s) ['x']. Please provide all required input(s)."
    )


def test_metadata_from_the_config() -> None:
    assert SIMPLE.metadata() == {
        "inputs": [{"name": f"INPUT{i}", "datatype": "INT32", "shape": [-1, 16]} for i in (0, 1)],
        "outputs": [{"name": f"OUTPUT{i}", "datatype": "INT32", "shape": [-1, 16]}
                    for i in (0, 1)],
    }  # fmt: skip
    io = _io(DENSENET_PBTXT, densenet(), "densenet_onnx")
    assert io.metadata()["inputs"] == [{"name": "data_0", "datatype": "FP32", "shape": [3, 4, 4]}]


def test_request_io_without_the_graph() -> None:
    done = complete_config(pbtxt(SIMPLE_PBTXT), "simple", loaded(simple()).inputs,
                           loaded(simple()).outputs)  # fmt: skip
    io = request_io(done)
    assert io.inputs["INPUT0"].graph_shape is None and io.max_batch_size == 8
    assert io.graph_inputs({"INPUT0": IN0, "INPUT1": IN1})["INPUT1"] is IN1
