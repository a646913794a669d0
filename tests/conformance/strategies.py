"""Hypothesis strategies: small arrays of every ONNX element type, values over the whole type."""

import ml_dtypes
import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from service.codecs.dtypes import ElementType, element_type

SHAPES = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=3)
_PACKED = {"int4", "uint4", "int2", "uint2"}
# Types whose every bit pattern of their width is a value (NaNs included), drawn as bits.
_BITS = {"bfloat16", "float8e4m3fn", "float8e4m3fnuz", "float8e5m2", "float8e5m2fnuz",
         "float8e8m0", "float4e2m1"}  # fmt: skip


def arrays(dtype: str, shape: tuple[int, ...] | st.SearchStrategy = SHAPES) -> st.SearchStrategy:
    """Arrays of `dtype` (a canonical name) of the given or a drawn small shape."""
    et = element_type(dtype)
    if et.is_string:
        text = st.text(st.characters(exclude_categories=("Cs",)), max_size=4)
        return hnp.arrays(object, shape, elements=text)
    if et.name in _BITS:
        width = 4 if et.name == "float4e2m1" else et.bits
        bits = hnp.arrays(np.uint8 if width <= 8 else np.uint16, shape,
                          elements=st.integers(0, 2**width - 1))  # fmt: skip
        return bits.map(lambda b: b.view(et.np_dtype))
    if et.name in _PACKED:
        info = ml_dtypes.iinfo(et.np_dtype)
        ints = hnp.arrays(np.int8, shape, elements=st.integers(int(info.min), int(info.max)))
        return ints.map(lambda i: i.astype(et.np_dtype))
    return hnp.arrays(et.np_dtype, shape, elements=_elements(et))


def _elements(et: ElementType) -> st.SearchStrategy | None:
    if et.kind == "c":
        width = 32 if et.name == "complex64" else 64
        part = st.floats(width=width, allow_nan=True, allow_infinity=True)
        return st.builds(complex, part, part)
    return None  # hypothesis draws the whole range of the numpy type itself


def scalars(dtype: str) -> st.SearchStrategy:
    """One-element 1-D arrays of `dtype`: a ConstantOfShape `value`."""
    return arrays(dtype, (1,))
