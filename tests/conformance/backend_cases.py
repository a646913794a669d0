"""The onnx backend node test cases of the served operators, generated once per machine: onnx
makes them by running its reference kernels (10 s on a quiet machine, 20-40 s in a full run), and
every test process that collects a file using them paid that (both xdist workers, each run), so
they are kept pickled in the tests' cache folder, per onnx, numpy and Python version."""

import os
import pickle
import sys
from functools import cache

import numpy as np
import onnx
from onnx.backend.test.case.node import collect_testcases
from onnx.backend.test.case.test_case import TestCase

from tests.cache_folder import locked

OPERATORS = ("Constant", "ConstantOfShape", "RandomUniformLike", "Shape", "Tile")


@cache
def all_node_cases() -> tuple[TestCase, ...]:
    """Every onnx backend node case (about 1,900): from the cache folder, else generated and
    kept there (a lock keeps parallel test processes from generating them twice)."""
    python = f"{sys.version_info.major}{sys.version_info.minor}"
    name = f"onnx-{onnx.__version__}-numpy-{np.__version__}-py{python}-node-cases"
    with locked(name) as folder:
        kept = folder / f"{name}.pickle"
        if kept.exists():
            with kept.open("rb") as file:
                return tuple(pickle.load(file))
        cases = _generated()
        partial = kept.with_suffix(f".{os.getpid()}")  # renamed whole: never read half written
        partial.write_bytes(pickle.dumps(cases, protocol=pickle.HIGHEST_PROTOCOL))
        partial.replace(kept)
        return cases


def _generated() -> tuple[TestCase, ...]:
    import warnings

    with warnings.catch_warnings():  # generating other operators' cases warns about overflows
        warnings.simplefilter("ignore")
        return tuple(collect_testcases(None))


@cache
def backend_cases() -> tuple[TestCase, ...]:
    """Every one-node case whose node is one of OPERATORS, in name order."""
    cases = all_node_cases()
    return tuple(
        sorted(
            (
                case
                for case in cases
                if case.model is not None
                and len(case.model.graph.node) == 1
                and case.model.graph.node[0].op_type in OPERATORS
            ),
            key=lambda case: case.name,
        )
    )


def opset(case: TestCase) -> int:
    """The default-domain opset the case's model imports."""
    return next(o.version for o in case.model.opset_import if o.domain in ("", "ai.onnx"))
