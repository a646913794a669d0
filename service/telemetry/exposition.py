"""Prometheus' text format for families whose counters keep their own names: Triton's counters
have no `_total` (`nv_inference_request_success`), which prometheus-client's generate_latest
always adds. Histograms and gauges come out as generate_latest writes them."""

from collections.abc import Iterable

from prometheus_client.metrics_core import Metric
from prometheus_client.utils import floatToGoString


def text(families: Iterable[Metric]) -> bytes:
    """The families' HELP, TYPE and sample lines, each sample under its own name."""
    lines = []
    for family in families:
        lines.append(f"# HELP {family.name} {_escaped(family.documentation, False)}\n"
                     f"# TYPE {family.name} {family.type}\n")  # fmt: skip
        for sample in family.samples:
            labels = ",".join(f'{key}="{_escaped(value, True)}"'
                              for key, value in sorted(sample.labels.items()))  # fmt: skip
            lines.append(f"{sample.name}{{{labels}}} {floatToGoString(sample.value)}\n")
    return "".join(lines).encode()


def _escaped(value: str, quoted: bool) -> str:
    """A label value (`quoted`) or a HELP text as the format escapes them."""
    value = value.replace("\\", r"\\").replace("\n", r"\n")
    return value.replace('"', r"\"") if quoted else value
