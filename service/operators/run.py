"""Run one node: check inputs against the version's type constraints, call the kernel."""

from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx.defs

from service.codecs.dtypes import element_type_of
from service.errors import InvalidInput, ServiceError
from service.kernels.context import KernelContext
from service.operators.registry import OpVersion

_OPTIONAL = onnx.defs.OpSchema.FormalParameterOption.Optional


def run(
    op: OpVersion,
    inputs: Mapping[str, np.ndarray | None],
    attributes: Mapping[str, Any],
    ctx: KernelContext,
) -> dict[str, np.ndarray]:
    """Run `op` on decoded inputs and attributes; outputs keyed by formal name."""
    check_inputs(op, inputs)
    args = [inputs.get(name) for name in op.inputs]
    try:
        outputs = op.kernel(*args, ctx=ctx, **attributes)
    except ServiceError as exc:
        exc.detail = f"{op.name}: {exc.detail}"
        raise
    check_outputs(op, outputs)
    return dict(zip(op.outputs, outputs, strict=True))


def check_inputs(op: OpVersion, inputs: Mapping[str, np.ndarray | None]) -> None:
    """Refuse unknown or missing inputs and types outside the version's constraints."""
    unknown = sorted(set(inputs) - set(op.inputs))
    if unknown:
        raise InvalidInput(f"{op.name} has no input {', '.join(map(repr, unknown))}; "
                           f"its inputs are {op.inputs}", loc=("inputs", unknown[0]))  # fmt: skip
    bound: dict[str, tuple[str, str]] = {}
    for formal in op.schema.inputs:
        array = inputs.get(formal.name)
        if array is None:
            if formal.option != _OPTIONAL:
                raise InvalidInput(f"{op.name} needs input {formal.name!r}",
                                   loc=("inputs", formal.name))  # fmt: skip
            continue
        type_str = element_type_of(array).type_str
        if type_str in op.extra_input_types.get(formal.name, ()):
            continue
        _check_type(op, formal, type_str, ("inputs", formal.name))
        param = formal.type_str
        if param in bound and bound[param][1] != type_str:
            other, other_type = bound[param]
            raise InvalidInput(
                f"{op.name}: inputs {other!r} ({other_type}) and {formal.name!r} ({type_str}) "
                f"must have the same type {param}",
                loc=("inputs", formal.name),
            )
        bound[param] = (formal.name, type_str)


def check_outputs(op: OpVersion, outputs: tuple[np.ndarray, ...]) -> None:
    """Refuse an output type the version does not allow (e.g. a bfloat16 `value` at v9)."""
    for formal, array in zip(op.schema.outputs, outputs, strict=True):
        _check_type(op, formal, element_type_of(array).type_str, ("outputs", formal.name))


def _check_type(
    op: OpVersion, formal: onnx.defs.OpSchema.FormalParameter, type_str: str, loc: tuple
) -> None:
    allowed = op.allowed_types(formal)
    if type_str not in allowed:
        names = ", ".join(sorted(t[7:-1] for t in allowed))
        raise InvalidInput(
            f"{op.name} does not accept {type_str[7:-1]} for {loc[0][:-1]} {formal.name!r} "
            f"(type {formal.type_str} allows: {names})",
            loc=loc,
        )
