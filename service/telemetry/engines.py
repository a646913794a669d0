"""`opserve_model_engine`: which engine runs each ready repository model version (a gauge of 1
per version, labelled model, version and engine), for joining with the request metrics on
model and version. This process's view: every worker loads the same repository."""

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric


class EngineInfo:
    """A collector over the repository that `repository()` returns (None: no repository)."""

    def __init__(self, repository: Callable[[], Any]) -> None:
        self.repository = repository

    def describe(self) -> list[Metric]:
        return []  # registering must not collect

    def collect(self) -> Iterator[Metric]:
        engines = GaugeMetricFamily("opserve_model_engine", "The engine that runs each ready "
                                    "repository model version (onnxruntime or exact)",
                                    labels=["model", "version", "engine"])  # fmt: skip
        repository = self.repository()
        for name in repository.names() if repository is not None else ():
            for number, entry in repository.versions(name).items():
                if entry.ready and entry.model is not None:
                    engines.add_metric([name, str(number), entry.model.engine], 1)
        yield engines
