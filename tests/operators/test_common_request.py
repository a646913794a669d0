"""The short reading of common v1 bodies (operators/common_request.py) against the request
models: on generated bodies for every served version, `invoke` gives byte-identical answers or
the same refusal (kind, words, location) whether the short path may be taken or not."""

import json

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

import service.operators.invoke as invoke_module
from api_schemas.tensors import DTYPE_NAMES
from service.api.responses import dumps
from service.codecs.limits import Limits
from service.errors import ServiceError
from service.kernels import random_uniform_like
from service.kernels.context import KernelContext
from service.operators import registry
from service.operators.common_request import COMMON_BODY_BYTES, common_request
from service.operators.invoke import invoke

VERSIONS = [op for _, _, versions in registry.operators() for op in versions]
LIMITS = Limits(max_elements=4096, max_string_bytes=1 << 12, max_rank=4)
CTX = KernelContext(1 << 20, 1 << 20, max_answer_bytes=1 << 22)
PROPERTY = settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))

NUMBER = st.integers(-(2**65), 2**65) | st.floats() | st.booleans()
VALUE = NUMBER | st.none() | st.sampled_from(["NaN", "Infinity", "a", ""]) | st.lists(
    st.integers(-2, 2), max_size=2
)  # fmt: skip
DTYPE = st.sampled_from([*DTYPE_NAMES, "FLOAT", "float32", 1, 7, True, None, 1.0])


@st.composite
def tensor(draw: st.DrawFn) -> object:
    shape = draw(st.lists(st.integers(0, 3), max_size=3) | st.sampled_from([None, [-1], [1.0]]))
    count = 1
    for dim in shape or []:
        count *= dim if isinstance(dim, int) and dim >= 0 else 1
    element = draw(st.sampled_from([st.integers(-3, 3), st.integers(-(2**65), 2**65),
                                    st.floats(), st.booleans(), VALUE]))  # fmt: skip
    size = count + draw(st.sampled_from([0, 0, 0, 1]))
    body: dict[str, object] = {"dtype": draw(DTYPE), "data": draw(st.lists(element, min_size=size,
                                                                          max_size=size))}  # fmt: skip
    if shape is not None or draw(st.booleans()):
        body["shape"] = shape
    if draw(st.integers(0, 9)) == 0:  # now and then a tensor the model refuses or reads else
        body[draw(st.sampled_from(["extra", "tensor_proto", "dtype"]))] = draw(VALUE)
    if draw(st.integers(0, 19)) == 0:
        return draw(VALUE)
    return body


@st.composite
def bodies(draw: st.DrawFn) -> tuple[registry.OpVersion, bytes]:
    op = draw(st.sampled_from(VERSIONS))
    names = draw(st.lists(st.sampled_from([*op.inputs, "bogus"]), unique=True, max_size=4))
    request: dict[str, object] = {"inputs": {name: draw(tensor()) for name in names}}
    if draw(st.integers(0, 4)) == 0:
        request["output_format"] = draw(st.sampled_from(["json", "tensor_proto", "JSON", 1]))
    if draw(st.integers(0, 4)) == 0:
        request["attributes"] = draw(st.sampled_from([{}, [], None, {"bogus": 1}, {"dtype": 1}]))
    if draw(st.integers(0, 9)) == 0:
        request[draw(st.sampled_from(["extra", "inputs"]))] = draw(VALUE)
    return op, json.dumps(request).encode()  # big ints and bare NaN too


def _answer(op: registry.OpVersion, body: bytes) -> tuple[str, object]:
    try:
        return "answer", dumps(invoke(op, body, LIMITS, CTX))
    except ServiceError as refused:
        return "refused", (type(refused), str(refused), refused.loc, refused.operator)
    except ValidationError as refused:
        return "invalid", refused.errors(include_url=False, include_context=False)


def _general(op: registry.OpVersion, body: bytes, monkeypatch: pytest.MonkeyPatch) -> object:
    with monkeypatch.context() as patch:
        patch.setattr(invoke_module, "common_request", lambda op, body: None)
        return _answer(op, body)


TILE = registry.resolve("Tile", 13)
FILL_9 = registry.resolve("ConstantOfShape", 9)  # its uint8 data's -2**63-1 stays an int
SMALL_TILE = b'{"inputs":{"input":{"dtype":"float","shape":[2,3],"data":[1,2,3,4,5,6]},' \
             b'"repeats":{"dtype":"int64","shape":[2],"data":[2,2]}}}'  # fmt: skip


