"""`python -m service` and the `opserve` console script: serve the app with uvicorn (flags in
service/cli.py)."""

import atexit
import contextlib
import logging
import logging.config
import os
import resource
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

import uvicorn

from service.api.header_guard import GuardedHttpTools
from service.cli import parse_settings
from service.log_format import logging_config
from service.settings import Settings


def main(argv: Sequence[str] | None = None) -> None:
    """Start uvicorn with the settings (flags, then OPSERVE_* variables), `OPSERVE_WORKERS`
    worker processes. `opserve --help` lists every setting."""
    settings = parse_settings(argv)
    check_cluster_store(settings)
    # uvicorn re-raises the SIGTERM it handled once its graceful shutdown is done; exit through
    # Python then, so that the `finally` below runs (a default handler would end the process).
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    raise_file_limit()
    try:
        serve(settings)
    except SystemExit as stopped:  # the SIGTERM above; other statuses end as Python would
        if stopped.code not in (0, None):
            raise
    exit_without_teardown()


def serve(settings: Settings) -> None:
    """uvicorn with the app, until it stops (SIGTERM or SIGINT)."""
    with metrics_dir(settings):
        uvicorn.run(
            "service.main:app",
            host=settings.host,
            port=settings.port,
            workers=settings.workers,
            log_level=settings.log_level,
            log_config=logging_config(settings.log_level),
            access_log=False,  # the app writes its own, cheaper access log (service/telemetry/access_log.py)
            # uvicorn stops accepting on SIGTERM, then waits this long for in-flight requests
            timeout_graceful_shutdown=settings.graceful_shutdown_seconds,
            http=GuardedHttpTools,  # header deadline and connection bound (api/header_guard.py)
            backlog=4096,
            timeout_keep_alive=settings.keep_alive_seconds,
        )


def exit_without_teardown() -> NoReturn:
    """End the process as Python's exit would (its non-daemon threads waited for, then its
    atexit handlers: logs and metrics flushed), but without tearing down every module and
    object one by one after: with onnx, numpy, protobuf and FastAPI loaded, that teardown took
    0.35-0.5 s of CPU at every stop, longer than the graceful shutdown of an idle server."""
    threading._shutdown()  # type: ignore[attr-defined]  # Python's own wait, executors' too
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(0)


def check_cluster_store(settings: Settings) -> None:
    """Cluster mode: a Redis URL that cannot work stops the start with one line (exit 1); a
    Redis not answering yet is an error in the log, and the start goes on (store_check.py)."""
    url = settings.cluster_redis_url.get_secret_value()
    if not url:
        return
    from service.cluster.store_check import StoreConfigError, check_store  # cluster mode only

    try:
        warning = check_store(url, settings.cluster_timeout_seconds)
    except StoreConfigError as error:
        sys.exit(f"opserve: {error}")
    if warning is not None:
        logging.config.dictConfig(logging_config(settings.log_level))
        logging.getLogger("opserve").error(warning)


def raise_file_limit() -> None:
    """Every connection is a file descriptor: the soft limit (often 1024) raised to the hard
    one, so OPSERVE_MAX_CONNECTIONS, not the limit, decides when new clients are refused."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 1 << 20 if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < wanted:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


@contextmanager
def metrics_dir(settings: Settings) -> Iterator[None]:
    """A directory of this start only, where the workers share metrics (service/telemetry/metrics.py)."""
    if settings.metrics_dir:
        for stale in Path(settings.metrics_dir).glob("*.json"):
            stale.unlink()  # another start's totals would be summed into this one's
        yield
        return
    directory = tempfile.mkdtemp(prefix="opserve-metrics-")
    os.environ["OPSERVE_METRICS_DIR"] = directory  # the workers read their settings from it
    try:
        yield
    finally:
        del os.environ["OPSERVE_METRICS_DIR"]
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
