"""The short decode of plain number lists (json_tensor.plain_numbers) against the general path
(decode_general): on generated tensors it gives the very same array (dtype, shape, bytes), or
declines; it never decodes what the general path refuses."""

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from api_schemas.tensors import DTYPE_NAMES
from service.codecs import sliced
from service.codecs.dtypes import element_type
from service.codecs.json_tensor import _PLAIN, decode_general, decode_values, plain_numbers
from service.codecs.limits import Limits
from service.errors import ServiceError

LIMITS = Limits(max_elements=64, max_string_bytes=1 << 10, max_rank=4)
PROPERTY = settings(max_examples=600, deadline=None, suppress_health_check=list(HealthCheck))
BOUNDS = [0, 1, 2**7, 2**8, 2**15, 2**16, 2**31, 2**32, 2**63, 2**64]
ELEMENT = (
    st.integers(min_value=-(2**70), max_value=2**70)
    | st.sampled_from([b + d for b in BOUNDS for d in (-1, 0, 1)] + [-b - 1 for b in BOUNDS])
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.floats(width=16) | st.floats(width=32)
    | st.booleans()
    | st.sampled_from(["NaN", "Infinity", "-Infinity", "1", ""])
    | st.none()
    | st.lists(st.integers(-3, 3), max_size=2)
)  # fmt: skip
DTYPE = (
    st.sampled_from(DTYPE_NAMES)
    | st.sampled_from(DTYPE_NAMES).map(element_type)
    | st.sampled_from(["FLOAT", "float32", "tensor(float)", " float", 1, 7, True, None])
)
SHAPE = st.none() | st.lists(
    st.integers(-1, 5) | st.sampled_from([2**40, True, 2.0]), max_size=5
)  # fmt: skip


def _data(draw: st.DrawFn, shape: object) -> object:
    """Mostly as many elements as the shape holds (the case the short path takes), sometimes
    another count, a scalar or nested lists."""
    dims = shape if isinstance(shape, list) else []
    count = math.prod(d for d in dims if type(d) is int and 0 <= d < 8)
    kind = draw(st.sampled_from(["same"] * 6 + ["more", "scalar", "nested"]))
    same_type = draw(st.sampled_from([int, float, bool, None]))
    element = {int: st.integers(-(2**65), 2**65), float: st.floats(), bool: st.booleans(),
               None: ELEMENT}[same_type]  # fmt: skip
    if kind == "scalar":
        return draw(element)
    if kind == "nested":
        return [draw(st.lists(element, min_size=2, max_size=2)) for _ in range(count)]
    size = count + (draw(st.integers(1, 2)) if kind == "more" else 0)
    return draw(st.lists(element, min_size=size, max_size=size))


@st.composite
def tensors(draw: st.DrawFn) -> tuple[object, object, object]:
    shape = draw(SHAPE)
    return draw(DTYPE), shape, _data(draw, shape)


def _general(dtype: object, shape: object, data: object) -> np.ndarray | Exception:
    try:
        return decode_general(dtype, shape, data, LIMITS)  # type: ignore[arg-type]
    except (ServiceError, TypeError, AttributeError) as refused:  # a shape no model passes
        return refused


@PROPERTY
@given(tensors())
@example(("float", [2, 3], [1, 2, 3, 4, 5, 6]))
@example(("int64", [2], [2, 2]))
@example(("int8", [2], [127, 128]))
@example(("uint64", [2], [2**64 - 1, -1]))
@example(("float", [1], [2**64]))
@example(("double", [1], [10**400]))
@example(("int32", [1], [True]))
@example(("bool", [2], [True, 1]))
@example(("float16", [1], [70000.0]))
@example(("bfloat16", [2], [1e39, -1e-45]))
@example(("float", [2], [math.inf, -math.inf]))  # fsum raised ValueError (CI)
def test_the_short_decode_is_the_general_one_or_declines(tensor: tuple) -> None:
    _check_short(tensor)


@PROPERTY
@given(tensors())
@example(("float", [7], [1.0, 2.0, math.inf, 4.0, 5.0, 6.0, 7.0]))  # inf in a later slice
@example(("int8", [5], [1, 2, 3, 4, 128]))  # out of range in the last, short slice
@example(("float16", [4], [1.0, 2.0, 3.0, 70000.0]))  # past float16's largest, second slice
def test_the_short_decode_a_slice_at_a_time_is_the_same(tensor: tuple) -> None:
    """With slices of 3 elements (codecs/sliced.py; 262,144 in the server), the generated
    tensors go through several slices: the same array, or a decline."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sliced, "SLICE_VALUES", 3)
        _check_short(tensor)


def _check_short(tensor: tuple) -> None:
    dtype, shape, data = tensor
    short = plain_numbers(dtype, shape, data, LIMITS)  # type: ignore[arg-type]
    general = _general(dtype, shape, data)
    if short is None:
        return
    assert isinstance(general, np.ndarray), f"decoded what the general path refuses: {general}"
    assert short.dtype == general.dtype and short.shape == general.shape
    assert short.tobytes() == general.tobytes()


@pytest.mark.parametrize("slice_values", [sliced.SLICE_VALUES, 3])
@pytest.mark.parametrize("name", sorted(_PLAIN))
def test_each_plain_type_takes_the_short_path(
    name: str, slice_values: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The short path is taken (so the properties above compare something) for every plain
    type, whole or a slice at a time, and decode_values gives what it gives."""
    monkeypatch.setattr(sliced, "SLICE_VALUES", slice_values)
    data = [True, False] * 4 if name == "bool" else [1, 0, 2, 3, 0, 1, 5, 4]
    short = plain_numbers(name, [2, 4], data, LIMITS)
    assert short is not None
    assert decode_values(name, [2, 4], data, LIMITS).tobytes() == short.tobytes()


@pytest.mark.parametrize(("dtype", "shape", "data"), [
    ("float", [2], [1.0, "NaN"]),  # non-finite strings: the general path's
    ("float8e4m3fn", [1], [1.0]),  # saturating types
    ("int4", [1], [1]),  # packed types
    ("string", [1], ["a"]),
    ("float", None, [1.0]),  # the shape from the nesting
    ("float", [2, 1], [[1.0], [2.0]]),  # nested
    ("int64", [1], [2**63]),  # out of range: the general path refuses it in its words
    ("float", [65], [0.0] * 65),  # over the element limit
])  # fmt: skip
def test_what_is_not_plain_goes_the_general_way(dtype: str, shape: list | None,
                                                 data: list) -> None:  # fmt: skip
    assert plain_numbers(dtype, shape, data, LIMITS) is None
