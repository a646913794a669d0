"""Issue 27, item 3: on every onnx backend node case that both engines run, the onnxruntime
engine's outputs equal the exact engine's (the service's kernels, onnx.reference for the
other nodes), within the case's own tolerances (onnx's backend tests': rtol 1e-3, atol 1e-7
unless the case says), integers, bools and strings exactly. The session is the engine's own
(options, memory plan, run), opened in process: the probe process only guards loading."""

import warnings
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from service.engines.choice import ort_model
from service.engines.onnxruntime.differs import differs
from service.engines.onnxruntime.session import Unsupported, check_types, session_options
from service.errors import ServiceError
from service.runtime.graph import LoadedModel
from service.runtime.plan import checked, load_model
from service.settings import Settings
from tests.conformance.backend_cases import all_node_cases

SETTINGS = Settings(reference_fallback=True)
SHOWN = 20
EXACT_WRONG = {  # where the exact engine, not onnxruntime, misses the expected output
    "test_range_float_type_positive_delta_expanded": "a [2, 1] answer where [2] is expected",
    "test_range_float16_type_positive_delta_expanded": "a [2, 1] answer where [2] is expected",
    "test_range_int32_type_negative_delta_expanded": "a [2, 1] answer where [2] is expected",
}


def _engines(case: Any) -> tuple[LoadedModel, LoadedModel] | None:
    """Both engines' models of the case, or None when either cannot load it."""
    data = case.model.SerializeToString()
    try:
        exact = load_model(data, SETTINGS)
        proto = checked(data, SETTINGS)
        check_types(proto)
        if differs(proto) is not None:
            return None  # the engine puts it on the exact engine (onnxruntime/differs.py)
        session = ort.InferenceSession(data, session_options(1), providers=["CPUExecutionProvider"])
    except (ServiceError, Unsupported, Exception):  # onnxruntime's own errors are plain
        return None
    return exact, ort_model(proto, session, SETTINGS)


def _differs(got: np.ndarray, want: np.ndarray, case: Any) -> str | None:
    if got.dtype != want.dtype or got.shape != want.shape:
        return f"{got.dtype}{list(got.shape)} vs {want.dtype}{list(want.shape)}"
    if want.dtype.kind in "fc":
        close = np.allclose(got.astype(np.float64), want.astype(np.float64), rtol=case.rtol,
                            atol=case.atol, equal_nan=True)  # fmt: skip
        return None if close else "values differ beyond the tolerances"
    if want.dtype == object:
        same = [_text(a) for a in got.reshape(-1)] == [_text(b) for b in want.reshape(-1)]
        return None if same else "strings differ"
    return None if np.array_equal(got, want) else "values differ"


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


@pytest.mark.filterwarnings("ignore")
def test_both_engines_agree_on_the_backend_node_cases() -> None:
    compared, disagreed = 0, []
    for case in all_node_cases():
        if (
            case.model is None
            or not case.data_sets
            or "random" in case.name.lower()
            or case.name in EXACT_WRONG
        ):
            continue  # random ops draw different numbers on each engine
        models = _engines(case)
        if models is None:
            continue
        exact, onnxruntime = models
        names = [info.name for info in case.model.graph.input]
        for inputs, _expected in case.data_sets:
            feeds = dict(zip(names, (np.asarray(a) for a in inputs), strict=False))
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    want = exact.run(feeds).outputs
                got = onnxruntime.run(feeds).outputs
            except ServiceError:
                continue  # an input one of them refuses (a sequence, an optional)
            compared += 1
            for name, array in want.items():
                why = _differs(got[name], array, case)
                if why is not None:
                    disagreed.append(f"{case.name} {name}: {why}")
    assert compared > 1000, compared
    assert not disagreed, f"{len(disagreed)} disagree: " + "; ".join(disagreed[:SHOWN])
