"""A request's tensors against a repository model's completed configuration (pure numpy).

`request_io` compiles the config once per loaded model; per request, `graph_inputs` checks the
client's inputs as Triton's InferenceRequest::Normalize does, with its texts, and reshapes them
to what the graph takes (`reshape`, batch dim kept); `client_outputs` turns what the graph made
back into the config's `dims`; `output_names` resolves the requested outputs. Sequence control
and implicit-state inputs are not config inputs: the server fills them, a client may not.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from service.codecs.dtypes import ElementType, element_type_of
from service.codecs.v2_types import datatype_of
from service.errors import InvalidInput, ServiceError
from service.runtime.config.messages import dims_text, element_of, protocol_name, shown
from service.runtime.graph import TensorSpec

_BATCH_NOTE = (
    "NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension to "
    "be prepended to each input shape. If you want to specify the full shape including the "
    "batch dim in your input dims config, try setting max_batch_size to zero. See the model "
    "configuration docs for more info on max_batch_size."
)
_SHOWN_NAMES = 20


@dataclass(frozen=True)
class TensorIO:
    """One config input or output, as requests need it."""

    name: str
    element: ElementType
    datatype: str  # the V2 name, as Triton's texts write it: INT32, BYTES
    dims: tuple[int, ...]  # batch dim excluded; -1 is any size
    graph_shape: tuple[int, ...] | None  # what the graph has instead: reshape, or () for a
    # scalar graph tensor (onnxruntime backend); None when it is `dims`
    optional: bool = False


@dataclass(frozen=True)
class RequestIO:
    """A model's inputs and outputs as its configuration declares them, in config order."""

    model: str
    max_batch_size: int
    inputs: Mapping[str, TensorIO]
    outputs: Mapping[str, TensorIO]

    def graph_inputs(self, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The client's inputs (batch dim first when max_batch_size > 0) checked against the
        config and reshaped for the graph; InvalidInput with Triton's texts."""
        self._check_count(arrays)
        self._check_batch(arrays)
        return {name: self._graph_input(self.inputs[name], array)
                for name, array in arrays.items()}  # fmt: skip

    def output_names(self, requested: Sequence[str] | None) -> list[str]:
        """The outputs to answer with: every config output in config order when the client
        names none, else the named ones (each once, in the client's order)."""
        if requested is None:
            return list(self.outputs)
        for name in requested:
            if name not in self.outputs:
                raise InvalidInput(f"unexpected inference output '{shown(name)}' for model "
                                   f"'{shown(self.model)}'")  # fmt: skip
        return list(dict.fromkeys(requested))

    def client_outputs(self, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """What the graph made, reshaped from each output's `reshape` back to its `dims`."""
        return {name: self._client_output(name, array) for name, array in arrays.items()}

    def metadata(self) -> dict[str, list[dict[str, Any]]]:
        """Model metadata's "inputs" and "outputs" as Triton derives them from the config:
        name, datatype, shape (-1 batch dim first when max_batch_size > 0)."""
        batch = [-1] if self.max_batch_size > 0 else []
        return {
            role: [{"name": t.name, "datatype": t.datatype, "shape": [*batch, *t.dims]}
                   for t in tensors.values()]
            for role, tensors in (("inputs", self.inputs), ("outputs", self.outputs))
        }  # fmt: skip

    def _check_count(self, arrays: Mapping[str, np.ndarray]) -> None:
        """Triton counts the inputs first, then names each; after both, a required input
        left out for an optional one (which Triton lets through) is refused the same way."""
        required = [t.name for t in self.inputs.values() if not t.optional]
        if len(required) <= len(arrays) <= len(self.inputs):
            for name in arrays:
                if name not in self.inputs:
                    raise InvalidInput(f"unexpected inference input '{shown(name)}' for model "
                                       f"'{shown(self.model)}'")  # fmt: skip
            if all(name in arrays for name in required):
                return
        missing = [name for name in required if name not in arrays]
        expected = f"{len(self.inputs)} inputs" if len(required) == len(self.inputs) else (
            f"number of inputs between {len(required)} and {len(self.inputs)}")  # fmt: skip
        raise InvalidInput(f"expected {expected} but got {len(arrays)} inputs for model "
                           f"'{shown(self.model)}'. Got input(s) {_names(list(arrays))}, but "
                           f"missing required input(s) {_names(missing)}. Please provide all "
                           "required input(s).")  # fmt: skip

    def _check_batch(self, arrays: Mapping[str, np.ndarray]) -> None:
        """Every input's first dim is the batch: the same for all (Triton takes the first
        non-zero one) and at most max_batch_size."""
        if self.max_batch_size == 0:
            return
        batch = 0
        for name, array in arrays.items():
            if array.ndim == 0:
                raise InvalidInput(f"input '{shown(name)}' has no shape but model requires "
                                   f"batch dimension for '{shown(self.model)}'")  # fmt: skip
            if batch == 0:
                batch = array.shape[0]
            elif array.shape[0] != batch:
                raise InvalidInput(f"input '{shown(name)}' batch size does not match other "
                                   f"inputs for '{shown(self.model)}'")  # fmt: skip
        if batch > self.max_batch_size:
            raise InvalidInput(f"inference request batch-size must be <= {self.max_batch_size} "
                               f"for '{shown(self.model)}'")  # fmt: skip

    def _graph_input(self, spec: TensorIO, array: np.ndarray) -> np.ndarray:
        sent = element_type_of(array)
        if sent.enum != spec.element.enum:
            raise InvalidInput(f"inference input '{shown(spec.name)}' data-type is "
                               f"'{datatype_of(sent)}', but model '{shown(self.model)}' "
                               f"expects '{spec.datatype}'")  # fmt: skip
        lead = array.shape[:1] if self.max_batch_size > 0 else ()
        shape = array.shape[len(lead) :]
        if not _fits(shape, spec.dims):
            expected = (-1, *spec.dims) if lead else spec.dims
            note = _BATCH_NOTE if lead else ""
            raise InvalidInput(f"unexpected shape for input '{shown(spec.name)}' for model "
                               f"'{shown(self.model)}'. Expected {dims_text(expected)}, got "
                               f"{dims_text(array.shape)}. {note}")  # fmt: skip
        if spec.graph_shape is None:
            return array
        return array.reshape((*lead, *_filled(spec.graph_shape, _variable(shape, spec.dims))))

    def _client_output(self, name: str, array: np.ndarray) -> np.ndarray:
        spec = self.outputs.get(name)
        if spec is None or spec.graph_shape is None:
            return array
        lead = array.shape[:1] if self.max_batch_size > 0 else ()
        made = array.shape[len(lead) :]
        if (self.max_batch_size > 0 and array.ndim == 0) or not _fits(made, spec.graph_shape):
            raise ServiceError(f"model '{shown(self.model)}' made output '{shown(name)}' of "
                               f"shape {dims_text(array.shape)}, which does not fit its "
                               f"configured reshape {dims_text(spec.graph_shape)}")  # fmt: skip
        return array.reshape((*lead, *_filled(spec.dims, _variable(made, spec.graph_shape))))


def request_io(config: Any, graph_inputs: Sequence[TensorSpec] = (),
               graph_outputs: Sequence[TensorSpec] = ()) -> RequestIO:  # fmt: skip
    """Compile a completed config (model_config.complete_config) for requests; the graph's
    tensors tell which config tensors are scalars in the graph."""
    scalars = {s.name for s in (*graph_inputs, *graph_outputs) if s.shape == ()}
    return RequestIO(
        model=config.name,
        max_batch_size=config.max_batch_size,
        inputs={io.name: _tensor(io, scalars, io.optional) for io in config.input},
        outputs={io.name: _tensor(io, scalars, False) for io in config.output},
    )


def _tensor(io: Any, scalars: set[str], optional: bool) -> TensorIO:
    element = element_of(io.data_type)
    if element is None:  # complete_config refuses TYPE_INVALID
        raise InvalidInput(f"'{shown(io.name)}' has no data_type")
    graph_shape = tuple(io.reshape.shape) if io.HasField("reshape") else (
        () if io.name in scalars else None)  # fmt: skip
    return TensorIO(io.name, element, protocol_name(io.data_type), tuple(io.dims), graph_shape,
                    optional)  # fmt: skip


def _fits(shape: tuple[int, ...], dims: tuple[int, ...]) -> bool:
    return len(shape) == len(dims) and all(d in (-1, s) for s, d in zip(shape, dims, strict=True))


def _variable(shape: tuple[int, ...], dims: tuple[int, ...]) -> list[int]:
    """The sizes `shape` gives the variable (-1) dims, in order."""
    return [s for s, d in zip(shape, dims, strict=True) if d == -1]


def _filled(dims: tuple[int, ...], sizes: list[int]) -> tuple[int, ...]:
    """`dims` with its -1 dims taken, in order, from `sizes` (Triton's reshape rule)."""
    given = iter(sizes)
    return tuple(next(given) if d == -1 else d for d in dims)


def _names(names: list[str]) -> str:
    """Triton's ['A','B'], cut after 20 names (a client can send many)."""
    shown_names = [f"'{shown(name)}'" for name in names[:_SHOWN_NAMES]]
    more = ",..." if len(names) > _SHOWN_NAMES else ""
    return "[" + ",".join(shown_names) + more + "]"
