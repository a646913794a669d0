"""A sequence's state as one Redis value (service/cluster/sequence_state.py): every element
type's tensors come back as they went, strings' bytes included; a value it cannot read (cut
short, not a state, a tensor naming external data) is refused with a text that says so."""

import numpy as np
import pytest
from onnx import TensorProto, numpy_helper

from service.cluster.sequence_state import _LENGTH, decode_state, encode_state
from service.errors import ServiceError

UNREADABLE = "the sequence's state in the cluster store cannot be read"


def _framed(tensor: TensorProto) -> bytes:
    data = tensor.SerializeToString()
    return _LENGTH.pack(len(data)) + data


def test_states_come_back_as_they_went() -> None:
    strings = np.array([b"\xff\x00raw", "text", b""], dtype=object)
    state = {"acc": np.arange(6, dtype=np.int32).reshape(2, 3),
             "f16": np.array([0.5, -2.0], np.float16), "words": strings}  # fmt: skip
    found = decode_state(encode_state(state))
    assert list(found) == ["acc", "f16", "words"]
    np.testing.assert_array_equal(found["acc"], state["acc"])
    assert found["f16"].dtype == np.float16 and found["f16"].tolist() == [0.5, -2.0]
    assert found["words"].tolist() == [b"\xff\x00raw", "text", ""]
    assert not found["acc"].flags.writeable


@pytest.mark.parametrize(
    ("value", "why"),
    [
        (encode_state({"a": np.ones(4, np.float32)})[:-3], "it is truncated"),
        (encode_state({"a": np.ones(4, np.float32)})[:5], "it is truncated"),
        (_LENGTH.pack(3) + b"\xff\xff\xff", "Error parsing message"),
    ],
)
def test_a_value_that_is_no_state_is_refused_with_its_reason(value: bytes, why: str) -> None:
    with pytest.raises(ServiceError, match=UNREADABLE) as refused:
        decode_state(value)
    assert why in str(refused.value)


def test_a_tensor_naming_external_data_is_refused_before_any_file_is_read() -> None:
    tensor = numpy_helper.from_array(np.ones(4, np.float32), "a")
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    tensor.external_data.add(key="location", value="/etc/passwd")
    with pytest.raises(ServiceError, match="its tensor 'a' names external data"):
        decode_state(_framed(tensor))


def test_dims_that_disagree_with_the_data_are_refused() -> None:
    tensor = numpy_helper.from_array(np.ones(4, np.float32), "a")
    tensor.dims[:] = [1 << 40]  # far more than the 16 bytes it holds: nothing allocated
    with pytest.raises(ServiceError, match=UNREADABLE):
        decode_state(_framed(tensor))


@pytest.mark.parametrize(
    "dtype",
    [np.float32, np.float64, np.float16, np.bool_, np.int8, np.int16, np.int32, np.int64,
     np.uint8, np.uint16, np.uint32, np.uint64],
)  # fmt: skip
def test_a_state_is_stored_as_numpy_helper_stores_it(dtype: str) -> None:
    """The bytes numpy_helper makes and reads, made and read without it for numpy's own types
    (a non-contiguous array and a scalar included); each comes back as it went
    (numpy_helper.to_array makes a scalar one item long)."""
    rng = np.random.default_rng(7)
    array = (rng.standard_normal((3, 4)) * 100).astype(dtype)[:, ::2]
    scalar = np.asarray(array.flat[0])
    value = encode_state({"a": array, "s": scalar})
    oracle = _framed(numpy_helper.from_array(np.ascontiguousarray(array), "a")) + _framed(
        numpy_helper.from_array(scalar, "s"))  # fmt: skip
    assert value == oracle
    found = decode_state(oracle)
    for name, sent in (("a", array), ("s", scalar)):
        assert found[name].dtype == sent.dtype
        assert found[name].shape == sent.shape
        np.testing.assert_array_equal(found[name], sent)
        assert not found[name].flags.writeable
