"""ONNX element types: a thin layer over onnx's own dtype table (onnx.helper, ml_dtypes).

The only thing added here is name resolution for the wire (canonical names and their
aliases) and the bit width of the packed 4-bit and 2-bit types.
"""

from dataclasses import dataclass, field

import ml_dtypes
import numpy as np
from onnx import TensorProto, helper

from api_schemas.tensors import DTYPE_NAMES
from service.errors import InvalidInput

_PACKED_BITS = {
    TensorProto.INT4: 4, TensorProto.UINT4: 4, TensorProto.FLOAT4E2M1: 4,
    TensorProto.INT2: 2, TensorProto.UINT2: 2,
}  # fmt: skip


@dataclass(frozen=True)
class ElementType:
    """One ONNX element type: canonical name, TensorProto enum and numpy dtype."""

    name: str
    enum: int
    np_dtype: np.dtype
    bits: int  # bits per element on the wire (raw_data); 4 and 2 are packed

    @property
    def is_string(self) -> bool:
        return self.enum == TensorProto.STRING

    kind: str = field(init=False)
    """'b' bool, 'i' integer (4/2-bit too), 'f' floating, 'c' complex, 'O' string."""
    type_str: str = field(init=False)
    """The name as ONNX type constraints write it: tensor(float)."""
    wire_dtype: np.dtype = field(init=False)
    """np_dtype in little-endian order, as raw_data and V2 binary data hold elements."""

    def __post_init__(self) -> None:  # derived once: all are read on every request
        object.__setattr__(self, "kind", _kind(self.np_dtype))
        object.__setattr__(self, "type_str", f"tensor({self.name})")
        object.__setattr__(self, "wire_dtype", self.np_dtype.newbyteorder("<"))

    def raw_nbytes(self, count: int) -> int:
        """Bytes `count` elements take in TensorProto.raw_data."""
        return (count * self.bits + 7) // 8


_SMALL_INTS = {
    np.dtype(t) for t in (ml_dtypes.int4, ml_dtypes.uint4, ml_dtypes.int2, ml_dtypes.uint2)
}


def _kind(np_dtype: np.dtype) -> str:
    if np_dtype.kind == "O":
        return "O"
    if np_dtype.kind in "iu" or np_dtype in _SMALL_INTS:
        return "i"
    if np_dtype.kind in "bc":
        return np_dtype.kind
    return "f"


def _build() -> tuple[dict[int, ElementType], dict[str, ElementType]]:
    by_enum: dict[int, ElementType] = {}
    by_alias: dict[str, ElementType] = {}
    for name in DTYPE_NAMES:
        enum = TensorProto.DataType.Value(name.upper())
        np_dtype = np.dtype(helper.tensor_dtype_to_np_dtype(enum))
        bits = _PACKED_BITS.get(enum, np_dtype.itemsize * 8)
        et = ElementType(name, enum, np_dtype, bits)
        by_enum[enum] = et
        for alias in (name, str(enum), np_dtype.name, np_dtype.name.replace("_", "")):
            by_alias.setdefault(alias, et)
    by_alias["string"] = by_enum[TensorProto.STRING]  # numpy calls it 'object'
    del by_alias["object"]
    return by_enum, by_alias


_BY_ENUM, _BY_ALIAS = _build()

ELEMENT_TYPES: tuple[ElementType, ...] = tuple(_BY_ENUM.values())


# Not cached: the spec comes from the wire, and a cache keyed by it (padded, mixed-case
# variants all resolve) would grow without bound.
def element_type(spec: str | int) -> ElementType:
    """Resolve a dtype as the wire gives it: canonical, numpy or enum name, or enum number."""
    if isinstance(spec, bool) or not isinstance(spec, (str, int)):
        raise InvalidInput(f"dtype must be a name or an enum number, not {type(spec).__name__}")
    if isinstance(spec, int):  # looked up as a number: str() of a huge int raises
        found = _BY_ENUM.get(spec)
    else:
        key = spec.strip().lower().removeprefix("tensorproto.")
        if key.startswith("tensor(") and key.endswith(")"):
            key = key[7:-1]
        found = _BY_ALIAS.get(key)
    if found is None:
        raise InvalidInput(
            f"unknown dtype {_shown(spec)}; expected one of {', '.join(DTYPE_NAMES)}"
        )
    return found


def _shown(spec: str | int) -> str:
    """The offending spec, cut short: it is echoed back in the error."""
    if isinstance(spec, int):
        return str(spec) if abs(spec) < 2**64 else "(an integer too large to be an enum number)"
    return repr(spec) if len(spec) <= 40 else repr(spec[:40]) + "..."


_BY_DTYPE = {et.np_dtype: et for et in ELEMENT_TYPES}  # object -> string


def element_type_of(array: np.ndarray) -> ElementType:
    """The element type of an array the service built (object arrays hold strings)."""
    try:
        return _BY_DTYPE[array.dtype]
    except KeyError:
        if array.dtype.kind == "U":
            return _BY_ENUM[TensorProto.STRING]
        raise InvalidInput(f"arrays of {array.dtype} have no ONNX element type") from None


def dtypes_named(names: frozenset[str]) -> frozenset[np.dtype]:
    """The numpy dtypes whose arrays element_type_of gives one of these element type names."""
    return frozenset(dtype for dtype, et in _BY_DTYPE.items() if et.name in names)


def dtype_name(dtype: np.dtype) -> str:
    """The canonical name of a numpy dtype the service builds ("string" for object)."""
    found = _BY_DTYPE.get(dtype)
    return found.name if found else dtype.name


def by_enum(enum: int) -> ElementType:
    """The element type of a TensorProto.DataType number."""
    try:
        return _BY_ENUM[enum]
    except KeyError:
        raise InvalidInput(f"unsupported TensorProto data_type {enum}") from None


def string_bytes(value: str | bytes) -> int:
    """The wire bytes of one string element: its UTF-8 text, or (BYTES that are not UTF-8,
    from V2's binary data) the bytes themselves."""
    return len(value) if isinstance(value, bytes) else len(value.encode("utf-8"))


def string_wire(value: str | bytes) -> bytes:
    """One string element's bytes on a binary wire (BYTES, TensorProto string_data)."""
    return value if isinstance(value, bytes) else str(value).encode("utf-8")
