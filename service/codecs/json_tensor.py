"""JSON tensors -> numpy arrays, with the contract's rules for every element type.

Written by hand because no library converts JSON values to ONNX element types with
these rules: strict integers refused when out of range, "NaN"/"Infinity" strings,
[re, im] complex pairs and float8 saturation as onnx does it.
"""

import math
from typing import Any

import ml_dtypes
import numpy as np
from onnx.numpy_helper import saturate_cast
from pydantic_core import from_json

from api_schemas.tensors import DTYPE_NAMES, JsonTensor
from service.codecs import sliced
from service.codecs.dtypes import ElementType, element_type
from service.codecs.limits import Limits
from service.codecs.sliced import sliced_all_finite, sliced_array, sliced_bounds, sliced_types
from service.errors import InvalidInput, PayloadTooLarge, ServiceError

NUMPY_MAX_RANK = 64  # np.array stops nesting here and leaves the deeper lists as elements
LIST_BYTES = 450
"""Memory one `[` of a JSON body may cost while it is parsed and decoded (measured: see
docs/codecs.md): the parser's list, pydantic's copy, numpy's object array slot."""
ITEM_BYTES = 80
"""Memory one element (`,` or the first in a list) may cost: its Python objects and slots."""


LIST_ITEMS = 10
"""What one list counts toward a JSON body's items (json_body_memory): parsed, a list costs
about ten values' time (a million flat values 24-32 ms; a million one-element lists 245-286
ms, most of it the garbage collector's walks over the new lists)."""


def json_body_memory(body: bytes, most_items: int | None = None) -> int:
    """An upper bound on the memory parsing and decoding a JSON request body holds, from a
    scan of its bytes (a few ms for 64 MiB): the memory budget reserves it before parsing,
    so a body of a million one-element lists is refused or waits instead of taking GiBs.

    With `most_items` (Limits.max_json_items), a body of more items than that is refused
    first (413): its commas, and LIST_ITEMS for each opening bracket. The parse that follows
    holds the interpreter's lock in one call, and so the event loop, whichever thread it runs
    on (4 million numbers: 116-152 ms; the decode after it goes a slice at a time)."""
    lists, commas = body.count(b"["), body.count(b",")
    if most_items is not None and commas + LIST_ITEMS * lists > most_items:
        raise PayloadTooLarge(
            f"the request's JSON holds {commas} commas and {lists} opening brackets, "
            f"{commas + LIST_ITEMS * lists} items at {LIST_ITEMS} a list, over the limit of "
            f"{most_items} (OPSERVE_MAX_JSON_ITEMS): send large tensors as binary data (V2's "
            "binary tensor data extension, a base64 TensorProto in v1) or in shared memory"
        )
    return 4 * len(body) + LIST_BYTES * lists + ITEM_BYTES * (commas + lists)


def common_json(body: bytes) -> Any:
    """`body` read for a short reading (V2 common_binary_call; v1 common_request and V2
    common_call read theirs with pydantic_core schemas, validate_json) as the request
    models read it: by pydantic_core.from_json, jiter, the very parser of `model_validate_json`
    (integers past 64 bits stay ints, as the models keep them); None when it is not JSON, or
    holds NaN or Infinity literals (the models are the judge of those).

    Not orjson: after orjson.loads makes a string value, the core runs ordinary code about 15%
    slower for the next few hundred microseconds on this project's VM, a Xeon with AVX-512
    (100,000 ints summed in 655 us, 760 right after one orjson.loads of a string, 659 after
    from_json's; np.exp, which runs AVX-512 code, leaves the same 760: most likely the core's
    lower clock for AVX-512, inferred, not read from the CPU). At thousands of small
    requests a second that is all of every request's time: with from_json, the small Tile
    call's CPU on the server went from 179.6 to 160.2 us (v1) and from 192.8 to 167.5 us (V2
    JSON), at 1.75 us a parse against orjson's 1.5 (docs/api.md, Throughput)."""
    try:
        return from_json(body, allow_inf_nan=False, cache_strings="keys")
    except ValueError:
        return None


NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
_SATURATING = {"float8e4m3fn", "float8e4m3fnuz", "float8e5m2", "float8e5m2fnuz",
               "float8e8m0", "float4e2m1"}  # fmt: skip
_NO_NAN = {"float4e2m1"}
_HAS_INF = {"float8e5m2"}  # the one saturating type with infinities


def decode_json(tensor: JsonTensor, limits: Limits) -> np.ndarray:
    """Build the array a JSON tensor describes; every refusal names the field at fault."""
    return decode_values(tensor.dtype, tensor.shape, tensor.data, limits)


def decode_values(
    dtype: str | int | ElementType, shape: list[int] | None, data: Any, limits: Limits
) -> np.ndarray:
    """The array of `data` (JSON values, flat or nested) of `dtype` and `shape` (None: the
    nesting's); every refusal names the field at fault (dtype, shape or data)."""
    plain = plain_numbers(dtype, shape, data, limits)
    if plain is not None:  # the common small request: the same array, a shorter way
        return plain
    return decode_general(dtype, shape, data, limits)


def decode_general(
    dtype: str | int | ElementType, shape: list[int] | None, data: Any, limits: Limits
) -> np.ndarray:
    """decode_values for every tensor: through an object array, each element type's rules."""
    field = "dtype"  # the field being decoded; one try block, as it runs for every tensor
    try:
        et = dtype if isinstance(dtype, ElementType) else element_type(dtype)
        field = "shape"
        if shape is not None:
            limits.check_shape(shape)
        field = "data"
        try:
            values = np.array(data, dtype=object)
        except ValueError as exc:  # ragged nesting
            raise InvalidInput(f"data is not a rectangular array: {exc}") from exc
        if (
            values.ndim == NUMPY_MAX_RANK
            and values.size
            and isinstance(values.reshape(-1)[0], list)
        ):
            raise InvalidInput(f"data is nested more than {NUMPY_MAX_RANK} levels deep, over "
                               f"the rank limit of {limits.max_rank}")  # fmt: skip
        data_shape = _complex_shape(values.shape) if et.kind == "c" else values.shape
        dims = _reconcile(shape, data_shape, limits)
        array = _CONVERT[et.kind](values.reshape(-1), et, limits)
    except ServiceError as exc:
        exc.loc = (field, *exc.loc)
        raise
    return array.reshape(dims)


_PLAIN: dict[str, ElementType] = {}
"""The element types plain_numbers decodes, by canonical name (filled below)."""


