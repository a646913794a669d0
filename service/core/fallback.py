"""How a one step (api/one_step.py, grpc/servicer.py) leaves a call to the general path.

A one step's work answers only the small common calls; for any other it raises `Declined`, and
for a refusal its work raises what the general path's would (the general path then refuses the
call again, in its words). Either way the call is answered by the general path, so a one step
never needs to tell the client anything itself.
"""


class Declined(Exception):
    """Not a call the one step's work answers: the general path's."""
