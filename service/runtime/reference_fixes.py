"""Where onnx.reference (1.23) answers otherwise than the ONNX specification, the exact engine
runs these in its place (ReferenceEvaluator's `new_ops`, which reach subgraphs too). Each
cites the spec; tests/conformance/test_engines_agree.py holds the cases that showed them."""

from typing import Any

import numpy as np
from onnx.reference.op_run import OpRun
from onnx.reference.ops.op_reduce_log_sum_exp import ReduceLogSumExp_18
from onnx.reference.ops.op_softmax import Softmax


class LogSoftmax(Softmax):
    """LogSoftmax-13's function body is `(x - max) - Log(ReduceSum(Exp(x - max)))`; the
    reference takes the log of Softmax, -inf wherever Softmax underflows to 0 (Softmax(1000,
    1) has 0 where the spec's answer is -999)."""

    def _run(self, X: np.ndarray, axis: int | None = None) -> tuple[np.ndarray]:
        if X.size == 0:
            return (X,)
        axis = axis or self.axis  # type: ignore[attr-defined]  # as Softmax reads it
        shifted = X - X.max(axis=axis, keepdims=True)
        total = np.exp(shifted).sum(axis=axis, keepdims=True)
        return ((shifted - np.log(total)).astype(X.dtype),)


class ReduceLogSumExp(ReduceLogSumExp_18):
    """ReduceLogSumExp-18's function body is `ReduceLogSum(Exp(x))`: over values that are
    all -inf, Log(0) = -inf. The reference shifts by the largest finite value, and with none
    it subtracts -inf from -inf: NaN."""

    def _run(self, data: np.ndarray, axes: Any = None, keepdims: int = 1,
             noop_with_empty_axes: int = 0) -> tuple[np.ndarray]:  # fmt: skip
        if data.size == 0 or not np.isneginf(data).any():
            return super()._run(data, axes, keepdims, noop_with_empty_axes)
        axes = self.handle_axes(axes, noop_with_empty_axes)
        shift = np.where(np.isinf(data), -np.inf, data).max(axis=axes, keepdims=True)
        shift = np.where(np.isfinite(shift), shift, 0).astype(data.dtype)  # nothing finite: 0
        total = np.exp(data - shift).sum(axis=axes, keepdims=True, dtype=data.dtype)
        with np.errstate(divide="ignore"):
            result = np.log(total) + shift
        return (result if keepdims else np.squeeze(result, axis=axes),)


class GlobalMaxPool(OpRun):
    """GlobalMaxPool: "The output tensor has the same rank as the input. The first two
    dimensions of output shape are the same as the input (N x C), while the other dimensions
    are all 1." The reference reduces axes (d, d+1) for d spatial dimensions: right for 2,
    and for one it reduces C too ([1, 1, 3] -> [1, 1])."""

    def _run(self, x: np.ndarray) -> tuple[np.ndarray]:
        return (x.max(axis=tuple(range(2, x.ndim)), keepdims=True),)


def corrections(opset: int) -> list[type[OpRun]]:
    """The classes that replace the reference's at the model's default-domain `opset` (the
    versions whose behaviour they implement)."""
    fixed: list[type[OpRun]] = [GlobalMaxPool, LogSoftmax]  # the same before 13: log(softmax)
    if opset >= 18:
        fixed.append(ReduceLogSumExp)
    return fixed
