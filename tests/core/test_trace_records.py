"""Tensor records in Triton's form (core/trace_records.py), read back as Triton's
trace_summary.py reads them (tests/trace_reading.py), for each kind of element, and their
bound."""

from typing import Any

import numpy as np
import pytest

from service.core.statistics import Timings
from service.core.trace_records import core_stamps, tensor
from tests.trace_reading import tensor_array


@pytest.mark.parametrize("array", [
    np.array([[True, False, True]]),
    np.arange(-3, 3, dtype=np.int8).reshape(2, 3),
    np.arange(6, dtype=np.uint64).reshape(3, 2) * (2**40),
    np.array([0.1, -2.5e-8, 3e30, np.inf], dtype=np.float32),
    np.array([1 / 3, -0.0], dtype=np.float64),
    np.array([0.5, 65504], dtype=np.float16),
])  # fmt: skip
def test_numbers_read_back_as_they_were(array: np.ndarray) -> None:
    found = tensor("X", array, 1 << 20)
    assert found["shape"] == ",".join(map(str, array.shape)) and "truncated" not in found
    assert np.array_equal(tensor_array(found), array)


def test_strings_in_quotes_as_csv_reads_them() -> None:
    array = np.array([b"plain", b'say "hi", then go', "é".encode()], dtype=object)
    found = tensor("S", array, 1 << 20)
    assert found["dtype"] == "BYTES"
    read: Any = tensor_array(found)
    assert list(read) == ["plain", 'say "hi", then go', "é"]


def test_a_long_tensor_is_cut_at_the_bound() -> None:
    array = np.arange(1000, dtype=np.int32).reshape(10, 100)
    found = tensor("X", array, 100)  # 25 elements
    assert (found["shape"], found["full_shape"], found["truncated"]) == ("25", "10,100", True)
    assert np.array_equal(tensor_array(found), np.arange(25))
    strings = np.array([b"a" * 40] * 10, dtype=object)
    cut = tensor("S", strings, 100)
    assert cut["shape"] == "2" and cut["data"].count("a") == 80
    nothing = tensor("X", array, 0)
    assert (nothing["data"], nothing["shape"]) == ("", "0")


def test_core_stamps_keep_order_and_lie_within_the_request() -> None:
    timings = Timings()
    timings.started, timings.compute_input, timings.compute_infer = 150, 10, 20
    timings.compute_output = 500  # past the end: clamped
    stamps = core_stamps(timings, 100, 400, [("CACHE_LOOKUP_START", 120),
                                              ("CACHE_LOOKUP_END", 130)])  # fmt: skip
    names = [name for name, _ in stamps]
    assert names == ["REQUEST_START", "QUEUE_START", "CACHE_LOOKUP_START", "CACHE_LOOKUP_END",
                     "COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START",
                     "COMPUTE_END", "REQUEST_END"]  # fmt: skip
    assert [ns for _, ns in stamps] == [100, 100, 120, 130, 150, 160, 180, 400, 400]
    hit = core_stamps(Timings(), 100, 400, [("CACHE_LOOKUP_START", 90)])
    assert hit == [("REQUEST_START", 100), ("QUEUE_START", 100), ("CACHE_LOOKUP_START", 100),
                   ("REQUEST_END", 400)]  # fmt: skip


def test_compute_stamps_end_before_the_cache_insert() -> None:
    """The run's measured parts may add up past the cache's insert (a busy host): COMPUTE_*
    stop at the insert's start, so a miss reads compute, then insert, as Triton's order has it."""
    timings = Timings()
    timings.started, timings.compute_input, timings.compute_infer = 150, 10, 20
    timings.compute_output = 100  # would end at 280, after the insert began at 200
    stamps = dict(core_stamps(timings, 100, 400, [("CACHE_LOOKUP_START", 120),
                                                  ("CACHE_LOOKUP_END", 130),
                                                  ("CACHE_INSERT_START", 200),
                                                  ("CACHE_INSERT_END", 210)]))  # fmt: skip
    assert stamps["COMPUTE_OUTPUT_START"] == 180 and stamps["COMPUTE_END"] == 200
    assert stamps["COMPUTE_END"] <= stamps["CACHE_INSERT_START"] < stamps["CACHE_INSERT_END"]
    assert list(stamps.values()) == sorted(stamps.values())
