"""The one-step answer of small ModelInferRequests on operator versions (grpc/operator_call.py)
against the general path (GrpcWire through the data plane): on generated messages, the same
answer bytes or the same refusal, and the same statistics; what it declines (parameters, typed
contents, named outputs, tensor attributes) and what fails in it (a refusal, an output for a
kernel thread) are the general path's."""

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2 as pb

from service.core.memory_budget import Reservation
from service.grpc import operator_call
from service.grpc.servicer import Servicer
from service.kernels.context import RunOffLoop
from service.main import create_app
from service.settings import Settings

PROPERTY = settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
MODELS = {"Tile": ("13", "6", ""), "Shape": ("21", "15"), "ConstantOfShape": ("21", "9"),
          "Constant": ("21",)}  # fmt: skip
INPUT_NAMES = ("input", "repeats", "data", "value", "nope")
DATATYPES = {"FP32": 4, "FP64": 8, "INT64": 8, "INT32": 4, "UINT8": 1, "BOOL": 1, "FP16": 2,
             "BF16": 2, "BYTES": 0, "NOPE": 4}  # fmt: skip


@pytest.fixture(scope="module")
def servicer() -> Iterator[Servicer]:
    app = create_app(Settings(grpc_port=0, access_log=False))
    yield Servicer(app.state.plane, app.state.memory_budget, 30.0)


def _raw(datatype: str, shape: list[int], draw: Any) -> bytes:
    count = int(np.prod(shape)) if shape else 1
    if datatype == "BYTES":  # each element: a 4-byte little-endian length, then its bytes
        return b"".join(len(x).to_bytes(4, "little") + x
                        for x in draw(st.lists(st.binary(max_size=3), min_size=count,
                                               max_size=count)))  # fmt: skip
    if datatype == "INT64" and draw(st.booleans()):  # counts a Tile or a shape can take
        values = draw(st.lists(st.integers(-1, 3), min_size=count, max_size=count))
        return np.array(values, dtype=np.int64).tobytes()
    size = count * DATATYPES[datatype]
    return draw(st.binary(min_size=size, max_size=size))


@st.composite
def messages(draw: Any) -> pb.ModelInferRequest:
    """A small ModelInferRequest: mostly the common raw form, at times with what the one step
    declines or refuses (a wrong byte count, an unknown name or datatype, one given twice)."""
    name = draw(st.sampled_from(sorted(MODELS)))
    request = pb.ModelInferRequest(
        model_name=name, model_version=draw(st.sampled_from(MODELS[name]))
    )
    if draw(st.booleans()):
        request.id = draw(st.text(max_size=5))
    for _ in range(draw(st.integers(0, 3))):
        datatype = draw(st.sampled_from(sorted(DATATYPES)))
        shape = draw(st.lists(st.integers(0, 3), max_size=3))
        request.inputs.add(name=draw(st.sampled_from(INPUT_NAMES)), datatype=datatype,
                           shape=shape)  # fmt: skip
        raw = _raw(datatype, shape, draw)
        cut = draw(st.sampled_from((0, 0, 0, 1, -1)))
        request.raw_input_contents.append(raw[:-1] if cut == 1 and raw else raw + b"\0" * -cut)
    extra = draw(st.sampled_from(("", "", "", "parameter", "input parameter", "output",
                                  "typed", "raw more", "raw less")))  # fmt: skip
    if extra == "parameter":  # Shape-15's `start` is an attribute; a double sequence id is refused
        key, kind, value = draw(st.sampled_from((("priority", "int64_param", 1),
                                                 ("start", "int64_param", 1),
                                                 ("sequence_id", "double_param", 1.5),
                                                 ("custom", "string_param", "x"))))  # fmt: skip
        setattr(request.parameters[key], kind, value)
    elif extra == "input parameter" and request.inputs:  # no region of that name is registered
        key, kind, value = draw(st.sampled_from((("shared_memory_region", "string_param", "r"),
                                                 ("custom", "bool_param", True))))  # fmt: skip
        setattr(request.inputs[0].parameters[key], kind, value)
    elif extra == "output":
        request.outputs.add(name="output")
    elif extra == "typed" and request.inputs:  # alone, or beside raw contents (refused)
        if draw(st.booleans()):
            del request.raw_input_contents[:]
        request.inputs[0].contents.int64_contents.extend([2, 2])
    elif extra == "raw more":
        request.raw_input_contents.append(b"\0\0\0\0")
    elif extra == "raw less" and request.raw_input_contents:
        del request.raw_input_contents[-1]
    return request


