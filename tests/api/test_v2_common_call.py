"""The short reading of common V2 JSON bodies (v2_codec.common_call) against InferenceRequest:
on generated bodies, parse_request gives the same call, or the same refusal, whether the short
path may be taken or not."""

import json

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import service.api.v2_codec as v2_codec
from service.api.v2_codec import common_call, parse_request
from service.errors import ServiceError

PROPERTY = settings(max_examples=500, deadline=None, suppress_health_check=list(HealthCheck))
SCALAR = (st.integers(-(2**65), 2**65) | st.floats() | st.booleans() | st.none()
          | st.text(max_size=3))  # fmt: skip
VALUE = SCALAR | st.lists(SCALAR, max_size=3) | st.dictionaries(st.text(max_size=3), SCALAR,
                                                                max_size=2)  # fmt: skip
NAME = st.sampled_from(["input", "repeats", "x"]) | SCALAR


@st.composite
def inputs(draw: st.DrawFn) -> object:
    item: dict[str, object] = {
        "name": draw(NAME),
        "shape": draw(st.lists(st.integers(-1, 3), max_size=3) | VALUE),
        "datatype": draw(st.sampled_from(["FP32", "INT64", "BYTES", "BOOL"]) | SCALAR),
        "data": draw(st.lists(st.integers(-3, 3) | st.floats(), max_size=6) | VALUE),
    }
    for key in ("shape", "datatype", "data", "name"):
        if draw(st.integers(0, 11)) == 0:
            del item[key]
    if draw(st.integers(0, 7)) == 0:
        item[draw(st.sampled_from(["parameters", "extra"]))] = draw(VALUE)
    return item if draw(st.integers(0, 19)) else draw(VALUE)


@st.composite
def bodies(draw: st.DrawFn) -> bytes:
    request: dict[str, object] = {"inputs": draw(st.lists(inputs(), max_size=3))}
    if draw(st.booleans()):
        request["id"] = draw(st.text(max_size=3) | SCALAR)
    if draw(st.booleans()):
        outputs = st.fixed_dictionaries({"name": NAME}) | st.fixed_dictionaries(
            {"name": NAME, "parameters": VALUE}
        )  # fmt: skip
        request["outputs"] = draw(st.lists(outputs, max_size=2) | VALUE)
    for key in ("model_name", "parameters", "inputs", "something"):
        if draw(st.integers(0, 7)) == 0:
            request[key] = draw(VALUE)
    return json.dumps(request).encode()


def _parsed(body: bytes) -> str:
    try:
        return repr(parse_request(body, None))
    except ServiceError as refused:
        return repr((type(refused), str(refused), refused.loc))


SMALL = (b'{"inputs":[{"name":"input","shape":[2,3],"datatype":"FP32","data":[1,2,3,4,5,6]},'
         b'{"name":"repeats","shape":[2],"datatype":"INT64","data":[2,2]}]}')  # fmt: skip


def _with(fields: bytes) -> bytes:
    """SMALL with more top-level fields."""
    return SMALL[:-1] + b"," + fields + b"}"


