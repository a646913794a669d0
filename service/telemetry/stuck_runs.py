"""`opserve_stuck_runs`: kernel threads still in a model run that did not stop, whose request
was answered without it (core/stuck_runs.py), beside `opserve_kernel_threads`, the slots they
come from. When the first reaches the second the liveness routes fail. This process's view:
with OPSERVE_WORKERS > 1, each worker has its own threads, and a scrape sees the one that
answers it."""

from collections.abc import Iterator
from typing import Protocol

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric


class Slots(Protocol):
    slots: int

    @property
    def stuck(self) -> int: ...


class StuckRuns:
    """A collector over the execution's threads left behind."""

    def __init__(self, left_behind: Slots) -> None:
        self.left_behind = left_behind

    def describe(self) -> list[Metric]:
        return []  # registering must not collect

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily("opserve_stuck_runs", "Kernel threads still in a model run "
                                "that did not stop past its deadline (its request answered "
                                "504)", value=self.left_behind.stuck)  # fmt: skip
        yield GaugeMetricFamily("opserve_kernel_threads", "Kernel threads of this process "
                                "(OPSERVE_KERNEL_THREADS)", value=self.left_behind.slots)  # fmt: skip
