"""A model's sequence_batching, validated at load into a plan: the control tensors (START, END,
READY, CORRID) and implicit states every request of the model is given (sequences.py keeps
the sequences themselves).

Validation follows Triton's texts (core model_config_utils.cc GetBooleanSequenceControlProperties
and GetTypedSequenceControlProperties, sequence_batch_scheduler.cc GenerateInitialStateData);
the tensors follow SetControlTensors: shape [1], or [1, 1] when the model batches. Where
Triton leaves a state without initial_state uninitialised we give zeros: same shape, and no
other sequence's memory shows through. initial_state data_file is refused (Unsupported).

How many sequences a model holds at once is Triton's number of sequence slots (core
SequenceBatchScheduler::Create): per instance, `oldest.max_candidate_sequences` when the
config gives one, else max(1, max_batch_size); times the model's instance count. Triton puts
the sequences past them in a backlog; we refuse them (sequences.py).
"""

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from service.codecs.v2_types import from_datatype
from service.errors import InvalidInput, Unsupported

if TYPE_CHECKING:  # the message type only: importing tritonclient.grpc imports grpc
    from tritonclient.grpc.model_config_pb2 import ModelSequenceBatching
else:
    ModelSequenceBatching = Any

IDLE_DEFAULT_US = 1_000_000  # Triton's SEQUENCE_IDLE_DEFAULT_MICROSECONDS
FLAG_FIELDS = {"int32_false_true": "INT32", "fp32_false_true": "FP32", "bool_false_true": "BOOL"}
CORRID_TYPES = ("TYPE_UINT64", "TYPE_INT64", "TYPE_UINT32", "TYPE_INT32", "TYPE_STRING")


@dataclass(frozen=True, slots=True)
class Control:
    """A control tensor: START, END or READY with its [false, true] values, or CORRID."""

    name: str
    kind: str  # "START", "END", "READY", "CORRID"
    datatype: str  # V2 name: "INT32", "FP32", "BOOL"; CORRID: "UINT64", ..., "BYTES"
    values: tuple[Any, Any] = (None, None)


@dataclass(frozen=True, slots=True)
class StateSpec:
    """One implicit state: `output_name` of a request feeds `input_name` of the next."""

    input_name: str
    output_name: str
    datatype: str
    initial_shape: tuple[int, ...]  # the batch dim included when the model batches

    @property
    def initial_bytes(self) -> int:
        """Bytes of the initial state (strings counted as empty)."""
        return math.prod(self.initial_shape) * from_datatype(self.datatype).np_dtype.itemsize

    def initial(self) -> np.ndarray:
        """The initial state: zeros (empty strings for BYTES)."""
        if self.datatype == "BYTES":
            return np.full(self.initial_shape, "", dtype=object)
        return np.zeros(self.initial_shape, from_datatype(self.datatype).np_dtype)


@dataclass(frozen=True, slots=True)
class SequencePlan:
    """A validated sequence_batching: what every request of the model is given and keeps."""

    model_name: str
    batched: bool  # max_batch_size > 0: controls are [1, 1], a request's batch must be 1
    idle_seconds: float
    controls: tuple[Control, ...]
    states: tuple[StateSpec, ...]
    max_live: int = 1  # Triton's sequence slots: most live sequences of the model at once
    max_live_source: str = "1 instance x 1 sequence slot"  # where max_live came from, for texts

    @property
    def inputs(self) -> dict[str, str]:
        """The control and state inputs the model's graph must take, with their V2 datatypes."""
        found = {control.name: control.datatype for control in self.controls}
        found.update((state.input_name, state.datatype) for state in self.states)
        return found

    @property
    def state_bytes(self) -> int:
        """Bytes of the initial states: what a new sequence will keep (strings counted empty)."""
        return sum(state.initial_bytes for state in self.states)

    @property
    def state_outputs(self) -> tuple[str, ...]:
        """Outputs that are state: left out of the answer unless the config lists them."""
        return tuple(state.output_name for state in self.states)

    def check_batch(self, inputs: Mapping[str, np.ndarray]) -> None:
        """Refuse a batch of more than one request, as Triton's sequence batcher does."""
        if self.batched and any(a.ndim == 0 or a.shape[0] != 1 for a in inputs.values()):
            raise InvalidInput(f"inference request to model '{self.model_name}' must specify "
                               "batch-size 1 due to requirements of sequence batcher")  # fmt: skip

    def check_id(self, seq_id: int | str) -> None:
        """Refuse an id the CORRID control cannot carry (Triton's text for the wrong kind)."""
        corrid = next((c for c in self.controls if c.kind == "CORRID"), None)
        if corrid is None:
            return
        got = "BYTES" if isinstance(seq_id, str) else "UINT64"
        if (got == "BYTES") != (corrid.datatype == "BYTES"):
            raise InvalidInput(f"sequence batching control '{corrid.name}' data-type is '{got}', "
                               f"but model '{self.model_name}' expects '{corrid.datatype}'")  # fmt: skip
        dtype = from_datatype(corrid.datatype).np_dtype
        if isinstance(seq_id, int) and seq_id > np.iinfo(dtype).max:
            raise InvalidInput(f"sequence {seq_id} does not fit control '{corrid.name}' "
                               f"({corrid.datatype}) of model '{self.model_name}'")  # fmt: skip

    def control_tensors(self, seq_id: int | str, start: bool, end: bool) -> dict[str, np.ndarray]:
        """The control inputs of one request (READY is true: nothing is padding here)."""
        shape = (1, 1) if self.batched else (1,)
        flags = {"START": start, "END": end, "READY": True}
        found = {}
        for c in self.controls:
            value = seq_id if c.kind == "CORRID" else c.values[flags[c.kind]]
            dtype = from_datatype(c.datatype).np_dtype
            found[c.name] = np.full(shape, value, dtype=dtype)
        return found