def plain_numbers(
    dtype: str | int | ElementType, shape: list[int] | None, data: Any, limits: Limits
) -> np.ndarray | None:
    """The array of the most common tensor, a flat list of plain numbers with its shape given,
    without the object array the general path goes through; None for anything else, and for
    anything the general path would refuse (it then decodes it, or refuses it in its words).

    The one definition of "plain": a canonical dtype name or an ElementType of bool, an integer
    type of 8 bits or more, or a float type that neither saturates nor lacks NaN; a shape of
    ints within the limits; data a list of as many elements as the shape holds, all bools
    (bool), all ints in range (integers) or ints and finite floats (floats). tests/codecs/
    test_plain_numbers.py holds it equal to the general path on generated tensors."""
    if isinstance(dtype, ElementType):
        et = dtype if dtype.name in _PLAIN else None
    else:
        et = _PLAIN.get(dtype)  # type: ignore[arg-type]
    if et is None or type(data) is not list or type(shape) is not list:
        return None
    for dim in shape:  # a loop: all() over a generator costs nearly 4x as much on a short shape
        if type(dim) is not int:
            return None
    try:
        count = limits.check_shape(shape)
    except ServiceError:
        return None
    if count != len(data) or not count:
        return None
    # Past SLICE_VALUES, every step over `data` goes a slice at a time (codecs/sliced.py):
    # over a V2 body's 4 million ints, whole, the type scan and the array held the
    # interpreter's lock, and so the event loop, 70 and 104 ms each. A small request's steps
    # stay single calls (the helpers' calls cost the small float call 0.3 us of 2).
    small = count <= sliced.SLICE_VALUES
    convert = np.array if small else sliced_array
    types = set(map(type, data)) if small else sliced_types(data)
    try:
        if et.kind == "f":
            if not types <= _NUMBER_TYPES:
                return None
            # all finite (fsum: one C loop, no array; it overflows only past float64's range)
            if not (math.isfinite(math.fsum(data)) if small else sliced_all_finite(data)):
                return None
            if et.bits == 64:
                array = convert(data, _FLOAT64)
            elif _past(((min(data), max(data)) if small else sliced_bounds(data)),
                       _FINITE_MAX[et.name]):  # fmt: skip
                with np.errstate(over="ignore"):  # as _float: past the largest finite is inf
                    array = convert(data, _FLOAT64).astype(et.np_dtype)
            elif et.np_dtype == _FLOAT32:
                # numpy makes each float32 element from the value's double, as the float64
                # array and astype below do (the same bits), without the float64 array
                array = convert(data, _FLOAT32)
            else:  # no element rounds past the largest finite
                array = convert(data, _FLOAT64).astype(et.np_dtype)
        elif et.kind == "i":
            if not types <= _INT_TYPE:
                return None
            array = convert(data, _UINT64 if et.np_dtype == _UINT64 else _INT64)
            if et.bits < 64:  # 64 bits: the array as it is
                info = ml_dtypes.iinfo(et.np_dtype)
                if array.min() < info.min or array.max() > info.max:
                    return None
                array = array.astype(et.np_dtype)
        elif types <= _BOOL_TYPE:  # et.kind == "b"
            array = convert(data, _BOOL)
        else:
            return None
    # OverflowError: an int past 64 bits, negative for uint64, a sum past float64's range;
    # ValueError: fsum of inf and -inf (pydantic reads bare Infinity in JSON as a float)
    except (OverflowError, ValueError):
        return None
    return array if len(shape) == 1 else array.reshape(shape)  # flat: its shape already


def _past(bounds: tuple[float, float], largest: float) -> bool:
    low, high = bounds
    return high > largest or low < -largest


# dtypes as objects and type sets as constants: numpy converts a scalar type to its dtype on
# every call, and a set display is built on every run (a small call's 1.5 us in all)
_INT64, _UINT64 = np.dtype(np.int64), np.dtype(np.uint64)
_FLOAT32, _FLOAT64, _BOOL = np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.bool_)
_NUMBER_TYPES, _INT_TYPE, _BOOL_TYPE = frozenset({int, float}), frozenset({int}), frozenset({bool})


def _complex_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    if shape and shape[-1] == 2:
        return shape[:-1]
    if shape and math.prod(shape) == 0:  # an empty tensor has no pairs to show
        return shape
    raise InvalidInput("complex elements must be [re, im] pairs")


def _reconcile(declared: list[int] | None, data_shape: tuple[int, ...], limits: Limits) -> tuple:
    if declared is None:
        limits.check_shape(data_shape)
        return data_shape
    shape = tuple(declared)
    if data_shape == shape:
        return shape
    count = math.prod(shape)
    if len(data_shape) == 1 and data_shape[0] == count:
        return shape
    if data_shape == () and count == 1:
        return shape
    raise InvalidInput(
        f"data has shape {list(data_shape)} ({math.prod(data_shape)} elements) "
        f"but shape is {list(shape)} ({count} elements)"
    )


def _only(flat: np.ndarray, allowed: tuple[type, ...], what: str) -> set[type]:
    """The element types present, refused unless all are `allowed`."""
    types = set(map(type, flat))  # twice as fast as np.frompyfunc(type) here
    if list in types:  # numpy stops at ragged rows, leaving lists behind (depth: decode_json)
        raise InvalidInput("data is ragged: its nested lists differ in length, so it is not a "
                           "rectangular array")  # fmt: skip
    if not types <= set(allowed):
        found = ", ".join(sorted(t.__name__ for t in types - set(allowed)))
        raise InvalidInput(f"{what} expected, found {found}")
    return types


def _bool(flat: np.ndarray, et: ElementType, limits: Limits) -> np.ndarray:
    _only(flat, (bool,), "JSON booleans (true/false)")
    return flat.astype(np.bool_)


