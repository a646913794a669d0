"""The load probe (service/engines/onnxruntime/probe.py): a model's bytes are probed once, whatever
the number of versions or loads that carry them; onnxruntime's refusal is kept as its
opening is; a probe that ran out of time is remembered for a while apart: the same bytes are
refused at once meanwhile, and probed again once it has passed."""

import time

import numpy as np
import pytest
from onnx import TensorProto, helper

from service.engines.onnxruntime import probe
from service.engines.onnxruntime.probe import Probes, ProbeTimeout
from service.engines.onnxruntime.session import Unsupported

from .models import I64, F, model, value

GRAPH_BYTES = 64 << 20


def _tiler(repeats: int) -> bytes:
    return model([helper.make_node("Tile", ["x", "r"], ["y"], name="tile")],
                 [value("x", F, [None])], [value("y", F, [None])],
                 {"r": np.array([repeats], np.int64)}).SerializeToString()  # fmt: skip


def _bfloat16_tile() -> bytes:
    """Float in and out, a bfloat16 Tile between: onnx.checker passes it, onnxruntime has no
    kernel for it and refuses it at load."""
    nodes = [helper.make_node("Cast", ["x"], ["h"], to=TensorProto.BFLOAT16),
             helper.make_node("Tile", ["h", "r"], ["t"]),
             helper.make_node("Cast", ["t"], ["y"], to=TensorProto.FLOAT)]  # fmt: skip
    return model(nodes, [value("x", F, [None]), value("r", I64, [1])],
                 [value("y", F, [None])]).SerializeToString()  # fmt: skip


def test_the_same_bytes_are_probed_once() -> None:
    probes = Probes()
    for _ in range(20):  # twenty versions of one file
        probes.check(_tiler(2), 1, 60, GRAPH_BYTES)
    assert probes.started == 1
    probes.check(_tiler(3), 1, 60, GRAPH_BYTES)  # other bytes: probed
    probes.check(_tiler(3), 2, 60, GRAPH_BYTES)  # other options: probed
    assert probes.started == 3


def test_a_refusal_is_kept_with_onnxruntimes_reason() -> None:
    probes = Probes()
    reasons = []
    for _ in range(3):
        with pytest.raises(Unsupported) as refused:
            probes.check(_bfloat16_tile(), 1, 60, GRAPH_BYTES)
        reasons.append(str(refused.value))
    assert probes.started == 1 and len(set(reasons)) == 1
    assert reasons[0].startswith("Could not find an implementation for Tile"), reasons[0]


def test_a_probe_out_of_time_refuses_the_same_bytes_at_once_for_a_while(
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    probes = Probes()
    with pytest.raises(ProbeTimeout, match="OPSERVE_ONNXRUNTIME_LOAD_SECONDS"):
        probes.check(_tiler(2), 1, 0.01, GRAPH_BYTES)  # no process imports onnxruntime in 10 ms
    assert probes.started == 1
    for seconds in (0.01, 60):  # refused at once, however long the next load may take
        with pytest.raises(ProbeTimeout, match="refused for 600 s"):
            probes.check(_tiler(2), 1, seconds, GRAPH_BYTES)
    assert probes.started == 1
    probes.check(_tiler(3), 1, 60, GRAPH_BYTES)  # other bytes are probed
    assert probes.started == 2
    later = time.monotonic() + probe.TIMED_OUT_SECONDS + 1
    monkeypatch.setattr(probe.time, "monotonic", lambda: later)  # the while has passed
    probes.check(_tiler(2), 1, 60, GRAPH_BYTES)
    assert probes.started == 3
