"""A model's sequence_batching as a plan: Triton's validation texts, the control tensors
(notes/triton-http.md §1.10) and the initial states."""

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from service.errors import InvalidInput, Unsupported
from service.runtime.sequence_plan import SequencePlan, sequence_plan

START = '{name: "START" control [{kind: CONTROL_SEQUENCE_START int32_false_true: [0, 1]}]}'
END = '{name: "END" control [{kind: CONTROL_SEQUENCE_END int32_false_true: [0, 1]}]}'
READY = '{name: "READY" control [{kind: CONTROL_SEQUENCE_READY int32_false_true: [0, 1]}]}'
CORRID = '{name: "CORRID" control [{kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_%s}]}'
DYNA = f"control_input [{START}, {END}, {READY}, {CORRID % 'UINT64'}]"
STATE = 'state [{input_name: "ACC_IN" output_name: "ACC_OUT" data_type: TYPE_INT32 dims: [1] %s}]'


def plan(text: str, max_batch_size: int = 0, name: str = "M") -> SequencePlan:
    return sequence_plan(text_format.Parse(text, mc.ModelSequenceBatching()), name, max_batch_size)


def test_the_dyna_sequence_plan_names_its_inputs_and_state() -> None:
    dyna = plan(f"max_sequence_idle_microseconds: 10000000 {DYNA} {STATE % ''}", 8)
    assert dyna.inputs == {"START": "INT32", "END": "INT32", "READY": "INT32",
                           "CORRID": "UINT64", "ACC_IN": "INT32"}  # fmt: skip
    assert dyna.state_outputs == ("ACC_OUT",)
    assert dyna.idle_seconds == 10.0
    assert plan(f"control_input [{START}]").idle_seconds == 1.0  # 0: Triton's default


FLAG_VALUES = [  # (start, end) -> START, END, READY as false (0) or true (1): the notes' table
    ((True, False), (1, 0, 1)),
    ((False, True), (0, 1, 1)),
    ((True, True), (1, 1, 1)),
    ((False, False), (0, 0, 1)),
]
FORMS = {  # field, its [false, true], the dtype
    "int32": ("int32_false_true: [5, 9]", (5, 9), np.int32),
    "fp32": ("fp32_false_true: [-1.5, 2.5]", (-1.5, 2.5), np.float32),
    "bool": ("bool_false_true: [false, true]", (False, True), np.bool_),
}


@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize("batched", [False, True])
@pytest.mark.parametrize(("flags", "expected"), FLAG_VALUES)
def test_control_values_follow_the_flags(
    form: str, batched: bool, flags: tuple[bool, bool], expected: tuple[int, ...]
) -> None:
    field, values, dtype = FORMS[form]
    controls = ", ".join(f'{{name: "{kind}" control [{{kind: CONTROL_SEQUENCE_{kind} {field}}}]}}'
                         for kind in ("START", "END", "READY"))  # fmt: skip
    tensors = plan(f"control_input [{controls}]", 8 if batched else 0).control_tensors(7, *flags)
    for kind, truth in zip(("START", "END", "READY"), expected, strict=True):
        array = tensors[kind]
        assert array.dtype == dtype and array.shape == ((1, 1) if batched else (1,))
        assert array.item() == values[truth]


CORRID_CASES = [("UINT64", 2**64 - 1, np.uint64), ("INT64", 2**63 - 1, np.int64),
                ("UINT32", 2**32 - 1, np.uint32), ("INT32", 2**31 - 1, np.int32)]  # fmt: skip


@pytest.mark.parametrize(("kind", "largest", "dtype"), CORRID_CASES)
@pytest.mark.parametrize("batched", [False, True])
def test_corrid_carries_an_int_id_in_its_type(kind: str, largest: int, dtype: type,
                                              batched: bool) -> None:  # fmt: skip
    model = plan(f"control_input [{CORRID % kind}]", 4 if batched else 0)
    for seq_id in (1000, largest):
        model.check_id(seq_id)
        array = model.control_tensors(seq_id, False, False)["CORRID"]
        assert array.dtype == dtype and array.shape == ((1, 1) if batched else (1,))
        assert int(array.item()) == seq_id
    with pytest.raises(InvalidInput) as refused:
        model.check_id(largest + 1)
    assert str(refused.value) == (f"sequence {largest + 1} does not fit control 'CORRID' "
                                  f"({kind}) of model 'M'")  # fmt: skip
    with pytest.raises(InvalidInput) as refused:
        model.check_id("1002")
    assert str(refused.value) == ("sequence batching control 'CORRID' data-type is 'BYTES', "
                                  f"but model 'M' expects '{kind}'")  # fmt: skip


