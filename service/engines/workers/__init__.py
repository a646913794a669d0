"""The isolated worker processes: the pool in the server (pool), the worker's main loop
(worker), one run in a worker (run), and tensors through private shared memory (transport)."""
