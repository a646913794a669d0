# opserve: ONNX operators as a service. Build: docker build -t opserve:0.1.0 .  (the version)
# Two stages: the first installs the project into a virtualenv (pip and build tools stay there),
# the second copies only that virtualenv onto a clean base and runs as an unprivileged user.
ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS build
# `python3`, not `python`: some Debian-based bases have only the former
RUN python3 -m venv /opt/opserve
WORKDIR /src
COPY pyproject.toml README.md ./
COPY api_schemas ./api_schemas
COPY service ./service
# Bytecode is compiled here: the running container's root filesystem may be read-only.
RUN /opt/opserve/bin/pip install --no-cache-dir --disable-pip-version-check . \
 && /opt/opserve/bin/pip uninstall --yes pip setuptools \
 && find /opt/opserve -name tests -path '*/site-packages/*/tests' -prune -exec rm -rf {} +

FROM ${PYTHON_IMAGE}
COPY --from=build /opt/opserve /opt/opserve
# The example model repository: served by default, so the image answers /v1/models out of the
# box and Kubernetes needs no volume; mount your own over /models (docs/deployment.md).
COPY examples/model_repository /models
# A numeric user, so Kubernetes' runAsNonRoot can check it without an /etc/passwd entry.
USER 10001:10001
WORKDIR /tmp
ENV PATH=/opt/opserve/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    OPSERVE_HOST=0.0.0.0 \
    OPSERVE_PORT=8000 \
    OPSERVE_GRPC_PORT=8001 \
    OPSERVE_WORKERS=1 \
    OPSERVE_LOG_LEVEL=info \
    OPSERVE_ACCESS_LOG=true \
    OPSERVE_GRACEFUL_SHUTDOWN_SECONDS=20 \
    OPSERVE_MODEL_REPOSITORY=/models
# HTTP (REST v1, KServe V2) and gRPC (KServe V2, Triton's GRPCInferenceService)
EXPOSE 8000 8001
# Liveness only: readiness is the load balancer's business (/v2/health/ready).
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
  CMD ["python3", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/v2/health/live' % os.environ.get('OPSERVE_PORT', '8000'), timeout=2)"]
# exec form: the server is PID 1 and receives SIGTERM itself (graceful shutdown). It raises its
# file-descriptor soft limit to the hard one the runtime gives (docker run --ulimit
# nofile=65536:65536; compose sets it): every connection is a file (docs/deployment.md).
CMD ["opserve"]
