"""Operator versions keyed by (domain, op_type, since_version), resolved by opset.

A kernel is registered once, at the version where behaviour changes; every later
since_version that onnx.defs lists for the operator (versions that only widen the type
list) is served by it, with that version's own type constraints from onnx.defs.
"""

import difflib
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import onnx
import onnx.defs
from pydantic import BaseModel

import service.kernels  # noqa: F401 - importing the package registers every kernel
from service.codecs.dtypes import dtypes_named
from service.errors import NotFound
from service.kernels.registrations import REGISTERED, Kernel
from service.operators.wire_models import wire_models


@dataclass(frozen=True)
class Formal:
    """A formal input or output: its name, type parameter and allowed element type names."""

    name: str
    type_param: str  # "T", or a fixed "tensor(int64)"
    types: frozenset[str]  # canonical dtype names
    unbound_types: frozenset[str]  # also accepted, without binding the type parameter
    optional: bool

    @cached_property
    def dtypes(self) -> frozenset[np.dtype]:
        """The numpy dtypes of `types` (element_type_of's), to check an array's type at once."""
        return dtypes_named(self.types)


@dataclass(frozen=True)
class OpVersion:
    """One served schema version of an operator."""

    domain: str
    op_type: str
    since_version: int
    kernel: Kernel
    attributes: type[BaseModel]
    request: type[BaseModel]
    schema: onnx.defs.OpSchema = field(repr=False)
    extra_input_types: dict[str, frozenset[str]] = field(default_factory=dict)

    @cached_property  # read several times per call
    def name(self) -> str:
        return f"{self.op_type}-{self.since_version}"

    @cached_property
    def version_label(self) -> str:
        """The schema version as statistics and metrics label it ("13")."""
        return str(self.since_version)

    @cached_property
    def inputs(self) -> list[str]:
        return [p.name for p in self.formal_inputs]

    @cached_property
    def outputs(self) -> list[str]:
        return [p.name for p in self.formal_outputs]

    @cached_property
    def formal_inputs(self) -> tuple["Formal", ...]:
        """The schema's inputs with their allowed element types, read once from onnx.defs."""
        return tuple(self._formal(p) for p in self.schema.inputs)

    @cached_property
    def formal_outputs(self) -> tuple["Formal", ...]:
        return tuple(self._formal(p) for p in self.schema.outputs)

    def _formal(self, param: onnx.defs.OpSchema.FormalParameter) -> "Formal":
        names = frozenset(t[len("tensor(") : -1] for t in self.allowed_types(param))
        extra = self.extra_input_types.get(param.name, frozenset())
        return Formal(param.name, param.type_str, names,
                      frozenset(t[len("tensor(") : -1] for t in extra),
                      param.option == onnx.defs.OpSchema.FormalParameterOption.Optional)  # fmt: skip

    @cached_property
    def _constraints(self) -> dict[str, frozenset[str]]:
        return {
            c.type_param_str: frozenset(c.allowed_type_strs) for c in self.schema.type_constraints
        }

    def allowed_types(self, formal: onnx.defs.OpSchema.FormalParameter) -> frozenset[str]:
        """The tensor(...) type strings a formal input or output may take."""
        fixed = frozenset({formal.type_str})  # a fixed type such as tensor(int64)
        return self._constraints.get(formal.type_str, fixed)


_SERVED: dict[tuple[str, str], dict[int, OpVersion]] = {}


def _schema_versions(domain: str, op_type: str) -> list[int]:
    return sorted(
        {
            s.since_version
            for s in onnx.defs.get_all_schemas_with_history()
            if s.name == op_type and s.domain == domain
        }
    )


def _served(domain: str, op_type: str) -> dict[int, OpVersion]:
    if (domain, op_type) not in _SERVED:
        registered = REGISTERED.get((domain, op_type), {})
        versions: dict[int, OpVersion] = {}
        for since in _schema_versions(domain, op_type):
            starts = [v for v in registered if v <= since]
            if not starts:
                continue
            reg = registered[max(starts)]
            attributes, request = wire_models(op_type, since)
            schema = onnx.defs.get_schema(op_type, since, domain)
            versions[since] = OpVersion(
                domain, op_type, since, reg.kernel, attributes, request, schema,
                reg.extra_input_types,
            )  # fmt: skip
        _SERVED[(domain, op_type)] = versions
    return _SERVED[(domain, op_type)]


NEWEST_OPSET = {"": onnx.defs.onnx_opset_version()}
"""The newest opset of each domain served, as the installed onnx defines it."""


def resolve(op_type: str, opset: int | None = None, domain: str = "") -> OpVersion:
    """The highest served since_version <= opset (the newest when opset is None)."""
    if (domain, op_type) not in REGISTERED:  # before _served: no cache entry per unknown name
        raise NotFound(unknown_operator(domain, op_type))
    if opset is not None and opset > NEWEST_OPSET.get(domain, opset):
        # a typo (Tile/99) must not run the newest version silently
        raise NotFound(f"{_qualified(domain, op_type)} has no version at opset {opset}: the "
                       f"newest opset onnx {onnx.__version__} defines is {NEWEST_OPSET[domain]}")  # fmt: skip
    versions = _served(domain, op_type)
    candidates = [v for v in versions if opset is None or v <= opset]
    if not candidates:
        raise NotFound(
            f"{_qualified(domain, op_type)} has no version at opset {opset}; "
            f"its first is {min(versions)}"
        )
    return versions[max(candidates)]


def operators() -> Iterator[tuple[str, str, list[OpVersion]]]:
    """Every served operator as (domain, op_type, versions oldest first)."""
    for domain, op_type in sorted(REGISTERED):
        versions = _served(domain, op_type)
        yield domain, op_type, [versions[v] for v in sorted(versions)]


def is_served(op_type: str, domain: str = "") -> bool:
    """Whether any version of the operator has a kernel."""
    return (domain, op_type) in REGISTERED


def unknown_operator(domain: str, op_type: str) -> str:
    """`unknown operator tile (did you mean Tile?); the operators are ...`."""
    asked = _qualified(domain, op_type)[:100]
    close = closest(domain, op_type)
    hint = f" (did you mean {close}?)" if close else ""
    return f"unknown operator {asked}{hint}; the operators are {', '.join(operator_names())}"


def closest(domain: str, op_type: str) -> str | None:
    """The served operator a misspelt name most likely means: a case-insensitive match first,
    then difflib's closest name."""
    names = operator_names()
    asked = _qualified(domain, op_type)[:100]
    folded = [name for name in names if name.lower() == asked.lower()]
    close = folded or difflib.get_close_matches(asked, names, n=1, cutoff=0.6)
    return close[0] if close else None


def operator_names() -> list[str]:
    """Every served operator's name (domain-qualified outside the default domain)."""
    return [_qualified(d, o) for d, o in sorted(REGISTERED)]


def _qualified(domain: str, op_type: str) -> str:
    return f"{domain}::{op_type}" if domain else op_type
