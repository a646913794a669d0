"""The onnx backend node test cases of the served operators, collected once per process."""

from functools import cache

from onnx.backend.test.case.node import collect_testcases
from onnx.backend.test.case.test_case import TestCase

OPERATORS = ("Constant", "ConstantOfShape", "RandomUniformLike", "Shape", "Tile")


@cache
def all_node_cases() -> tuple[TestCase, ...]:
    """Every onnx backend node case (about 1,900), generated once per process (about 12 s)."""
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
