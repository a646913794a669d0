"""The gRPC front door: KServe V2 over gRPC as Triton serves it (inference.GRPCInferenceService,
with grpc.health.v1 and server reflection), over the same data plane as HTTP (docs/v2.md)."""