@PROPERTY
@given(body=bodies())
@example(body=SMALL)
@example(body=_with(b'"id":"7","outputs":[{"name":"output"}],"model_name":"T"'))
@example(body=SMALL.replace(b"[2,3]", b"[2,-3]"))
@example(body=SMALL.replace(b'"data":[2,2]', b'"data":null'))
@example(body=SMALL.replace(b'"data":[2,2]', b'"data":[2,-9223372036854775809]'))
@example(body=SMALL.replace(b'"data":[2,2]', b'"data":[2,18446744073709551616]'))
@example(body=SMALL.replace(b"[1,2,3,4,5,6]", b"[1,2,3,4,5,1.0000000000000000001]"))
@example(body=SMALL.replace(b"[1,2,3,4,5,6]", b"[1,2,3,4,5,1e400]"))
@example(body=SMALL.replace(b"[1,2,3,4,5,6]", b"[1,2,3,4,5,NaN]"))  # data as the model takes it
@example(body=SMALL.replace(b"[1,2,3,4,5,6]", b"[1,2,3,4,5,-Infinity]"))
@example(body=_with(b'"id":null,"outputs":[{"name":"output","parameters":{}}]'))
def test_common_bodies_parse_as_the_model_does(
    body: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    short = _parsed(body)
    with monkeypatch.context() as patch:
        patch.setattr(v2_codec, "common_call", lambda body: None)
        assert short == _parsed(body)


def test_the_common_body_takes_the_short_path() -> None:
    assert common_call(SMALL) is not None
    assert common_call(SMALL.replace(b"[1,2,3,4,5,6]", b"[1,2,3,4,5,NaN]")) is not None
    assert common_call(_with(b'"model_name":"Tile","id":"1","outputs":[{"name":"output"}]'))


@pytest.mark.parametrize("body", [
    _with(b'"parameters":{"binary_data_output":true}'),
    SMALL.replace(b'"datatype":"INT64",', b'"datatype":"INT64","parameters":{},'),
    _with(b'"outputs":[{"name":"output","parameters":{"binary_data":true}}]'),
    _with(b'"id":7'),
    _with(b'"parameters":null'),  # any parameters at all: the model's
    _with(b'"inputs":{}'),  # the last of a key given twice counts, as for the model
    _with(b'"outputs":[{"name":"output","extra":1}]'),
    SMALL.replace(b'"datatype":"INT64",', b'"datatype":"INT64","extra":1,'),
    SMALL.replace(b"[2,3]", b"[2,3.0]"),
    SMALL[:-1],
])  # fmt: skip
def test_what_is_not_common_goes_to_the_model(body: bytes) -> None:
    assert common_call(body) is None


FLAG = st.booleans() | SCALAR


@st.composite
def binary_bodies(draw: st.DrawFn) -> tuple[bytes, int]:
    """A body in tritonclient.http's binary form (a JSON header, then the inputs' bytes) and
    its header's length: mostly as tritonclient makes it, at times with what the short reading
    leaves to the model (sizes that do not add up, other parameters, data beside the bytes)."""
    items, sizes = [], []
    for _ in range(draw(st.integers(0, 3))):
        size = draw(st.integers(0, 12))
        item: dict[str, object] = {
            "name": draw(NAME), "shape": draw(st.lists(st.integers(-1, 3), max_size=3) | VALUE),
            "datatype": draw(st.sampled_from(["FP32", "INT64", "BYTES"]) | SCALAR),
            "parameters": {"binary_data_size": draw(st.just(size) | SCALAR)},
        }  # fmt: skip
        if draw(st.integers(0, 9)) == 0:
            item["parameters"] = draw(VALUE | st.fixed_dictionaries(
                {"binary_data_size": st.just(size), "other": SCALAR}))  # fmt: skip
        if draw(st.integers(0, 9)) == 0:
            item[draw(st.sampled_from(["data", "extra"]))] = draw(VALUE)
        if draw(st.integers(0, 11)) == 0:
            del item[draw(st.sampled_from(sorted(item)))]
        items.append(item if draw(st.integers(0, 19)) else draw(VALUE))
        sizes.append(size)
    request: dict[str, object] = {"inputs": items}
    if draw(st.booleans()):
        request["parameters"] = draw(st.fixed_dictionaries({"binary_data_output": FLAG}) | VALUE)
    if draw(st.booleans()):
        request["id"] = draw(st.text(max_size=3) | SCALAR)
    if draw(st.booleans()):
        outputs = (st.fixed_dictionaries({"name": NAME})
                   | st.fixed_dictionaries({"name": NAME, "parameters": st.fixed_dictionaries(
                       {"binary_data": FLAG})}) | st.fixed_dictionaries({"name": NAME,
                                                                         "parameters": VALUE}))  # fmt: skip
        request["outputs"] = draw(st.lists(outputs, max_size=2) | VALUE)
    if draw(st.integers(0, 7)) == 0:
        request[draw(st.sampled_from(["model_name", "something"]))] = draw(VALUE)
    header = json.dumps(request).encode()
    extra = draw(st.sampled_from([0, 0, 0, 1, -1]))
    binary = draw(
        st.binary(min_size=max(sum(sizes) + extra, 0), max_size=max(sum(sizes) + extra, 0))
    )
    return header + binary, len(header)


def _parsed_binary(body: bytes, header_length: int) -> str:
    try:
        call = parse_request(body, header_length)
    except ServiceError as refused:
        return repr((type(refused), str(refused), refused.loc))
    inputs = [(i.name, i.datatype, i.shape, i.parameters, i.data,
               None if i.raw is None else bytes(i.raw)) for i in call.inputs]  # fmt: skip
    return repr((inputs, call.outputs, call.parameters, call.id, call.answer_form))


TRITONCLIENT = (b'{"inputs":[{"name":"input","shape":[2,3],"datatype":"FP32","parameters":'
                b'{"binary_data_size":24}},{"name":"repeats","shape":[2],"datatype":"INT64",'
                b'"parameters":{"binary_data_size":16}}],"parameters":{"binary_data_output":true}}')  # fmt: skip
TRITONCLIENT_DATA = bytes(range(40))
NAMED = TRITONCLIENT.replace(b'}}],"p', b'}}],"outputs":[{"name":"output","parameters":'
                             b'{"binary_data":false}}],"p')  # fmt: skip


@PROPERTY
@given(case=binary_bodies())
@example(case=(TRITONCLIENT + TRITONCLIENT_DATA, len(TRITONCLIENT)))
@example(case=(TRITONCLIENT + TRITONCLIENT_DATA[:-1], len(TRITONCLIENT)))  # a byte short
@example(case=(TRITONCLIENT + TRITONCLIENT_DATA + b"x", len(TRITONCLIENT)))  # one left over
@example(case=(TRITONCLIENT.replace(b"true", b"1") + TRITONCLIENT_DATA, len(TRITONCLIENT) - 3))
@example(case=(NAMED + TRITONCLIENT_DATA, len(NAMED)))
def test_common_binary_bodies_parse_as_the_model_does(
    case: tuple[bytes, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    body, header_length = case
    short = _parsed_binary(body, header_length)
    with monkeypatch.context() as patch:
        patch.setattr(v2_codec, "common_binary_call", lambda header, binary: None)
        assert short == _parsed_binary(body, header_length)


def test_tritonclients_binary_body_takes_the_short_path() -> None:
    header, binary = TRITONCLIENT, memoryview(TRITONCLIENT_DATA)
    call = v2_codec.common_binary_call(header, binary)
    assert call is not None and call.answer_form == "v2_binary"
    assert [bytes(i.raw or b"") for i in call.inputs] == [TRITONCLIENT_DATA[:24],
                                                          TRITONCLIENT_DATA[24:]]  # fmt: skip
    assert v2_codec.common_binary_call(header, binary[:-1]) is None  # sizes that do not add up
