"""The shared memory parameters of an input or an output, with Triton's texts for the
combinations it refuses."""

from typing import Any

import pytest

from service.core.shared_memory import (
    SharedMemoryRef,
    check_input_source,
    output_region,
    tensor_region,
)
from service.errors import InvalidInput

REGION = {"shared_memory_region": "input_data", "shared_memory_byte_size": 64}


@pytest.mark.parametrize(("parameters", "expected"), [
    ({}, None),
    ({"binary_data_size": 8}, None),
    (REGION, SharedMemoryRef("input_data", 0, 64)),
    ({**REGION, "shared_memory_offset": 64}, SharedMemoryRef("input_data", 64, 64)),
    ({**REGION, "shared_memory_byte_size": 0}, SharedMemoryRef("input_data", 0, 0)),
])  # fmt: skip
def test_tensor_region(parameters: dict[str, Any], expected: SharedMemoryRef | None) -> None:
    assert tensor_region("INPUT0", parameters) == expected


@pytest.mark.parametrize(("parameters", "error"), [
    ({"shared_memory_offset": 0}, "'shared_memory_offset' can not be specified without "
     "'shared_memory_region' parameter for tensor 'INPUT0'"),
    ({"shared_memory_byte_size": 64}, "'shared_memory_byte_size' can not be specified "
     "without 'shared_memory_region' parameter for tensor 'INPUT0'"),
    ({"shared_memory_region": "r"}, "'shared_memory_byte_size' must be specified along with "
     "'shared_memory_region' parameter for tensor 'INPUT0'"),
    ({"shared_memory_region": "r", "shared_memory_offset": 0}, "'shared_memory_byte_size' "
     "must be specified along with 'shared_memory_region' parameter for tensor 'INPUT0'"),
    ({**REGION, "shared_memory_region": 3}, "invalid value type for 'shared_memory_region' "
     "parameter for tensor 'INPUT0', expected a string"),
    ({**REGION, "shared_memory_offset": -1}, "invalid value type for 'shared_memory_offset' "
     "parameter for tensor 'INPUT0', expected a non-negative integer"),
    ({**REGION, "shared_memory_offset": True}, "invalid value type for "
     "'shared_memory_offset' parameter for tensor 'INPUT0', expected a non-negative integer"),
    ({**REGION, "shared_memory_byte_size": 1.5}, "invalid value type for "
     "'shared_memory_byte_size' parameter for tensor 'INPUT0', expected a non-negative "
     "integer"),
    ({**REGION, "shared_memory_byte_size": "64"}, "invalid value type for "
     "'shared_memory_byte_size' parameter for tensor 'INPUT0', expected a non-negative "
     "integer"),
])  # fmt: skip
def test_tensor_region_refusals(parameters: dict[str, Any], error: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        tensor_region("INPUT0", parameters)
    assert caught.value.detail == error


@pytest.mark.parametrize(("parameters", "error"), [
    ({**REGION, "classification": 3},
     "Output can't set both 'shared_memory_region' and 'classification'"),
    ({**REGION, "classification": 0},  # asking is enough, as in Triton
     "Output can't set both 'shared_memory_region' and 'classification'"),
    ({**REGION, "binary_data": True},
     "Output can't set both 'shared_memory_region' and 'binary_data'"),
    ({"shared_memory_byte_size": 64}, "'shared_memory_byte_size' can not be specified "
     "without 'shared_memory_region' parameter for tensor 'OUTPUT0'"),
])  # fmt: skip
def test_output_region_refusals(parameters: dict[str, Any], error: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        output_region("OUTPUT0", parameters)
    assert caught.value.detail == error


@pytest.mark.parametrize("parameters", [
    {**REGION, "binary_data": False},  # what tritonclient sends with shared memory
    {**REGION, "shared_memory_offset": 8},
])  # fmt: skip
def test_output_region(parameters: dict[str, Any]) -> None:
    assert output_region("OUTPUT0", parameters) == SharedMemoryRef(
        "input_data", parameters.get("shared_memory_offset", 0), 64
    )


@pytest.mark.parametrize("parameters", [{}, {"binary_data": True}, {"classification": 2}])
def test_outputs_without_a_region(parameters: dict[str, Any]) -> None:
    assert output_region("OUTPUT0", parameters) is None


FIELDS = ("Input must set only one of the following fields: 'data', 'binary_data_size' in "
          "'parameters', 'shared_memory_region' in 'parameters'. But ")  # fmt: skip


@pytest.mark.parametrize(("has_data", "parameters", "but"), [
    (False, {}, "no field is set"),
    (False, {"shared_memory_byte_size": 4}, "no field is set"),
    (True, {"binary_data_size": 4}, "set 'data' 'binary_data_size'"),
    (True, {"shared_memory_region": "r"}, "set 'data' 'shared_memory_region'"),
    (False, {"binary_data_size": 4, "shared_memory_region": "r"},
     "set 'binary_data_size' 'shared_memory_region'"),
    (True, {"binary_data_size": 4, "shared_memory_region": "r"},
     "set 'data' 'binary_data_size' 'shared_memory_region'"),
])  # fmt: skip
def test_an_input_sets_one_source(has_data: bool, parameters: dict[str, Any], but: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        check_input_source(has_data, parameters)
    assert caught.value.detail == FIELDS + but


@pytest.mark.parametrize(("has_data", "parameters"), [
    (True, {}), (False, {"binary_data_size": 4}), (False, REGION),
])  # fmt: skip
def test_an_input_with_one_source(has_data: bool, parameters: dict[str, Any]) -> None:
    check_input_source(has_data, parameters)
