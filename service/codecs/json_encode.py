"""numpy arrays -> JSON tensors: flat row-major data, canonical dtype names, non-finite floats
as "NaN"/"Infinity"/"-Infinity" strings and complex numbers as [re, im].

Numbers are written by orjson straight from numpy (OPT_SERIALIZE_NUMPY), many times faster
than Python lists. orjson writes every non-finite float as `null`; the text is then patched
(`null` is no number's spelling), so non-finite values cost no Python object per element
either. Large answers are encoded in chunks (`json_data_chunks`) as they are sent.
"""

from collections.abc import Iterator
from functools import cache
from typing import Any

import numpy as np
import orjson

from service.codecs.dtypes import ElementType, element_type, element_type_of
from service.errors import InvalidInput

_NUMPY = orjson.OPT_SERIALIZE_NUMPY
_TOKENS = (b'"NaN"', b'"Infinity"', b'"-Infinity"')
CHUNK_ELEMENTS = 1 << 16
"""Elements per chunk of a streamed `data` array (under 2 MiB of text for any number type)."""


def encode_json(array: np.ndarray) -> dict[str, Any]:
    """The JSON form of an array; `data` is flat: a numpy array orjson writes natively, or
    an orjson.Fragment of ready text where floats are not all finite."""
    et = element_type_of(array)
    return {"dtype": et.name, "shape": list(array.shape), "data": json_data(array, et)}


def json_data(array: np.ndarray, et: ElementType) -> Any:
    """The `data` value of an array (see encode_json)."""
    # orjson serializes only C-contiguous base arrays: ravel gives one, copying only when it
    # must (reshape(-1) would keep a reversed view, a[::-1], as it is); asarray drops a subclass
    flat = _wire_form(np.asarray(array).ravel(), et)
    if et.kind == "O":
        return _texts(flat)
    if et.kind in "fc":
        # orjson writes a non-finite float as null, and no finite one contains it: the text
        # says whether every element is finite, cheaper than np.isfinite on a small array
        text = orjson.dumps(flat, option=_NUMPY)
        return orjson.Fragment(text if b"null" not in text else numbers_text(flat))
    return flat


def json_data_chunks(array: np.ndarray, et: ElementType) -> Iterator[bytes]:
    """The text of `data` in chunks of CHUNK_ELEMENTS elements, from `[` to `]`: one chunk's
    text is all that is built at a time."""
    flat = _wire_form(np.asarray(array).ravel(), et)
    yield b"["
    for start in range(0, len(flat), CHUNK_ELEMENTS):
        part = flat[start : start + CHUNK_ELEMENTS]
        text = orjson.dumps(_texts(part)) if et.kind == "O" else numbers_text(part)
        yield (b"," if start else b"") + text[1:-1]
    yield b"]"


def numbers_text(flat: np.ndarray) -> bytes:
    """orjson's text of a flat number array (rows of [re, im] for complex), `null`s patched
    into the strings of NaN and the infinities with whole-text replaces where one kind is
    present; only where they mix is the text split, once per non-finite value."""
    text = orjson.dumps(flat, option=_NUMPY)
    if flat.dtype.kind != "f":
        return text
    values = flat.reshape(-1)
    finite = np.isfinite(values)
    if finite.all():
        return text
    present = [bool(np.isnan(values).any()), bool(np.isposinf(values).any()),
               bool(np.isneginf(values).any())]  # fmt: skip
    if sum(present) == 1:
        return text.replace(b"null", _TOKENS[present.index(True)])
    special = values[~finite]
    which = np.where(np.isnan(special), 0, np.where(special > 0, 1, 2))
    pieces = text.split(b"null")
    out = [pieces[0]]
    for piece, kind in zip(pieces[1:], which.tolist(), strict=True):
        out += (_TOKENS[kind], piece)
    return b"".join(out)


def check_texts(array: np.ndarray) -> None:
    """Refuse, before an answer starts, a string array with an element that is not UTF-8 text
    (BYTES that came in as binary data), naming the way that can carry it."""
    for i, element in enumerate(array.reshape(-1)):
        if isinstance(element, bytes):
            raise InvalidInput(f"element {i} of the string output is not UTF-8 text, which "
                               "JSON cannot carry: ask for the output as binary data (V2: "
                               "parameters.binary_data) or as tensor_proto (v1)")  # fmt: skip


def _texts(flat: np.ndarray) -> list[str]:
    """The elements of a string array as JSON text (check_texts refuses what is not)."""
    texts = flat.tolist()
    if any(isinstance(element, bytes) for element in texts):
        check_texts(flat)
    return texts


_JSON_FLOATS = frozenset(map(np.dtype, (np.float16, np.float32, np.float64)))
"""The float dtypes orjson writes as they are (a set of dtypes: comparing a dtype with numpy's
scalar types converts them first, 0.4 us for a small answer)."""


def _wire_form(flat: np.ndarray, et: ElementType) -> np.ndarray:
    """What orjson writes for each kind: narrow floats as float32 (exact), packed ints as int8,
    complex as [re, im] rows."""
    if et.kind == "f" and flat.dtype not in _JSON_FLOATS:
        return flat.astype(np.float32)  # bfloat16, float8, float4: exact in float32
    if et.kind == "i" and flat.dtype.kind not in "iu":
        return flat.astype(np.int8)  # int4, uint4, int2, uint2
    if et.kind == "c":
        return flat.view(np.float32 if flat.dtype == np.complex64 else np.float64).reshape(-1, 2)
    return flat


def json_element_bytes(et: ElementType) -> int:
    """The most bytes one element of `et` can take in `data`, its comma included (strings:
    the quotes and comma only; their text is counted by the caller, at 6 bytes per UTF-8 byte,
    the length of a `\\u0001` escape)."""
    return _most_bytes(et.name)


@cache
def _most_bytes(name: str) -> int:
    et = element_type(name)
    if et.kind == "O":
        return 3
    if et.kind == "b":
        return len("false,")
    if et.kind == "i":
        info = np.iinfo(np.int8 if et.np_dtype.kind not in "iu" else et.np_dtype)
        low, high = (-8, 15) if et.bits == 4 else (-2, 3) if et.bits == 2 else (info.min, info.max)
        return max(len(str(low)), len(str(high))) + 1
    if et.kind == "c":
        return 2 * _most_bytes("float" if et.np_dtype == np.complex64 else "double") + 2
    if et.np_dtype == np.float64:
        return len("-2.2250738585072014e-308,")
    if et.np_dtype == np.float32:
        return len("-1.17549435e-38,")
    # 16 bits or fewer: write every value once and measure the longest
    every = np.arange(1 << et.bits, dtype=np.uint16 if et.bits > 8 else np.uint8)
    text = numbers_text(_wire_form(every.view(et.np_dtype), et))
    return max(map(len, text[1:-1].split(b","))) + 1
