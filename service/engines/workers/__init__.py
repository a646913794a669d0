"""The isolated worker processes: the pool in the server (pool), the worker's main loop
(worker), one run in a worker (run), a small run awaited on the event loop (on_loop), and
tensors through private shared memory (transport)."""
