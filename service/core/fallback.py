"""How a one step (api/one_step.py, grpc/servicer.py) leaves a call to the general path.

A one step's work answers only the small common calls; for any other it raises `Declined`, and
for a refusal its work raises what the general path's would (the general path then refuses the
call again, in its words). Either way the call is answered by the general path, so a one step
never needs to tell the client anything itself.
"""

import logging

from pydantic import ValidationError

from service.errors import ServiceError
from service.kernels.context import RunOffLoop

log = logging.getLogger("opserve")


class Declined(Exception):
    """Not a call the one step's work answers: the general path's."""


_REFUSALS = (Declined, ServiceError, ValidationError, RunOffLoop)
"""What a one step's work raises in the normal course: a decline, a refusal (the general path
refuses the call again, in its words), an output for a kernel thread."""
_logged: set[type[BaseException]] = set()  # bounded by the exception types the code can raise


def fell_back(exc: Exception) -> None:
    """Note that a one step's work raised `exc`, its call going to the general path. Any
    exception but a decline or a refusal is a bug, of the one step's own or of the general
    path's work (which then fails the call itself): logged with its traceback the first time its
    type is seen, so a one step that fails on a common call does not cost each one twice the
    work without a word."""
    if isinstance(exc, _REFUSALS) or type(exc) in _logged:
        return
    _logged.add(type(exc))
    log.warning("a one step's work raised %s: its calls go to the general path (logged once "
                "per exception type)", type(exc).__name__, exc_info=exc)  # fmt: skip
