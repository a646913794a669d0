"""The table of kernel registrations and the decorator that fills it.

It lives with the kernels so imports run one way: kernels -> registrations, and the operator
registry (service/operators/registry.py) reads the table once the kernels are imported.
"""

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

Kernel = Callable[..., tuple[np.ndarray, ...]]


@dataclass(frozen=True)
class Registration:
    """One kernel, registered at the schema version where behaviour changes."""

    kernel: Kernel
    extra_input_types: dict[str, frozenset[str]]


REGISTERED: dict[tuple[str, str], dict[int, Registration]] = {}
"""(domain, op_type) -> since_version -> registration."""


def kernel(
    op_type: str,
    since: int,
    *,
    domain: str = "",
    extra_input_types: dict[str, tuple[str, ...]] | None = None,
) -> Callable[[Kernel], Kernel]:
    """Register a kernel for `op_type` from schema version `since` on."""

    def register(fn: Kernel) -> Kernel:
        extra = {
            k: frozenset(f"tensor({t})" for t in v) for k, v in (extra_input_types or {}).items()
        }
        REGISTERED.setdefault((domain, op_type), {})[since] = Registration(fn, extra)
        return fn

    return register
