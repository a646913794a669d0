"""Repository models (service/runtime/repository.py) as V2 models.

Written against the repository's interface only (`RepositoryEntry`, `LoadedModel`,
`TensorSpec`): this module imports nothing from service.runtime, so it stands on its own.
"""

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from api_schemas.v2 import Parameter
from service.codecs.dtypes import by_enum, element_type_of
from service.codecs.v2_types import datatype_of
from service.core.model import model_parameters
from service.errors import InvalidInput, ModelNotReady, Unsupported
from service.kernels.context import KernelContext

PLATFORM = "onnx_graph"


class _Spec(Protocol):
    name: str
    elem_type: int
    shape: tuple[int | None, ...] | None


class RepositoryModel:
    """A V2 model over one `RepositoryEntry` of the model repository."""

    def __init__(self, entry: Any, versions: Sequence[int]) -> None:
        self.entry = entry
        self.name: str = entry.name
        self.version: int = entry.version
        self.versions = versions
        self.label = f"model {self.name!r} version {self.version}"

    inline = False  # a graph's outputs cannot be sized beforehand: always on a kernel thread
    max_batch_size = 0  # until model configuration lands

    def labels(self, output: str) -> Sequence[str] | None:
        return None

    @property
    def ready(self) -> bool:
        return self.entry.model is not None

    @property
    def reason(self) -> str | None:
        return None if self.entry.model is not None else self.entry.error or "not loaded"

    def config(self) -> dict[str, Any]:
        raise Unsupported("model configuration is being built")  # until model_config lands

    def metadata(self) -> dict[str, Any]:
        model = self.entry.model
        meta: dict[str, Any] = {"name": self.name, "versions": [str(v) for v in self.versions],
                                "platform": PLATFORM, "inputs": [], "outputs": []}  # fmt: skip
        if model is not None:
            meta["inputs"] = [_tensor(spec) for spec in model.inputs]
            meta["outputs"] = [_tensor(spec) for spec in model.outputs]
        return meta

    def infer(
        self,
        inputs: Mapping[str, np.ndarray],
        parameters: Mapping[str, Parameter],
        outputs: Sequence[str] | None,
        ctx: KernelContext,
    ) -> dict[str, np.ndarray]:
        model = self.entry.model
        if model is None:
            raise ModelNotReady(f"{self.label} is not ready: {self.reason}")
        extra = model_parameters(parameters)
        if extra:
            raise InvalidInput(f"the model takes no parameters, got {', '.join(sorted(extra))}",
                               loc=("parameters",))  # fmt: skip
        _check_inputs(model.inputs, inputs)
        return dict(model.run(inputs, outputs, ctx=ctx).outputs)


UNSET = 0  # TensorProto.UNDEFINED: the model leaves the element type open


def _tensor(spec: _Spec) -> dict[str, Any]:
    shape = [-1] if spec.shape is None else [-1 if d is None else d for d in spec.shape]
    datatype = "" if spec.elem_type == UNSET else datatype_of(by_enum(spec.elem_type))
    return {"name": spec.name, "datatype": datatype, "shape": shape}


def _check_inputs(specs: Sequence[_Spec], inputs: Mapping[str, np.ndarray]) -> None:
    by_name = {spec.name: spec for spec in specs}
    for name, array in inputs.items():
        spec = by_name.get(name)
        if spec is None:
            raise InvalidInput(f"no input {name[:100]!r}; the inputs are "
                               f"{', '.join(by_name)}", loc=("inputs", name))  # fmt: skip
        got = element_type_of(array)
        if spec.elem_type not in (UNSET, got.enum):
            want = datatype_of(by_enum(spec.elem_type))
            raise InvalidInput(f"input {name!r} must be {want}, not {datatype_of(got)}",
                               loc=("inputs", name))  # fmt: skip
    missing = [name for name in by_name if name not in inputs]
    if missing:
        raise InvalidInput(f"input {missing[0]!r} is required", loc=("inputs", missing[0]))
