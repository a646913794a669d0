"""The onnxruntime engine's memory estimate (service/engines/onnxruntime/memory.py) where a size follows
a client's values: a ConstantOfShape of its dims, a Resize by its scales, a Range over its
float bounds. Each is sized before the run from the request's values, so a run past
OPSERVE_MAX_GRAPH_BYTES is refused (413) before it allocates, and a small one is claimed.
So does small integer arithmetic on those values (onnxruntime/fold.py). Where it cannot follow
(tests/runtime/unfollowed.py), the run's measured peak is the estimate for the same inputs
afterwards (onnxruntime/resident.py)."""

import time

import numpy as np
import pytest
from onnx import helper

from service.engines.choice import load_ort
from service.errors import PayloadTooLarge
from service.kernels.allocator import trim_heap
from service.settings import Settings

from .models import F, model, value
from .unfollowed import FOLDED, MEASURED, ROW, UNFOLLOWED, arrays

LIMIT = 64 * 1024 * 1024


def _resize() -> bytes:
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="nearest")
    return model([node], [value("x", F, [1, 1, 16, 16]), value("scales", F, [4])],
                 [value("y", F, [None, None, None, None])]).SerializeToString()  # fmt: skip


def _range() -> bytes:
    return model([helper.make_node("Range", ["a", "b", "d"], ["y"])],
                 [value(n, F, []) for n in "abd"], [value("y", F, [None])],
                 ).SerializeToString()  # fmt: skip


def _bounds(a: float, b: float, d: float) -> dict[str, np.ndarray]:
    return {n: np.array(v, np.float32) for n, v in zip("abd", (a, b, d), strict=True)}


@pytest.mark.parametrize(
    ("built", "small", "large", "large_bytes"),
    [
        (_resize, [1, 1, 2, 2], [1, 1, 1000, 1000], 16000 * 16000 * 4),
        (_range, (0, 8, 1), (0, 1e9, 1), 4 * 10**9),
    ],
    ids=["resize_scales", "range_floats"],
)
def test_a_size_from_a_clients_floats_is_known_before_the_run(
    built: object, small: object, large: object, large_bytes: int
) -> None:
    loaded = load_ort(built(), Settings(max_graph_bytes=LIMIT))  # type: ignore[operator]

    def inputs(values: object) -> dict[str, np.ndarray]:
        if built is _range:
            return _bounds(*values)  # type: ignore[misc]
        return {"x": np.ones((1, 1, 16, 16), np.float32),
                "scales": np.array(values, np.float32)}  # fmt: skip

    assert loaded.memory is not None
    peak, whole = loaded.memory.estimate(inputs(small))
    assert whole and peak == (8 * 4 if built is _range else 32 * 32 * 4)
    assert loaded.run(inputs(small)).outputs["y"].size * 4 == peak
    started = time.monotonic()
    with pytest.raises(PayloadTooLarge, match="OPSERVE_MAX_GRAPH_BYTES") as refused:
        loaded.run(inputs(large))
    assert time.monotonic() - started < 1.0  # refused, not run: a run would take seconds
    assert str(large_bytes) in str(refused.value).replace(",", "")


@pytest.mark.parametrize("name", FOLDED)
def test_small_integer_arithmetic_on_a_clients_values_is_followed(name: str) -> None:
    """Abs, Add of two values, Reshape of a client's small numbers: folded before shapes are
    inferred again, so the fill is sized (n floats and the two 4-byte sums' places) and one
    past OPSERVE_MAX_GRAPH_BYTES is refused before it runs."""
    loaded = load_ort(UNFOLLOWED[name]().SerializeToString(), Settings(max_graph_bytes=LIMIT))
    assert loaded.memory is not None
    n = 2 * ROW
    assert loaded.memory.estimate(arrays(name, n)) == (n * 4 + 8, True)
    assert loaded.run(arrays(name, n)).outputs["y"] == n
    started = time.monotonic()
    with pytest.raises(PayloadTooLarge, match="OPSERVE_MAX_GRAPH_BYTES"):
        loaded.run(arrays(name, 2**30))  # 4 GiB
    assert time.monotonic() - started < 1.0


@pytest.mark.parametrize("name", MEASURED)
def test_a_size_the_estimate_cannot_follow_is_measured_after_the_run(name: str) -> None:
    """The estimate counts the fill as nothing and says so (not whole: a branch's values are not
    counted either); once a run has held it, the process's measured peak is the estimate for
    the same inputs (claimed before the next run), up to the graph limit; other inputs keep
    theirs. 64 MiB of floats: over glibc's largest mmap threshold, so the process grows; the
    heap is trimmed first, as the server's idle trim does, since an app made earlier in this
    process raises that threshold and a freed 64 MiB left resident would hold the fill unseen
    (a clean-clone run measured 14 MiB)."""
    trim_heap()
    limit = 256 * 1024 * 1024
    loaded = load_ort(UNFOLLOWED[name]().SerializeToString(), Settings(max_graph_bytes=limit))
    assert loaded.memory is not None
    n = 64 * ROW
    peak, whole = loaded.memory.estimate(arrays(name, n))
    assert not whole and peak < 1024, peak
    assert loaded.run(arrays(name, n)).outputs["y"] == n
    peak, whole = loaded.memory.estimate(arrays(name, n))
    assert not whole and n * 4 * 0.9 < peak <= limit, peak
    assert loaded.memory.estimate(arrays(name, 2 * ROW))[0] < 1024
    loaded.memory.measured(arrays(name, n), 10 * limit, limit)  # a figure over the limit
    assert loaded.memory.estimate(arrays(name, n)) == (limit, False)  # claimed, not refused
