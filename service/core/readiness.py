"""Why the server, or a model, is not ready: the reason `/v2/health/ready` and
`/v2/models/{m}/ready` answer in their error body (Triton answers 400 and no reason), written to
the log once each time it changes, so an operator reads it where the probe failed."""

import logging
import weakref
from typing import TYPE_CHECKING

from service.errors import NotFound

if TYPE_CHECKING:
    from service.core.dataplane import DataPlane

log = logging.getLogger("opserve")
FAILED_SHOWN = 5  # failed models named in a reason; the index lists them all
SAID_BOUND = 1024  # model reasons remembered for the log: a repository's models, bounded


class Readiness:
    """The reasons of one data plane, each logged once when it first appears or changes."""

    def __init__(self, plane: "DataPlane") -> None:
        self.plane = plane
        self.said: dict[str, str] = {}  # "" (the server) or a model name: its last reason logged

    def server_reason(self) -> str:
        """Why server_ready() is false (call it then); logged when it changed."""
        return self._say("", self._server_reason())

    def model_reason(self, name: str, version: str | None) -> str:
        """Why model_ready(name, version) is false (call it then); logged when it changed."""
        shared = self.plane.shared_control
        wanted = shared.reason(name) if shared is not None else None  # cluster mode
        try:
            model = self.plane.model(name, version)
        except NotFound as exc:
            if wanted is None:
                return str(exc)  # an unknown name: not logged, any client can ask for any name
            model = None
        if model is None or not model.ready:
            why = (model.reason if model is not None else None) or wanted or "not loaded"
            reason = f"model '{name[:100]}' is not ready: {why}"
        else:  # ready, but a sequence model whose sequences cannot be reached
            reason = (f"model '{name[:100]}' is a sequence model and the store of the "
                      "cluster's sequences (Redis, OPSERVE_CLUSTER_REDIS_URL) is unreachable")  # fmt: skip
        return self._say(name, reason)

    def _server_reason(self) -> str:
        plane = self.plane
        if not plane.serving:
            return "start-up not done, or a shutdown has begun"
        repository = plane.repository()
        settings = plane.settings
        failed = [row["name"] for row in plane.repository_index(False)
                  if row.get("state") == "UNAVAILABLE" and row.get("reason") != "unloaded"]  # fmt: skip
        if failed:
            names = ", ".join(sorted(set(failed))[:FAILED_SHOWN])
            more = "" if len(set(failed)) <= FAILED_SHOWN else ", ..."
            return (f"models that should serve failed to load: {names}{more} (their reasons: "
                    "POST /v2/repository/index; OPSERVE_STRICT_READINESS=false serves the "
                    "others as ready)")  # fmt: skip
        if repository is not None and repository.ready() == 0:
            if settings.model_control_mode == "explicit" and not settings.load_models.strip():
                return ("no model is ready: OPSERVE_MODEL_CONTROL_MODE=explicit loads only "
                        "OPSERVE_LOAD_MODELS at start-up, and it is empty (`*` loads every "
                        "model); or load one (POST /v2/repository/models/{name}/load)")  # fmt: skip
            return f"no model of the repository ({repository.root}) is ready"
        return "not ready"

    def _say(self, key: str, reason: str) -> str:
        if self.said.get(key) != reason:
            if len(self.said) >= SAID_BOUND:
                self.said.clear()
            self.said[key] = reason
            log.warning("not ready: %s", reason)
        return reason


_OF: "weakref.WeakKeyDictionary[DataPlane, Readiness]" = weakref.WeakKeyDictionary()


def readiness_of(plane: "DataPlane") -> Readiness:
    """The plane's one Readiness, shared by the HTTP and gRPC doors (so each reason is logged
    once per process, whichever door was asked)."""
    found = _OF.get(plane)
    if found is None:
        found = _OF[plane] = Readiness(plane)
    return found
