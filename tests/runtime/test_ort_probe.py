"""The load probe (service/engines/onnxruntime/probe.py): a model's bytes are probed once, whatever
the number of versions or loads that carry them; onnxruntime's refusal is kept as its
opening is; a probe that ran out of time is not kept, so the next load probes again."""

import numpy as np
import pytest
from onnx import TensorProto, helper

from service.engines.onnxruntime.probe import Probes
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


def test_a_probe_out_of_time_is_not_kept() -> None:
    probes = Probes()
    for _ in range(2):  # no process imports onnxruntime within 10 ms
        with pytest.raises(Unsupported, match="OPSERVE_ONNXRUNTIME_LOAD_SECONDS"):
            probes.check(_tiler(2), 1, 0.01, GRAPH_BYTES)
    assert probes.started == 2
    probes.check(_tiler(2), 1, 60, GRAPH_BYTES)
    assert probes.started == 3
