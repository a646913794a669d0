"""Every operator version as a V2 model: name = op_type, version = since_version."""

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from functools import cache
from typing import Any

import numpy as np

from api_schemas.v2 import Parameter
from service.codecs.v2_types import datatype_of_onnx_name, from_datatype
from service.core.model import model_parameters, select_outputs
from service.core.parameters import attribute_type, kernel_attributes, tensor_attributes
from service.errors import NotFound, ServiceError
from service.kernels.context import KernelContext
from service.operators import registry
from service.operators.registry import Formal, OpVersion
from service.operators.run import run
from service.runtime.config.json_form import config_json
from service.runtime.config.messages import ModelConfig, config_type_of

PLATFORM = "onnx_operator"
_NEVER_DRAINED = nullcontext()  # reusable: it holds nothing
_PREFERRED = ("FP32", "INT64")  # the datatype metadata shows first, where the tensor allows it
# Shapes onnx.defs does not state but the operators fix; any other tensor shows [-1]: any shape.
_SHAPES = {("Tile", "repeats"): (-1,), ("Shape", "shape"): (-1,),
           ("ConstantOfShape", "input"): (-1,), ("ConstantOfShape", "value"): (1,)}  # fmt: skip


class OperatorModel:
    """A V2 model that runs one node of an operator version on our kernels."""

    ready = True
    reason = None
    inline = True  # its kernels size their outputs before allocating (RunOffLoop when large)
    max_batch_size = 0  # a node has no batch dimension
    plan = None  # nor sequences

    def labels(self, output: str) -> None:
        return None

    def batch_size(self, inputs: Mapping[str, np.ndarray]) -> int:
        return 1

    def serving(self) -> AbstractContextManager[None]:
        return _NEVER_DRAINED  # an operator version is never unloaded

    def __init__(self, op: OpVersion) -> None:
        self.op = op
        self.name = op.op_type
        self.version = op.since_version
        self.label: str | None = op.name
        self.tensor_attributes = tensor_attributes(op)

    def config(self) -> dict[str, Any]:
        """A configuration derived from the schema, in Triton's form: every formal input and
        output (and tensor attribute input) with the datatype metadata shows first and dims
        [-1] (any shape: a node has no fixed rank), the attributes as `parameters`."""
        config = ModelConfig(name=self.name, platform=PLATFORM, backend="opserve",
                             max_batch_size=0)  # fmt: skip
        config.version_policy.all.SetInParent()  # every since_version is served
        metadata = self.metadata()
        for role, target in (("inputs", config.input), ("outputs", config.output)):
            for tensor in metadata[role]:
                entry = target.add(name=tensor["name"], dims=tensor["shape"])
                entry.data_type = config_type_of(from_datatype(tensor["datatype"]).enum)
                if role == "inputs" and tensor.get("optional"):
                    entry.optional = True
        for attribute in metadata["attributes"]:
            required = "required" if attribute["required"] else "optional"
            config.parameters[attribute["name"]].string_value = (
                f"{attribute['type']} attribute, {required}, travels as {attribute['travels_as']}")  # fmt: skip
        return config_json(config)

    def metadata(self) -> dict[str, Any]:
        op = self.op
        inputs = [self._tensor(f) for f in op.formal_inputs]
        for name in sorted(self.tensor_attributes):  # a tensor attribute gives the output type
            types = _datatypes(op.formal_outputs[0].types)
            inputs.append({"name": name, "datatype": types[0], "datatypes": types,
                           "shape": list(_SHAPES.get((self.name, name), (-1,))),
                           "optional": not op.schema.attributes[name].required})  # fmt: skip
        attributes = [
            {"name": name, "type": attribute_type(op, name), "required": attr.required,
             "travels_as": "input" if name in self.tensor_attributes else "parameter"}
            for name, attr in sorted(op.schema.attributes.items())
        ]  # fmt: skip
        return {"name": self.name, "versions": [str(v) for v in _versions(self.name)],
                "platform": PLATFORM, "inputs": inputs,
                "outputs": [self._tensor(f) for f in op.formal_outputs],
                "attributes": attributes}  # fmt: skip

    def _tensor(self, formal: Formal) -> dict[str, Any]:
        datatypes = _datatypes(formal.types | formal.unbound_types)
        shape = list(_SHAPES.get((self.name, formal.name), (-1,)))
        entry: dict[str, Any] = {"name": formal.name, "datatype": datatypes[0], "shape": shape,
                                 "datatypes": datatypes}  # fmt: skip
        if formal.optional:
            entry["optional"] = True
        return entry

    def infer(
        self,
        inputs: Mapping[str, np.ndarray],
        parameters: Mapping[str, Parameter],
        outputs: Sequence[str] | None,
        ctx: KernelContext,
        turn: Any = None,
    ) -> dict[str, np.ndarray]:
        tensors: Mapping[str, np.ndarray] = {}
        node_inputs = inputs
        if self.tensor_attributes:  # Constant's `value` and the like travel as inputs
            tensors = {k: v for k, v in inputs.items() if k in self.tensor_attributes}
            node_inputs = {k: v for k, v in inputs.items() if k not in self.tensor_attributes}
        try:
            meant = model_parameters(parameters) if parameters else {}
            attributes = kernel_attributes(self.op, meant, tensors)
        except ServiceError as exc:
            exc.operator = exc.operator or self.op.name
            raise
        return select_outputs(run(self.op, node_inputs, attributes, ctx), outputs)


def _datatypes(types: frozenset[str]) -> list[str]:
    """The V2 names of `types`, a preferred one first, then the rest in name order."""
    names = sorted(datatype_of_onnx_name(t) for t in types)
    first = next((n for n in _PREFERRED if n in names), names[0])
    return [first, *(n for n in names if n != first)]


@cache
def _versions(op_type: str) -> tuple[int, ...]:
    return tuple(op.since_version for _, name, ops in registry.operators() if name == op_type
                 for op in ops)  # fmt: skip


@cache
def _model(op_type: str, since_version: int) -> OperatorModel:
    return OperatorModel(registry.resolve(op_type, since_version))


def operator_model(name: str, version: int | None) -> OperatorModel:
    """The model of an operator version; a version that is not a since_version is unknown."""
    op = registry.resolve(name, version)  # NotFound for unknown operators and early opsets
    if version is not None and op.since_version != version:
        raise NotFound(f"{name} has no version {version}; its versions are "
                       f"{', '.join(map(str, _versions(name)))}")  # fmt: skip
    return _model(op.op_type, op.since_version)
