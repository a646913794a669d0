"""The catalog of served operator versions, generated from the registry and onnx.defs."""

import sys
from collections.abc import Iterable

import onnx.defs
from onnx import helper

from api_schemas.catalog import (
    AttributeInfo,
    Catalog,
    FormalParameter,
    OperatorSummary,
    OperatorVersion,
    TypeConstraint,
)
from service.errors import NotFound
from service.operators import registry
from service.operators.registry import OpVersion

_OPTIONAL = onnx.defs.OpSchema.FormalParameterOption.Optional


def catalog() -> Catalog:
    """Every served operator with its versions."""
    return Catalog(
        operators=[
            OperatorSummary(
                op_type=op_type,
                domain=domain,
                versions=[v.since_version for v in vs],
                newest=vs[-1].since_version,
            )
            for domain, op_type, vs in registry.operators()
        ]
    )


def describe(op: OpVersion) -> OperatorVersion:
    """The formal signature of one version, as onnx.defs states it."""
    return OperatorVersion(
        op_type=op.op_type,
        domain=op.domain,
        version=op.since_version,
        inputs=[_formal(op, p) for p in op.schema.inputs],
        outputs=[_formal(op, p) for p in op.schema.outputs],
        attributes=[_attribute(op, a) for a in op.schema.attributes.values()],
        type_constraints=[
            TypeConstraint(type_param=c.type_param_str, types=_names(c.allowed_type_strs))
            for c in op.schema.type_constraints
        ],
        description=summary(op),
    )


def summary(op: OpVersion) -> str:
    """Our description of the operator (the module doc of its wire models), and what this
    version changed."""
    module = sys.modules[op.request.__module__]
    return f"{(module.__doc__ or '').strip()}\n\n{what_changed(op)}"


def what_changed(op: OpVersion) -> str:
    """What this version adds to the one before it, derived from onnx.defs."""
    try:
        previous = registry.resolve(op.op_type, op.since_version - 1, op.domain)
    except NotFound:
        return f"{op.name} is the first version."
    changes = []
    if op.inputs != previous.inputs:
        changes.append(f"inputs {', '.join(op.inputs)} (were {', '.join(previous.inputs)})")
    added = sorted(set(op.schema.attributes) - set(previous.schema.attributes))
    if added:
        changes.append(f"new attributes {', '.join(added)}")
    types = _all_types(op) - _all_types(previous)
    if types:
        changes.append(f"new element types {', '.join(sorted(types))}")
    return f"Changes from {previous.name}: {'; '.join(changes) or 'none'}."


def _all_types(op: OpVersion) -> set[str]:
    return {t for formal in op.formal_inputs + op.formal_outputs for t in formal.types}


def _formal(op: OpVersion, param: onnx.defs.OpSchema.FormalParameter) -> FormalParameter:
    types = set(op.allowed_types(param)) | set(op.extra_input_types.get(param.name, ()))
    return FormalParameter(name=param.name, type_param=param.type_str, types=_names(types),
                           optional=param.option == _OPTIONAL)  # fmt: skip


def _attribute(op: OpVersion, attr: onnx.defs.OpSchema.Attribute) -> AttributeInfo:
    default = None
    if attr.default_value.name:
        default = helper.get_attribute_value(attr.default_value)
    field = op.attributes.model_fields.get(attr.name)
    return AttributeInfo(name=attr.name, type=str(attr.type).rsplit(".", 1)[-1], required=attr.required,
                         default=default, description=(field.description or "") if field else "")  # fmt: skip


def _names(type_strs: Iterable[str]) -> list[str]:
    return sorted(t[len("tensor(") : -1] for t in type_strs)