def sequence_plan(batching: ModelSequenceBatching, model_name: str, max_batch_size: int,
                  instances: int = 1) -> SequencePlan:  # fmt: skip
    """Validate a model's sequence_batching at load, with Triton's texts (InvalidInput; what
    opserve does not offer: Unsupported). `instances`: the model's instance count (the
    instance_group counts summed), which multiplies its sequence slots."""
    if batching.iterative_sequence:
        raise Unsupported(f"iterative sequences are not supported, for {model_name}")
    controls = _controls(batching, model_name)
    batched = max_batch_size > 0
    states = tuple(_state(state, model_name, batched) for state in batching.state)
    taken = {c.name for c in controls}
    for state in states:
        if state.input_name in taken:
            raise InvalidInput(f"State input name '{state.input_name}' specified more than once.")
        taken.add(state.input_name)
    idle = (batching.max_sequence_idle_microseconds or IDLE_DEFAULT_US) / 1e6
    slots, source = _slots(batching, max_batch_size)
    instances = max(1, instances)
    return SequencePlan(model_name, batched, idle, controls, states, instances * slots,
                        f"{instances} instance{'s' * (instances > 1)} x {source}")  # fmt: skip


def _slots(batching: ModelSequenceBatching, max_batch_size: int) -> tuple[int, str]:
    """Sequence slots per instance and where the number came from (Triton's seq_slot_cnt_)."""
    if batching.HasField("oldest") and batching.oldest.max_candidate_sequences > 0:
        candidates = batching.oldest.max_candidate_sequences
        return candidates, f"oldest.max_candidate_sequences {candidates}"
    slots = max(1, max_batch_size)
    return slots, f"{slots} sequence slot{'s' * (slots > 1)} (max_batch_size {max_batch_size})"


def _controls(batching: ModelSequenceBatching, model: str) -> tuple[Control, ...]:
    found: dict[str, Control] = {}
    seen: set[str] = set()
    for control_input in batching.control_input:
        name = control_input.name
        if not name:
            raise InvalidInput(f"sequence batching control tensor must have a name for {model}")
        if name in seen or len(control_input.control) > 1:
            raise InvalidInput(f"sequence batching control tensor '{name}' is specified for "
                               f"multiple control kinds for {model}")  # fmt: skip
        seen.add(name)
        for control in control_input.control:
            kind = _enum_name(control, "kind")
            short = kind.removeprefix("CONTROL_SEQUENCE_")
            if short in found:
                raise InvalidInput(
                    f"sequence batching specifies multiple {kind} tensors for {model}"
                )
            given = [f for f in FLAG_FIELDS if len(getattr(control, f))]
            found[short] = (_corrid(name, control, given, model) if short == "CORRID"
                            else _flag(name, control, given, kind, model))  # fmt: skip
    return tuple(found.values())


