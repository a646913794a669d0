"""The engines a model runs on besides the exact one (service/runtime's plan and kernels):
onnxruntime in the server's process (onnxruntime/), and the isolated worker processes
(workers/) where a run cannot take the server with it. `choice` picks one when a model loads."""