def _int(flat: np.ndarray, et: ElementType, limits: Limits) -> np.ndarray:
    _only(flat, (int,), "JSON integers")
    wide = np.uint64 if et.np_dtype == np.uint64 else np.int64
    try:
        ints = flat.astype(wide)
    except OverflowError:
        raise InvalidInput(f"an integer is out of the range of {et.name}") from None
    if ints.size and et.bits < 64:  # int64/uint64 were range-checked by astype
        info = ml_dtypes.iinfo(et.np_dtype)
        low, high = int(ints.min()), int(ints.max())
        if low < info.min or high > info.max:
            bad = low if low < info.min else high
            raise InvalidInput(f"{bad} is out of the range of {et.name} [{info.min}, {info.max}]")
    return ints.astype(et.np_dtype)


def _floats(flat: np.ndarray) -> np.ndarray:
    types = _only(flat, (int, float, str), 'numbers or "NaN"/"Infinity"/"-Infinity"')
    named = None  # where the non-finite strings were
    if str in types:
        named = np.array([isinstance(value, str) for value in flat], dtype=bool)
        flat = flat.copy()
        for i in np.flatnonzero(named):
            if flat[i] not in NON_FINITE:
                raise InvalidInput(f'{flat[i][:40]!r} is not a number; only "NaN", '
                                   '"Infinity" and "-Infinity" may be strings')  # fmt: skip
            flat[i] = NON_FINITE[flat[i]]
    try:
        wide = flat.astype(np.float64)
    except OverflowError:
        raise InvalidInput("an integer is too large for a floating-point element") from None
    numbers = wide if named is None else wide[~named]
    if not np.isfinite(numbers).all():  # a bare NaN token, or 1e400: JSON has no such numbers
        raise InvalidInput('a number is not finite; write non-finite values as the strings '
                           '"NaN", "Infinity" and "-Infinity"')  # fmt: skip
    return wide


def _float(flat: np.ndarray, et: ElementType, limits: Limits) -> np.ndarray:
    wide = _floats(flat)
    if et.name in _NO_NAN and np.isnan(wide).any():
        raise InvalidInput(f"{et.name} has no NaN")
    if et.name not in _SATURATING:
        with np.errstate(over="ignore"):  # rounding past the largest finite value is inf
            return wide.astype(et.np_dtype)
    narrow = np.asarray(saturate_cast(wide, et.np_dtype))
    if et.name in _HAS_INF:
        # saturate_cast clips infinity to the maximum, but "Infinity" names a value
        # float8e5m2 has: keep it, or an infinity could not make the round trip.
        inf = np.isinf(wide)
        narrow[inf] = wide[inf].astype(et.np_dtype)
    return narrow


def _complex(flat: np.ndarray, et: ElementType, limits: Limits) -> np.ndarray:
    pairs = _floats(flat)  # [re0, im0, re1, im1, ...]
    return pairs.view(np.complex128).astype(et.np_dtype)


def _string(flat: np.ndarray, et: ElementType, limits: Limits) -> np.ndarray:
    _only(flat, (str,), "JSON strings")
    total = 0
    for value in flat:
        try:
            total += len(value.encode("utf-8"))
        except UnicodeEncodeError:
            raise InvalidInput("a string is not valid UTF-8 text") from None
        if total > limits.max_string_bytes:
            raise PayloadTooLarge(f"strings exceed the limit of {limits.max_string_bytes} bytes")
    return flat


_CONVERT = {"b": _bool, "i": _int, "f": _float, "c": _complex, "O": _string}
_PLAIN.update(
    {
        et.name: et
        for et in (element_type(name) for name in DTYPE_NAMES)
        if et.kind == "b"
        or (et.kind == "i" and et.bits >= 8)
        or (et.kind == "f" and et.name not in _SATURATING | _NO_NAN)
    }
)
_FINITE_MAX = {
    name: float(ml_dtypes.finfo(et.np_dtype).max) for name, et in _PLAIN.items() if et.kind == "f"
}