def _answer(servicer: Servicer, request: pb.ModelInferRequest) -> dict[str, Any]:
    """The answer (or refusal) to `request` and what it added to the statistics."""
    stats = servicer.plane.stats
    before = {k: (s.success[0], s.fail[0], s.inference_count) for k, s in stats.models.items()}
    try:
        answer: Any = asyncio.run(servicer.infer(request, Reservation(servicer.budget)))[0]
    except Exception as exc:
        answer = (type(exc).__name__, str(exc), getattr(exc, "loc", None))
    after = {k: (s.success[0], s.fail[0], s.inference_count) for k, s in stats.models.items()}
    added = {k: tuple(a - b for a, b in zip(v, before.get(k, (0, 0, 0)), strict=True))
             for k, v in after.items()}  # fmt: skip
    return {"answer": answer, "stats": {k: v for k, v in added.items() if any(v)}}


def _general(servicer: Servicer, request: pb.ModelInferRequest,
             monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:  # fmt: skip
    with monkeypatch.context() as patched:
        patched.setattr(Servicer, "_one_step", lambda self, model, request: None)
        return _answer(servicer, request)


TILE = pb.ModelInferRequest(model_name="Tile", model_version="13", id="a-1")
TILE.inputs.add(name="input", datatype="FP32", shape=[2, 3])
TILE.inputs.add(name="repeats", datatype="INT64", shape=[2])
TILE.raw_input_contents.extend([np.arange(6, dtype=np.float32).tobytes(),
                                np.array([2, 2], dtype=np.int64).tobytes()])  # fmt: skip

SHAPE = pb.ModelInferRequest(model_name="Shape", model_version="15")
SHAPE.inputs.add(name="data", datatype="UINT8", shape=[2, 3])
SHAPE.raw_input_contents.append(bytes(6))


def _with(request: pb.ModelInferRequest, change: Any) -> pb.ModelInferRequest:
    copy = pb.ModelInferRequest()
    copy.CopyFrom(request)
    change(copy)
    return copy


@given(request=messages())
@example(request=TILE)
@example(request=_with(TILE, lambda r: r.inputs[1].shape.append(1)))  # a byte count short
@example(request=_with(TILE, lambda r: setattr(r.inputs[1], "name", "input")))  # given twice
@example(request=_with(TILE, lambda r: r.outputs.add(name="nope")))
@example(request=_with(TILE, lambda r: r.inputs[1].contents.int64_contents.extend([2, 2])))
@example(request=_with(SHAPE, lambda r: setattr(r.parameters["start"], "int64_param", 1)))
@example(request=_with(TILE, lambda r: setattr(r.inputs[0].parameters["shared_memory_region"],
                                                "string_param", "r")))  # fmt: skip
@PROPERTY
def test_one_step_answers_as_the_general_path(servicer: Servicer, request: pb.ModelInferRequest,
                                              monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    assert _answer(servicer, request) == _general(servicer, request, monkeypatch)


NUMERIC = ("FP32", "FP64", "INT64", "INT32", "UINT8", "BOOL", "FP16", "BF16", "BYTES")


@st.composite
def valid_messages(draw: Any) -> pb.ModelInferRequest:
    """A ModelInferRequest the one step answers: raw contents of every datatype and rank 0 to
    3 for Tile (with its repeats counts) and Shape, versions named or left to the latest ("").
    (ConstantOfShape's and Constant's tensor attributes are declined; RandomUniformLike's
    unseeded draws differ.)"""
    name = draw(st.sampled_from(("Tile", "Shape")))
    versions = {"Tile": ("13", "6", ""), "Shape": ("21", "15", "")}
    request = pb.ModelInferRequest(model_name=name,
                                   model_version=draw(st.sampled_from(versions[name])))  # fmt: skip
    if draw(st.booleans()):
        request.id = draw(st.text(max_size=5))
    datatype = draw(st.sampled_from(NUMERIC))
    shape = draw(st.lists(st.integers(0, 3), max_size=3))
    if datatype == "BOOL":  # a byte other than 0 or 1 is no bool
        raw = bytes(draw(st.lists(st.integers(0, 1), min_size=int(np.prod(shape)),
                                  max_size=int(np.prod(shape)))))  # fmt: skip
    else:
        raw = _raw(datatype, shape, draw)
    request.inputs.add(name="input" if name == "Tile" else "data", datatype=datatype, shape=shape)
    request.raw_input_contents.append(raw)
    if name == "Tile":
        counts = draw(st.lists(st.integers(0, 3), min_size=len(shape), max_size=len(shape)))
        request.inputs.add(name="repeats", datatype="INT64", shape=[len(shape)])
        request.raw_input_contents.append(np.array(counts, dtype=np.int64).tobytes())
    return request


@given(request=valid_messages())
@example(request=_with(TILE, lambda r: setattr(r, "model_version", "")))  # answers "13"
@example(request=SHAPE)
@PROPERTY
def test_valid_messages_take_one_step_with_the_general_paths_answer(
    servicer: Servicer, request: pb.ModelInferRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each message of the common form that the general path answers is answered by the one
    step itself, the same way (the property test above mostly draws what it declines)."""
    taken = []
    made = operator_call.RawOperatorCall.__call__

    def counted(self: Any, ctx: Any) -> bytes:
        taken.append(made(self, ctx))
        return taken[-1]

    with monkeypatch.context() as patched:
        patched.setattr(operator_call.RawOperatorCall, "__call__", counted)
        answer = _answer(servicer, request)
    # a datatype an older version does not take (BF16 at Tile-6) is refused by the general path
    refused = not isinstance(answer["answer"], bytes)
    assert taken == ([] if refused else [answer["answer"]]), answer
    assert answer == _general(servicer, request, monkeypatch)


def test_the_common_message_takes_one_step(servicer: Servicer,
                                           monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    taken = []
    made = operator_call.RawOperatorCall.__call__

    def counted(self: Any, ctx: Any) -> bytes:
        answer = made(self, ctx)
        taken.append(answer)
        return answer

    monkeypatch.setattr(operator_call.RawOperatorCall, "__call__", counted)
    answer = _answer(servicer, TILE)
    assert taken == [answer["answer"]]
    assert answer["stats"] == {("Tile", "13"): (1, 0, 1)}
    response = pb.ModelInferResponse.FromString(answer["answer"])
    assert (response.model_name, response.model_version, response.id) == ("Tile", "13", "a-1")
    tiled = np.frombuffer(response.raw_output_contents[0], dtype=np.float32).reshape(4, 6)
    assert (tiled == np.tile(np.arange(6, dtype=np.float32).reshape(2, 3), (2, 2))).all()


def test_an_output_for_a_kernel_thread_is_the_general_paths(
    servicer: Servicer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A small message whose output is too large to make inline: the one step gives it up
    (RunOffLoop), and the general path answers it on a kernel thread, counted once."""
    large = _with(TILE, lambda r: r.raw_input_contents.__setitem__(
        1, np.array([300, 300], dtype=np.int64).tobytes()))  # fmt: skip
    answer = _answer(servicer, large)
    assert answer == _general(servicer, large, monkeypatch)
    assert answer["stats"] == {("Tile", "13"): (1, 0, 1)}
    response = pb.ModelInferResponse.FromString(answer["answer"])
    assert list(response.outputs[0].shape) == [600, 900]


def test_many_strings_are_decoded_on_a_kernel_thread(
    servicer: Servicer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A small message of many short BYTES elements (a Python object each) is given up by the
    one step before they are decoded inline (RunOffLoop), as the general path's inline decode
    gives it up, and answered on a kernel thread."""
    count = 10_000  # 40 kB of length prefixes, 570 kB of objects
    many = pb.ModelInferRequest(model_name="Shape", model_version="15")
    many.inputs.add(name="data", datatype="BYTES", shape=[count])
    many.raw_input_contents.append(bytes(4 * count))
    model = servicer.plane.ready_model("Shape", "15")
    work = operator_call.RawOperatorCall(model, many, servicer.plane.limits)  # type: ignore[arg-type]
    with pytest.raises(RunOffLoop):
        work(servicer.plane.execution.inline)
    answer = _answer(servicer, many)
    assert answer == _general(servicer, many, monkeypatch)
    shape = pb.ModelInferResponse.FromString(answer["answer"]).raw_output_contents[0]
    assert np.frombuffer(shape, dtype=np.int64).tolist() == [count]


def test_a_one_step_that_fails_is_logged_once_and_answered_by_the_general_path(
    servicer: Servicer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A bug in the one step's work costs the general path's answer and one warning per
    exception type, with its traceback; a declined message logs nothing."""
    from service.core import fallback

    monkeypatch.setattr(fallback, "_logged", set())
    declined = _with(TILE, lambda r: r.outputs.add(name="output"))
    with caplog.at_level(logging.WARNING, logger="opserve"):
        assert _answer(servicer, declined) == _general(servicer, declined, monkeypatch)
        assert caplog.records == []

        def broken(self: Any, ctx: Any) -> bytes:
            raise ZeroDivisionError("a bug")

        expected = _general(servicer, TILE, monkeypatch)
        monkeypatch.setattr(operator_call.RawOperatorCall, "__call__", broken)
        answers = [_answer(servicer, TILE) for _ in range(2)]
    assert answers == [expected, expected]
    (record,) = caplog.records
    assert "ZeroDivisionError" in record.getMessage() and record.exc_info is not None
