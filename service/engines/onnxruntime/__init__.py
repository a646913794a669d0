"""The onnxruntime engine: sessions opened with the service's bounds (session, probe), the
run's memory estimate (memory), what it must not run (crashes, differs), how a run is stopped
(stop) and when it may run on the event loop (inline); `model.OrtModel` is the loaded model."""
