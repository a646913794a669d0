"""gRPC's typed contents packed as binary data (v2_binary.pack_values) a slice at a time
(SLICE_VALUES, so that one message's millions of values never hold the interpreter's lock in
one numpy call): the bytes are numpy's own conversion of the whole sequence, across slice
boundaries, and a value out of its type's range is refused wherever it sits."""

import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb

from service.codecs import sliced
from service.codecs.sliced import SLICE_VALUES
from service.codecs.v2_binary import pack_values
from service.codecs.v2_types import from_datatype
from service.errors import InvalidInput

COUNT = 2 * SLICE_VALUES + 7  # three slices, the last short


@pytest.mark.parametrize(("datatype", "field", "wire"), [
    ("INT32", "int_contents", np.int32), ("INT8", "int_contents", np.int8),
    ("UINT16", "uint_contents", np.uint16), ("INT64", "int64_contents", np.int64),
    ("FP32", "fp32_contents", np.float32), ("FP64", "fp64_contents", np.float64),
    ("BOOL", "bool_contents", np.bool_),
])  # fmt: skip
def test_values_packed_in_slices_are_numpys_whole_conversion(
    datatype: str, field: str, wire: type
) -> None:
    rng = np.random.default_rng(0)
    values = rng.integers(0, 100, COUNT) if wire is not np.bool_ else rng.integers(0, 2, COUNT)
    contents = pb.InferTensorContents()
    getattr(contents, field).extend(values.astype(wire).tolist())
    contents = pb.InferTensorContents.FromString(contents.SerializeToString())
    repeated = getattr(contents, field)  # as the door reads it: protobuf's container
    packed = pack_values(from_datatype(datatype), repeated)
    assert packed == np.asarray(list(repeated)).astype(wire).tobytes()


def test_a_value_out_of_range_in_a_later_slice_is_refused() -> None:
    values = [1] * COUNT
    values[-1] = 300  # past INT8, in the last slice
    with pytest.raises(InvalidInput, match="300 is out of the range of int8"):
        pack_values(from_datatype("INT8"), values)


def test_slices_of_any_size_give_the_same_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sliced, "SLICE_VALUES", 4)
    assert pack_values(from_datatype("INT16"), list(range(10))) == np.arange(
        10, dtype=np.int16).tobytes()  # fmt: skip