def _flag(name: str, control: Any, given: list[str], kind: str, model: str) -> Control:
    if not given:
        raise InvalidInput("sequence batching must specify either 'int32_false_true', "
                           f"'fp32_false_true' or 'bool_false_true' for {kind} for {model}")  # fmt: skip
    if len(given) > 1:
        raise InvalidInput("sequence batching specifies more than one from 'int32_false_true', "
                           f"'fp32_false_true' and 'bool_false_true' for {kind} for {model}")  # fmt: skip
    values = list(getattr(control, given[0]))
    if len(values) != 2:
        raise InvalidInput(f"sequence batching control '{given[0]}' must have exactly 2 entries "
                           f"for {kind} for {model}")  # fmt: skip
    short = kind.removeprefix("CONTROL_SEQUENCE_")
    return Control(name, short, FLAG_FIELDS[given[0]], (values[0], values[1]))


def _corrid(name: str, control: Any, given: list[str], model: str) -> Control:
    if given:
        raise InvalidInput("sequence batching must not specify either 'int32_false_true', "
                           "'fp32_false_true' or 'bool_false_true' for CONTROL_SEQUENCE_CORRID "
                           f"for {model}")  # fmt: skip
    data_type = _enum_name(control, "data_type")
    if data_type not in CORRID_TYPES:
        raise InvalidInput(f"unexpected data type for control CONTROL_SEQUENCE_CORRID for {model}"
                           ". Allowed data types are TYPE_UINT64, TYPE_INT64, TYPE_UINT32, "
                           "TYPE_INT32 and TYPE_STRING")  # fmt: skip
    return Control(name, "CORRID", _datatype(data_type))


def _state(state: Any, model: str, batched: bool) -> StateSpec:
    name = state.input_name
    data_type = _enum_name(state, "data_type")
    dims = list(state.dims)
    given = bool(name and state.output_name) and data_type != "TYPE_INVALID"
    if not given or min(dims, default=0) < -1:
        raise InvalidInput(f"sequence batching state '{name}' must give input_name, output_name, "
                           f"data_type and dims (each -1 or more) for {model}")  # fmt: skip
    shape = [1 if d == -1 else d for d in dims]  # as Triton shapes an uninitialised state
    if len(state.initial_state) > 1:
        raise InvalidInput(f"initial_state field for state input '{name}' must contain exactly "
                           f"one or zero element. Found '{len(state.initial_state)}' elements.")  # fmt: skip
    if state.initial_state:
        shape = _initial_dims(state.initial_state[0], name, data_type, dims)
    return StateSpec(name, state.output_name, _datatype(data_type), (1,) * batched + tuple(shape))


def _initial_dims(initial: Any, name: str, data_type: str, dims: list[int]) -> list[int]:
    """The dims of a state's initial_state, checked as Triton's GenerateInitialStateData does."""
    if _enum_name(initial, "data_type") != data_type:
        raise InvalidInput(f"The data type used for 'initial_state' field of state '{name}' "
                           "does not match the state data type.")  # fmt: skip
    if not initial.name:
        raise InvalidInput("Field 'name' must be set when using initial_state for state input "
                           f"'{name}'.")  # fmt: skip
    given = list(initial.dims)
    if len(given) != len(dims):
        raise InvalidInput("Number of dimensions in 'initial_state' doesn't match the size of "
                           f"'state' dimensions for state input '{name}'. {len(given)} != "
                           f"{len(dims)}")  # fmt: skip
    for have, want in zip(given, dims, strict=True):
        if have < 0:
            raise InvalidInput(f"'initial_state' field for state input name '{name}' contains "
                               "variable dimensions.")  # fmt: skip
        if want != -1 and have != want:
            raise InvalidInput(f"'initial_state' dim for input name '{name}' doesn't match "
                               f"'state' dim description. {have} != {want}")  # fmt: skip
    source = initial.WhichOneof("state_data")
    if source == "data_file":
        raise Unsupported(f"initial_state data_file is not supported (state input '{name}'): "
                          "give zero_data instead")  # fmt: skip
    if source is None:
        raise InvalidInput(f"initial_state setting expects state'{name}' to have state_data set")
    return given


def _enum_name(message: Any, field: str) -> str:
    """The name of an enum field's value, read from the message's own descriptor."""
    enum = message.DESCRIPTOR.fields_by_name[field].enum_type
    value = enum.values_by_number.get(getattr(message, field))
    return "TYPE_INVALID" if value is None else value.name


def _datatype(data_type: str) -> str:
    """TYPE_UINT64 -> UINT64, TYPE_STRING -> BYTES (Triton's DataTypeToProtocolString)."""
    name = data_type.removeprefix("TYPE_")
    return "BYTES" if name == "STRING" else name
