"""The protocol-neutral core under every front door (v1 REST, V2 over HTTP, gRPC): models and
their lookup, inference, execution (inline or on a kernel thread, held to the memory budget),
statistics, classification, client shared memory, sequences (sequences.py: the turns and
state of runtime/sequence_plan.py's plans). It sits above service/runtime (models, their
configuration and the graph runner) and imports nothing of HTTP or gRPC (tests/test_layers.py
holds it to that)."""
