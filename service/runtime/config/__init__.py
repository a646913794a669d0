"""Triton's model configuration: its messages (messages), the files it names (files), its
JSON form (json_form), completed as Triton serves it (complete), checked on its own (checks)
and against the graph (against_graph), and a request's tensors against it (request_io)."""
