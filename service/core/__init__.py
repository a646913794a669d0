"""The protocol-neutral core under every front door (v1 REST, V2 over HTTP, gRPC): models and
their lookup, inference, execution (inline or on a kernel thread, held to the memory budget),
statistics, classification, client shared memory, sequences (sequence_plan.py: a model's
sequence_batching; sequences.py: the turns and state). It imports nothing of HTTP or gRPC
(tests/test_layers.py holds it to that)."""
