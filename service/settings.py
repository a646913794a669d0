"""Service settings, read from OPSERVE_* environment variables."""

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

MiB = 1024 * 1024


class Settings(BaseSettings):
    """Every limit has a finite default that keeps one request from taking the process's memory."""

    model_config = SettingsConfigDict(
        env_prefix="OPSERVE_", extra="ignore", use_attribute_docstrings=True
    )

    host: str = "0.0.0.0"
    """Interface the server binds to."""

    port: int = Field(default=8000, ge=1, le=65535)
    """TCP port of the HTTP server."""

    workers: int = Field(default=1, ge=1, le=64)
    """uvicorn worker processes. Scale out with replicas first; each worker holds its own limits."""

    log_level: str = "info"
    """Log level of the service and uvicorn (debug, info, warning, error)."""

    access_log: bool = True
    """Log one line per request."""

    trace_file: str = ""
    """Triton's trace extension (--trace-file): where trace records are written, as a JSON
    array; `<file>.<n>` for each group of OPSERVE_TRACE_LOG_FREQUENCY traces. Empty: no file,
    so no traces in `triton` mode. Each worker of OPSERVE_WORKERS writes `<file>.<pid>`."""

    trace_level: Literal["OFF", "TIMESTAMPS", "TENSORS"] = "OFF"
    """The trace level at start (--trace-level): OFF, TIMESTAMPS or TENSORS (the inputs and
    outputs, OPSERVE_TRACE_TENSOR_BYTES of each at most). Changed at run time by the extension."""

    trace_rate: int = Field(default=1000, ge=0, le=2**32 - 1)
    """Trace one request in this many (--trace-rate, Triton's default 1000)."""

    trace_count: int = Field(default=-1, ge=-1, le=2**31 - 1)
    """Traces to take, then stop (-1: no end) (--trace-count)."""

    trace_log_frequency: int = Field(default=0, ge=0, le=2**32 - 1)
    """Write every this many traces to a file of their own (0: to OPSERVE_TRACE_FILE as they
    come) (--log-frequency)."""

    trace_tensor_bytes: int = Field(default=65536, ge=0, le=2**31 - 1)
    """At the TENSORS trace level, the bytes of each tensor at most whose elements a record
    holds (a longer tensor is cut to its first elements; 0: only its name, shape and dtype)."""

    trace_mode: Literal["triton", "opentelemetry"] = "triton"
    """`triton`: records in Triton's JSON form to OPSERVE_TRACE_FILE; `opentelemetry`: spans
    exported over OTLP/HTTP to OPSERVE_TRACE_OTEL_URL (--trace-config mode=...)."""

    trace_otel_url: str = "http://localhost:4318/v1/traces"
    """The OpenTelemetry collector's OTLP/HTTP traces URL (--trace-config opentelemetry,url=)."""

    max_request_bytes: int = Field(default=64 * MiB, ge=1024)
    """Largest request body accepted; larger bodies get 413 while they stream in."""

    max_output_bytes: int = Field(default=64 * MiB, ge=1024)
    """Largest tensor an operator may produce; bigger outputs get 413 before they are allocated."""

    max_elements: int = Field(default=64 * MiB, ge=1)
    """Most elements one decoded tensor may hold."""

    max_string_bytes: int = Field(default=16 * MiB, ge=1)
    """Most UTF-8 bytes the strings of one tensor may hold together."""

    max_json_depth: int = Field(default=32, ge=1, le=64)
    """Deepest nesting of a tensor's `data` (its rank). Whole documents nested deeper than
    200 levels are refused by the JSON parser before anything is built."""

    max_json_items: int = Field(default=1 << 20, ge=1 << 19, le=1 << 30)
    """Most items a JSON request body may hold: its commas, and 10 for each opening bracket (a
    list costs the parse about ten values' time), counted before it is parsed; 413 past it.
    The parse holds the interpreter's lock, and so every other request, in one call: 4
    million numbers took 116-152 ms, 700,000 nested lists 250-540 ms. Large tensors travel
    as binary data (V2's binary tensor data extension, a base64 TensorProto in v1) or in
    shared memory, which this does not bound. At least 524,288: a body small enough to be
    read and parsed on the event loop (64 KiB, not counted) holds at most about 330,000 (a
    list in two bytes, `[]`, nested: 32,768 lists)."""

    kernel_threads: int = Field(default=2, ge=1, le=256)
    """Threads that run large requests off the event loop, so they do not stall small ones; at
    most this many large requests hold their body and output in memory at once."""

    # --- models and the graph runtime (service/runtime/) ---

    model_repository: Path | None = None
    """Folder of the model repository (`<name>/<version>/model.onnx`, or `<name>.onnx` as version
    1), read at start-up. None: no repository; `POST /v1/models/run` still runs posted models."""

    model_control_mode: Literal["none", "explicit", "poll"] = "none"
    """Triton's model control modes: `none` loads every model at start-up; `explicit` loads
    OPSERVE_LOAD_MODELS at start-up and lets clients load and unload models (POST
    /v2/repository/models/{name}/load, /unload); `poll` also reads the repository again every
    OPSERVE_REPOSITORY_POLL_SECONDS, loading new and changed models, unloading removed ones."""

    load_models: str = ""
    """Explicit mode: the models to load at start-up, comma-separated (`*`: all)."""

    repository_poll_seconds: float = Field(default=15.0, gt=0, le=86400)
    """Poll mode: seconds between two reads of the repository."""

    default_max_batch_size: int = Field(default=4, ge=0, le=1 << 30)
    """The max_batch_size Triton's auto-complete gives a model whose every graph input and
    output has a dynamic first dimension, when its config.pbtxt names none (Triton's
    onnxruntime default-max-batch-size): its first dimension is then the batch. 0: no model
    batches unless its config.pbtxt says so."""

    max_model_bytes: int = Field(default=256 * MiB, ge=1024)
    """Largest model file the repository reads; bigger files are listed not ready, unread.
    Also the most bytes the `file:` parameters of one load may hold together (413). (A
    posted model is bounded by OPSERVE_MAX_REQUEST_BYTES.)"""

    max_load_files: int = Field(default=256, ge=1, le=100_000)
    """Most `file:` parameters one load request (POST /v2/repository/models/{name}/load,
    RepositoryModelLoad) may carry; their bytes together are bounded by
    OPSERVE_MAX_MODEL_BYTES. More is refused (400, INVALID_ARGUMENT) before anything is
    decoded or loaded."""

    max_sent_model_bytes: int = Field(default=256 * MiB, ge=0)
    """Most bytes the models loaded from a load's own files (a name with no folder in the
    repository, sent whole with `config` and `file:` parameters) may hold together, counted by
    their files; a load past it is refused (413) until others are unloaded. 0: no model may be
    sent whole. Folder models are bounded by the repository itself."""

    max_load_versions: int = Field(default=64, ge=1, le=100_000)
    """Most versions a model configuration's `version_policy: specific` may name (a load's
    override or a config.pbtxt); more is refused before any version is loaded."""

    max_graph_bytes: int = Field(default=256 * MiB, ge=1024)
    """Most bytes the live intermediates of one model run may hold together (413 naming the
    node that would pass it). Intermediates are released after their last consumer."""

    max_graph_nodes: int = Field(default=10_000, ge=1)
    """Most nodes a model may hold, its subgraphs and functions included."""

    max_graph_depth: int = Field(default=8, ge=0, le=64)
    """Deepest nesting of subgraphs (If, Loop, Scan bodies) in a model."""

    reference_fallback: bool = False
    """Run nodes of standard operators the service has no kernel for on onnx.reference. The
    output budgets are checked after such a node runs, not before; see docs/models.md."""

    onnxruntime_load_seconds: float = Field(default=60.0, gt=0, le=3600)
    """Longest a probe process may take to open a model in onnxruntime before the session is
    made in the server (a model that crashes or hangs onnxruntime takes the probe down): past
    it, the model runs on the exact engine, with the reason (docs/models.md)."""

    onnxruntime_sessions: int = Field(default=8, ge=1, le=1024)
    """onnxruntime sessions kept for models posted to /v1/models/run with "engine":
    "onnxruntime", by the model's digest, least recently used dropped first."""

    # --- the KServe V2 protocol and Triton's extensions (docs/v2.md) ---

    server_name: str = Field(default="opserve", min_length=1, max_length=64)
    """The server's name in `GET /v2` (server metadata). Triton's example client
    simple_http_health_metadata.py insists on "triton"."""

    strict_readiness: bool = True
    """Readiness as Triton's --strict-readiness: with a model repository, the server is not
    ready while a model that should be serving has failed (loaded at start-up or by a poll,
    until it loads or is unloaded; a client's failed load changes nothing) or no repository
    model is ready. False: ready once start-up is done, whatever the models."""

    max_sequences: int = Field(default=1000, ge=1, le=1_000_000)
    """Most live sequences (sequence batching) at once, over every model; each model holds at
    most its own configuration's number (Triton's sequence slots: instance count x
    max_candidate_sequences, or x max_batch_size). A sequence start past either is refused
    with 503 and Retry-After (when the soonest idle one is released)."""

    sequence_state_share: float = Field(default=0.5, gt=0, le=1)
    """Share of the memory budget that live sequences may keep (their implicit state and table
    entries, for as long as they live); requests always have the rest. A sequence start whose
    state does not fit now is refused with 503 and Retry-After."""

    # --- cluster mode (service/cluster/; docs/deployment.md, "Many replicas, one server") ---

    cluster_redis_url: SecretStr = SecretStr("")
    """Redis that the replicas share state through (sequences, the repository's desired state,
    statistics): `redis://[:password@]host:port/db`, or `rediss://` for TLS, as redis-py takes
    it. Empty (the default): cluster mode is off and one process needs nothing but itself."""

    cluster_name: str = Field(default="opserve", min_length=1, max_length=64,
                              pattern=r"^[A-Za-z0-9._-]+$")  # fmt: skip
    """Prefix of every key this deployment writes (`opserve:<name>:...`), so deployments can
    share one Redis."""

    cluster_timeout_seconds: float = Field(default=1.0, ge=0.05, le=30)
    """Longest wait for one Redis call; past it the call that needed the store answers 503
    (UNAVAILABLE) with Retry-After, saying the cluster store is unreachable."""

    cluster_heartbeat_seconds: float = Field(default=1.0, ge=0.1, le=60)
    """How often each process refreshes its registration in the cluster; a process that missed
    three heartbeats counts as gone."""

    cluster_apply_seconds: float = Field(default=30.0, gt=0, le=3600)
    """Longest wait of a model load or unload (explicit model control) for every live replica
    to apply it; past it, or when a replica failed to, the call answers 503 (UNAVAILABLE)
    naming the replicas that did not (the model stays desired: they apply it when they can)."""

    cluster_statistics_seconds: float = Field(default=0.25, ge=0.02, le=10)
    """How often each process writes its statistics' totals to the cluster store (from a timer,
    never on a request's path): a stats call sees another replica's counts at most this late."""

    cluster_sequence_lease_seconds: float = Field(default=3.0, ge=0.2, le=60)
    """How long a sequence step's lease on its sequence lasts unless renewed (it is renewed
    every third of it while the step runs): a replica that dies mid-step holds its sequence
    for at most this long, then the next request on any replica continues from the last
    committed state."""

    cluster_sequence_max_idle_seconds: float = Field(default=86400.0, gt=0, le=30 * 86400)
    """Longest a cluster sequence's keys live idle in the cluster store, whatever its model's
    `max_sequence_idle_microseconds` says (a configuration near 2^64 us would keep them for
    ages): an idle sequence is released after the shorter of the two. One day by default."""

    response_cache_bytes: int = Field(default=0, ge=0, le=1 << 40)
    """The response cache's size (Triton's --cache-config): a repeated request to a model whose
    configuration says `response_cache { enable: true }` is answered from it. 0 (the default):
    no cache. One process: a local LRU of this many bytes, counted in the memory budget (what
    it keeps is part of what the budget counts as kept); cluster mode: the most the replicas'
    shared cache in the cluster's Redis holds, oldest entries dropped first (docs/v2.md)."""

    response_cache_entry_bytes: int = Field(default=4 * MiB, ge=1024, le=512 * MiB)
    """The largest answer (a model's outputs) the response cache keeps; a larger one is
    answered and not kept."""

    response_cache_seconds: float = Field(default=600.0, gt=0, le=30 * 86400)
    """How long an answer stays in the response cache (Triton's Redis cache sets no expiry:
    an answer kept for ever outlives the model's version when it is reloaded in place)."""

    allow_client_shm: bool = False
    """Let clients register system shared memory regions (Triton's --allow-client-shm) and
    send inputs and take outputs through them: for clients on the same host. A region is a
    POSIX shared memory key, never a path; off, registering answers 501."""

    # --- gRPC: Triton's GRPCInferenceService (docs/v2.md, gRPC) ---

    grpc_port: int = Field(default=8001, ge=0, le=65535)
    """TCP port of the gRPC server (KServe V2 over gRPC, Triton's GRPCInferenceService, with
    grpc.health.v1 and server reflection), on OPSERVE_HOST beside HTTP. 0: no gRPC server.
    With OPSERVE_WORKERS > 1 every worker listens on it (SO_REUSEPORT); with one worker, a
    second process on the port fails to start (docs/deployment.md)."""

    grpc_max_calls: int = Field(default=1024, ge=1, le=1_000_000)
    """Most gRPC calls (unary calls, and stream messages while they are served, over every
    client) a worker serves at once; one more is refused with RESOURCE_EXHAUSTED and a
    retry-after hint. A unary call counts from its headers' arrival, so clients that open calls
    and send nothing hold only these; open streams count in OPSERVE_GRPC_MAX_STREAMS."""

    grpc_max_calls_per_client: int = Field(default=256, ge=1, le=1_000_000)
    """Most of those calls one client may hold at once (its connections together; every
    loopback address counts as one client, an IPv6 client as its /64); one more is refused
    with RESOURCE_EXHAUSTED and a retry-after hint, so one client cannot take every slot.
    Behind a proxy every client has the proxy's address: set it to OPSERVE_GRPC_MAX_CALLS
    there (docs/deployment.md)."""

    grpc_max_streams: int = Field(default=1024, ge=1, le=1_000_000)
    """Most gRPC streams (ModelStreamInfer, health Watch, server reflection) a worker keeps open
    at once, over every client; one more is refused with RESOURCE_EXHAUSTED and a retry-after
    hint. Counted apart from OPSERVE_GRPC_MAX_CALLS (inference streams in one count, health's
    and reflection's in another): a stream takes a call slot only while one of its messages is
    served, so silent streams hold no slot a call needs; this bounds what they hold (a task and
    buffers each)."""

    grpc_max_streams_per_client: int = Field(default=256, ge=1, le=1_000_000)
    """Most of those streams one client may keep open at once (counted as
    OPSERVE_GRPC_MAX_CALLS_PER_CLIENT's clients); one more is refused with RESOURCE_EXHAUSTED
    and a retry-after hint. Behind a proxy every client has the proxy's address: its clients'
    streams share this, their calls do not."""

    grpc_max_streams_per_connection: int = Field(default=128, ge=1, le=1_000_000)
    """Most gRPC calls open at once on one client connection (HTTP/2's
    SETTINGS_MAX_CONCURRENT_STREAMS; nginx's http2_max_concurrent_streams is 128 too): a
    client's further calls wait on its side until one ends, so that one connection cannot
    take every place of OPSERVE_GRPC_MAX_CALLS."""

    grpc_idle_seconds: float = Field(default=300.0, gt=0, le=86400)
    """How long a ModelStreamInfer stream may wait for its client's next request before the
    server ends it with DEADLINE_EXCEEDED (a client keeping a stream for later sends within
    it, or opens a new one)."""

    grpc_keepalive_seconds: float = Field(default=7200.0, gt=0, le=86400)
    """Seconds between the server's keepalive pings on a connection with calls open (gRPC's
    keepalive_time; Triton's default, 2 hours): a client that vanished without closing is
    found and its calls freed. Lower it when clients sit behind NATs that drop idle flows."""

    grpc_min_ping_seconds: float = Field(default=10.0, gt=0, le=86400)
    """Least time between two keepalive pings the server accepts from a client, with or
    without calls open; pings more often are answered with GOAWAY ("too_many_pings") after two
    strikes. tritonclient's KeepAliveOptions with a keepalive_time_ms at least this works."""

    grpc_compression: Literal["none", "gzip", "deflate"] = "none"
    """Compression of gRPC answers, for clients that accept it (as Triton's
    --grpc-infer-response-compression-level; tensors compress poorly). An answer over 64 KiB
    goes uncompressed anyway (grpc would compress it on the event loop: grpc/door.py).
    Compressed requests are always accepted, whatever this says."""

    # --- deployment and observability ---

    graceful_shutdown_seconds: int = Field(default=20, ge=1, le=3600)
    """After SIGTERM: how long in-flight requests may take to finish before the worker exits.
    Keep it below Kubernetes' terminationGracePeriodSeconds minus the preStop pause."""

    metrics_dir: str = ""
    """Directory where the worker processes of one server share their metric totals. Empty:
    `opserve` makes a fresh temporary one per start (and removes it); a directory given here is
    emptied of old totals at start. Must be writable (an emptyDir under a read-only root)."""

    metrics_buckets: str = ("0.0001,0.00025,0.0005,0.001,0.0025,0.005,0.01,0.025,0.05,0.1,0.25,"
                            "0.5,1,2.5,5,10")  # fmt: skip
    """Upper bounds in seconds, comma-separated and increasing, of the buckets of the latency
    histograms `opserve_inference_{request,queue,compute_infer}_duration_seconds` (at most 32).
    Every replica should use the same, so their histograms add up."""

    @field_validator("metrics_buckets")
    @classmethod
    def _buckets_parse(cls, value: str) -> str:
        metric_buckets(value)
        return value

    # --- hostile clients and memory ---

    memory_budget_bytes: int = Field(default=512 * MiB, ge=16 * MiB)
    """Memory all large requests together may hold: body, decoding, kernel output and encoded
    answer, from the first body byte until the last answer byte is sent. A request that cannot
    get its share within `memory_wait_seconds` gets 503 with Retry-After; one that needs more
    than the whole budget gets 413. Small requests (inline) are not counted and never wait."""

    memory_wait_seconds: float = Field(default=2.0, ge=0, le=60)
    """How long a large request waits for its share of the memory budget before 503."""

    heap_trim_seconds: float = Field(default=1.0, ge=0, le=3600)
    """How long the memory budget must stay idle (no large request holding any of it) before
    the memory large requests freed is given back to the system (glibc's malloc_trim; about
    20 ms per 256 MiB). Until then it stays with the process, so large requests coming more
    often than this reuse warm pages. 0: never trim (RSS stays at its high-water mark)."""

    gc_freeze: bool = True
    """Once start-up is done, take what it made out of Python's full garbage collections
    (gc.freeze): a full collection walked the 106,000 objects of a started server in about
    80 ms with the interpreter's lock held, every request waiting (kernels/collector.py). A
    model unloaded or replaced costs one full collection, and what is left is frozen again."""

    body_timeout_seconds: float = Field(default=60.0, gt=0, le=3600)
    """Deadline for a whole request body to arrive; a client that stalls gets 408 and the
    connection is closed. Nothing is reserved for a body before it arrives. On gRPC: for a
    unary call's message, DEADLINE_EXCEEDED past it."""

    send_timeout_seconds: float = Field(default=60.0, gt=0, le=3600)
    """How long a large answer waits for a client that does not read it before the connection
    is dropped and its memory freed. On gRPC: how long an answer waits to be taken by a client
    that reads none of its call's or stream's answers, before the call is ended with
    RESOURCE_EXHAUSTED."""

    max_answer_bytes: int = Field(default=256 * MiB, ge=1024)
    """Largest encoded answer: the most bytes the output can take as JSON or base64 (JSON up to
    25 bytes per double, 6 per string byte) is computed before the kernel runs; 413 above."""

    max_run_seconds: float = Field(default=30.0, gt=0, le=86400)
    """Longest a model run may take (V2 repository models, /v1/models/*). A run still going
    after it is stopped between two nodes (a fallback worker is killed), what it holds is
    freed, and the answer is 504 naming the node that was running."""

    max_warmup_seconds: float = Field(default=60.0, gt=0, le=86400)
    """Longest a model version's warmup (its config's `model_warmup` samples, every run of
    each) may take; past it the load fails with that reason. Each run is held to
    OPSERVE_MAX_RUN_SECONDS too."""

    max_warmup_runs: int = Field(default=1000, ge=1, le=1_000_000)
    """Most runs a model version's warmup may ask for (each sample's `count`, and its
    `batch_size` for a model without batching, summed); more fails the load before any runs."""

    max_queued_runs: int = Field(default=64, ge=0, le=100_000)
    """Large requests that may wait for a kernel thread beyond the OPSERVE_KERNEL_THREADS
    running; past it, 503 with Retry-After."""

    fallback_workers: int = Field(default=2, ge=1, le=64)
    """The isolated worker processes: they run clients' models on onnxruntime (posted, or
    loaded with `file:` contents) and models needing onnx.reference
    (OPSERVE_REFERENCE_FALLBACK), each under an address-space limit
    (OPSERVE_ISOLATED_WORKER_BYTES) and killed at OPSERVE_MAX_RUN_SECONDS, when its client
    leaves or the server stops; started on first use, replaced when one ends. A run waits for
    a free one (within its deadline)."""

    isolated_worker_bytes: int = Field(default=0, ge=0)
    """Address space each isolated worker may add to what it holds once started (its share of
    the host's memory): a run that needs more fails with 413, the worker is replaced. 0 (the
    default): twice OPSERVE_MAX_GRAPH_BYTES plus twice OPSERVE_MAX_REQUEST_BYTES plus 256 MiB
    for the engine itself."""

    isolated_restart_seconds: float = Field(default=0.1, ge=0, le=60)
    """Back-off before starting a worker after one died (a crash, a kill at the deadline):
    doubled for each death in a row, up to 5 s, and reset by a run that ends well; so a
    client whose models keep crashing cannot make the server fork without pause."""

    client_models_in_process: bool = False
    """Run clients' models (posted with "engine": "onnxruntime", `file:` loads) on
    onnxruntime in the server's own process, screened as the operator's models are, instead
    of in the isolated workers. Faster for a first call, but a model that crashes or hangs
    onnxruntime then takes the server with it: only for clients the operator trusts."""

    keep_alive_seconds: int = Field(default=5, ge=1, le=3600)
    """How long an idle kept-alive HTTP connection stays open (uvicorn's timeout_keep_alive,
    whose default it keeps). A proxy or client that reuses idle connections must drop them
    sooner (nginx's upstream keepalive_timeout 4 s here), else a request sent just as the server
    closes gets no answer; raise it behind a load balancer with a longer idle timeout."""

    header_timeout_seconds: float = Field(default=10.0, gt=0, le=3600)
    """Deadline for a request's headers to arrive (from the connection's opening, or from the
    first byte of the next request on a kept-alive connection); past it the connection is
    closed, so clients that dribble their headers cannot hold connections."""

    max_connections: int = Field(default=8192, ge=16, le=1_000_000)
    """Open connections per worker process; a connection past it is answered 503 with
    Retry-After and closed at once. Keep it below the process's file-descriptor limit, which
    the server raises to its hard limit at start (the image: 65536)."""

    api_keys: SecretStr = SecretStr("")
    """Comma-separated API keys. When set, every route but `/v2/health/*`, `/metrics` and the
    documentation (`/docs`, `/redoc`, `/openapi.json`) answers 401 without `Authorization:
    Bearer <key>`; empty (the default): no keys needed."""


MAX_BUCKETS = 32


def metric_buckets(text: str) -> tuple[float, ...]:
    """The bucket bounds OPSERVE_METRICS_BUCKETS names; ValueError naming the setting."""
    try:
        bounds = tuple(float(part) for part in text.split(","))
    except ValueError:
        raise ValueError(f"OPSERVE_METRICS_BUCKETS: {text[:100]!r} is not a comma-separated "
                         "list of seconds") from None  # fmt: skip
    if not 0 < len(bounds) <= MAX_BUCKETS:
        raise ValueError(f"OPSERVE_METRICS_BUCKETS: 1 to {MAX_BUCKETS} bounds, not {len(bounds)}")
    if not all(0 < b < float("inf") for b in bounds) or list(bounds) != sorted(set(bounds)):
        raise ValueError("OPSERVE_METRICS_BUCKETS: the bounds must be positive, finite and "
                         f"increasing: {text[:100]!r}")  # fmt: skip
    return bounds