def test_a_string_corrid_carries_the_ids_text() -> None:
    model = plan(f"control_input [{CORRID % 'STRING'}]", 8)
    model.check_id("1002")
    array = model.control_tensors("1002", True, False)["CORRID"]
    assert array.dtype == object and array.shape == (1, 1) and array.item() == "1002"
    with pytest.raises(InvalidInput) as refused:
        model.check_id(1002)
    assert str(refused.value) == ("sequence batching control 'CORRID' data-type is 'UINT64', "
                                  "but model 'M' expects 'BYTES'")  # fmt: skip


def _state(extra: str, data_type: str = "TYPE_INT32", dims: str = "[-1, 3]") -> str:
    return (f'state [{{input_name: "S" output_name: "S_OUT" data_type: {data_type} '
            f"dims: {dims} {extra}}}]")  # fmt: skip


@pytest.mark.parametrize(("text", "batched", "shape"), [
    (_state(""), False, (1, 3)),  # -1 dims as 1, as Triton shapes an uninitialised state
    (_state(""), True, (1, 1, 3)),
    (_state('initial_state [{data_type: TYPE_INT32 dims: [2, 3] zero_data: true name: "z"}]'),
     False, (2, 3)),
    (_state('initial_state [{data_type: TYPE_INT32 dims: [4, 3] zero_data: true name: "z"}]'),
     True, (1, 4, 3)),
])  # fmt: skip
def test_initial_states_are_zeros_of_their_shape(text: str, batched: bool,
                                                 shape: tuple[int, ...]) -> None:  # fmt: skip
    (spec,) = plan(text, 8 if batched else 0).states
    initial = spec.initial()
    assert initial.shape == shape and initial.dtype == np.int32 and not initial.any()
    assert spec.initial_bytes == initial.nbytes


def test_a_string_state_starts_as_empty_strings() -> None:
    (spec,) = plan(_state("", "TYPE_STRING", "[2]")).states
    assert spec.datatype == "BYTES" and spec.initial().tolist() == ["", ""]


def _controls(*entries: str) -> str:
    return f"control_input [{', '.join(entries)}]"


