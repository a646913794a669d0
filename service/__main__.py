"""`python -m service` and the `opserve` console script: serve the app with uvicorn."""

import uvicorn

from service.settings import Settings


def main() -> None:
    """Start uvicorn with the OPSERVE_* settings."""
    settings = Settings()
    uvicorn.run(
        "service.main:app",
        host=settings.host,
        port=settings.port,
        workers=settings.workers,
        log_level=settings.log_level,
        access_log=False,  # the app writes its own, cheaper access log (api/access_log.py)
    )


if __name__ == "__main__":
    main()