@PROPERTY
@given(case=bodies())
@example(case=(TILE, SMALL_TILE))
@example(case=(TILE, SMALL_TILE.replace(b"[2,2]", b"[2,2,2]")))
@example(case=(TILE, SMALL_TILE.replace(b'"int64"', b'"int32"')))
@example(case=(TILE, SMALL_TILE.replace(b"}}}", b'}},"attributes":{}}')))
@example(case=(TILE, SMALL_TILE.replace(b"[1,2,3,4,5,6]", b"[1,2,3,4,5,-9223372036854775809]")))
@example(case=(TILE, SMALL_TILE.replace(b"[1,2,3,4,5,6]", b"[1,2,3,4,5,1e400]")))
@example(case=(TILE, SMALL_TILE.replace(b"[1,2,3,4,5,6]", b"[1,2,3,4,5,NaN]")))
@example(case=(TILE, SMALL_TILE.replace(b"}}}", b'}},"output_format":"JSON"}')))
@example(
    case=(FILL_9, b'{"inputs": {"input": {"dtype": "uint8", "data": [-9223372036854775809]}}}')
)
def test_common_bodies_answer_as_the_models_do(
    case: tuple, monkeypatch: pytest.MonkeyPatch
) -> None:
    op, body = case
    with monkeypatch.context() as patch:  # RandomUniformLike without a seed: the same draws
        seeded = random_uniform_like._generator
        patch.setattr(random_uniform_like, "_generator",
                      lambda seed: seeded(0.0 if seed is None else seed))  # fmt: skip
        assert repr(_answer(op, body)) == repr(_general(op, body, monkeypatch))  # NaN == NaN


def test_the_common_small_request_takes_the_short_path() -> None:
    """So the property above compares the two paths (not the general one with itself)."""
    assert common_request(TILE, SMALL_TILE) is not None
    shape = registry.resolve("Shape", 21)
    assert common_request(shape, b'{"inputs":{"data":{"dtype":"int8","data":[1]}},'
                                 b'"output_format":"tensor_proto"}') is not None  # fmt: skip


@pytest.mark.parametrize("body", [
    SMALL_TILE.replace(b"}}}", b'}},"attributes":{"x":1}}'),  # attributes given
    SMALL_TILE.replace(b'"dtype":"float",', b'"dtype":"float","extra":1,'),  # unknown key
    SMALL_TILE.replace(b'"dtype":"float"', b'"dtype":true'),  # StrictStr | StrictInt refuses
    SMALL_TILE.replace(b"[2,3]", b"[2,-3]"),  # the model's ge=0
    SMALL_TILE.replace(b"[2,3]", b"[2,3.0]"),  # StrictInt: no floats
    SMALL_TILE.replace(b"[2,3]", b"[2,true]"),  # nor booleans
    SMALL_TILE.replace(b"}}}", b'}},"output_format":"JSON"}'),  # not a format's name
    SMALL_TILE.replace(b"}}}", b'}},"output_format":1}'),
    SMALL_TILE.replace(b"}}}", b'}},"attributes":[]}'),  # attributes: only an empty object
    SMALL_TILE.replace(b"}}}", b'}},"attributes":null}'),
    SMALL_TILE.replace(b'{"inputs":', b'{"extra":1,"inputs":'),  # a key the model does not know
    SMALL_TILE.replace(b'"repeats":{', b'"bogus":{"dtype":"int64","data":[1]},"repeats":{'),
    SMALL_TILE.replace(b',"repeats":{"dtype":"int64","shape":[2],"data":[2,2]}', b""),  # required
    SMALL_TILE[:-1],  # not JSON
    SMALL_TILE.replace(b"[1,2,3,4,5,6]", b"[" + b"1," * COMMON_BODY_BYTES + b"1]"),  # large
])  # fmt: skip
def test_what_is_not_common_goes_to_the_model(body: bytes) -> None:
    assert common_request(TILE, body) is None


def test_versions_whose_models_check_more_have_no_common_form() -> None:
    """Constant's attributes are required and checked together: always the model."""
    constant = registry.resolve("Constant", 21)
    assert common_request(constant, b'{"inputs":{}}') is None