REFUSED = [
    (_controls('{name: "S" control [{kind: CONTROL_SEQUENCE_START}]}'),
     "sequence batching must specify either 'int32_false_true', 'fp32_false_true' or "
     "'bool_false_true' for CONTROL_SEQUENCE_START for M"),
    (_controls('{name: "S" control [{kind: CONTROL_SEQUENCE_END int32_false_true: [0, 1, 2]}]}'),
     "sequence batching control 'int32_false_true' must have exactly 2 entries for "
     "CONTROL_SEQUENCE_END for M"),
    (_controls('{name: "R" control [{kind: CONTROL_SEQUENCE_READY fp32_false_true: [0]}]}'),
     "sequence batching control 'fp32_false_true' must have exactly 2 entries for "
     "CONTROL_SEQUENCE_READY for M"),
    (_controls('{name: "S" control [{kind: CONTROL_SEQUENCE_START int32_false_true: [0, 1] '
               "fp32_false_true: [0, 1]}]}"),
     "sequence batching specifies more than one from 'int32_false_true', 'fp32_false_true' "
     "and 'bool_false_true' for CONTROL_SEQUENCE_START for M"),
    (_controls(START, START.replace('"START"', '"START2"')),
     "sequence batching specifies multiple CONTROL_SEQUENCE_START tensors for M"),
    (_controls(START, END.replace('"END"', '"START"')),
     "sequence batching control tensor 'START' is specified for multiple control kinds for M"),
    (_controls('{name: "X" control [{kind: CONTROL_SEQUENCE_START int32_false_true: [0, 1]}, '
               "{kind: CONTROL_SEQUENCE_END int32_false_true: [0, 1]}]}"),
     "sequence batching control tensor 'X' is specified for multiple control kinds for M"),
    (_controls('{control [{kind: CONTROL_SEQUENCE_START int32_false_true: [0, 1]}]}'),
     "sequence batching control tensor must have a name for M"),
    (_controls('{name: "C" control [{kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 '
               "int32_false_true: [0, 1]}]}"),
     "sequence batching must not specify either 'int32_false_true', 'fp32_false_true' or "
     "'bool_false_true' for CONTROL_SEQUENCE_CORRID for M"),
    (_controls(CORRID % "FP32"),
     "unexpected data type for control CONTROL_SEQUENCE_CORRID for M. Allowed data types are "
     "TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 and TYPE_STRING"),
    (_controls(CORRID % "INVALID"),
     "unexpected data type for control CONTROL_SEQUENCE_CORRID for M. Allowed data types are "
     "TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 and TYPE_STRING"),
    (_controls(START) + ' state [{input_name: "START" output_name: "O" data_type: TYPE_INT32 '
     "dims: [1]}]", "State input name 'START' specified more than once."),
    ('state [{input_name: "S" output_name: "O" dims: [1]}]',
     "sequence batching state 'S' must give input_name, output_name, data_type and dims (each "
     "-1 or more) for M"),
    (_state("", dims="[-2]"),
     "sequence batching state 'S' must give input_name, output_name, data_type and dims (each "
     "-1 or more) for M"),
    (_state('initial_state [{data_type: TYPE_INT32 dims: [1, 3] zero_data: true name: "a"}, '
            '{data_type: TYPE_INT32 dims: [1, 3] zero_data: true name: "b"}]'),
     "initial_state field for state input 'S' must contain exactly one or zero element. "
     "Found '2' elements."),
    (_state('initial_state [{data_type: TYPE_FP32 dims: [1, 3] zero_data: true name: "a"}]'),
     "The data type used for 'initial_state' field of state 'S' does not match the state data "
     "type."),
    (_state("initial_state [{data_type: TYPE_INT32 dims: [1, 3] zero_data: true}]"),
     "Field 'name' must be set when using initial_state for state input 'S'."),
    (_state('initial_state [{data_type: TYPE_INT32 dims: [3] zero_data: true name: "a"}]'),
     "Number of dimensions in 'initial_state' doesn't match the size of 'state' dimensions for "
     "state input 'S'. 1 != 2"),
    (_state('initial_state [{data_type: TYPE_INT32 dims: [-1, 3] zero_data: true name: "a"}]'),
     "'initial_state' field for state input name 'S' contains variable dimensions."),
    (_state('initial_state [{data_type: TYPE_INT32 dims: [1, 4] zero_data: true name: "a"}]'),
     "'initial_state' dim for input name 'S' doesn't match 'state' dim description. 4 != 3"),
    (_state('initial_state [{data_type: TYPE_INT32 dims: [1, 3] name: "a"}]'),
     "initial_state setting expects state'S' to have state_data set"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "message"), REFUSED)
def test_a_wrong_configuration_is_refused_with_tritons_text(text: str, message: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        plan(text)
    assert str(refused.value) == message


@pytest.mark.parametrize(("text", "message"), [
    (_state('initial_state [{data_type: TYPE_INT32 dims: [1, 3] data_file: "../x" name: "a"}]'),
     "initial_state data_file is not supported (state input 'S'): give zero_data instead"),
    (f"iterative_sequence: true {DYNA}", "iterative sequences are not supported, for M"),
])  # fmt: skip
def test_what_opserve_does_not_offer_is_unsupported(text: str, message: str) -> None:
    with pytest.raises(Unsupported) as refused:
        plan(text)
    assert str(refused.value) == message


def test_a_batching_sequence_model_takes_one_request_a_batch() -> None:
    batched = plan(DYNA, 8)
    batched.check_batch({"INPUT": np.zeros((1, 1), np.int32)})
    with pytest.raises(InvalidInput) as refused:
        batched.check_batch({"INPUT": np.zeros((2, 1), np.int32)})
    assert str(refused.value) == ("inference request to model 'M' must specify batch-size 1 due "
                                  "to requirements of sequence batcher")  # fmt: skip
    plan(DYNA, 0).check_batch({"INPUT": np.zeros((2, 1), np.int32)})  # no batch dim to check
