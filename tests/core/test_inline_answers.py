"""What an inline attempt on a model may not do, and so hands to a thread (RunOffLoop): write a
long JSON answer on the event loop (kernels/context.py's INLINE_JSON_ANSWER_BYTES), or wait for
the isolated workers' pool from the loop (a second worker run in one attempt: an ensemble of
isolated steps; a model other than the one the worker's reply is for). Each such request is
answered as on a thread."""

import pickle
from pathlib import Path

import numpy as np
import onnx
import pytest
from fastapi.testclient import TestClient
from onnx import TensorProto, helper

from service.codecs.limits import SMALL_BYTES
from service.engines.workers.on_loop import Answered
from service.kernels.context import (
    INLINE_JSON_ANSWER_BYTES,
    INLINE_STRINGS,
    KernelContext,
    RunOffLoop,
)
from service.main import create_app
from service.settings import Settings
from tests.runtime.models import chained_steps
from tests.v2.binary_calls import binary_call, binary_output

INLINE = KernelContext(1 << 30, SMALL_BYTES, output_format="json")  # as an inline attempt's
# float32 values whose JSON text could pass the bound (up to 16 bytes a value, as bounded)
LONG = np.ones(INLINE_JSON_ANSWER_BYTES // 8, np.float32)


def test_a_long_json_answer_is_written_on_a_thread_not_inline() -> None:
    with pytest.raises(RunOffLoop):
        INLINE.check_answer(LONG)
    INLINE.check_answer(LONG[:1024])  # short: written inline
    for form in ("v2_binary", "tensor_proto"):  # copies: the inline allowance holds
        INLINE.for_format(form).check_answer(LONG)
    KernelContext(1 << 30, None, output_format="json").check_answer(LONG)  # on a thread


@pytest.mark.parametrize("form", ["tensor_proto", "v2_binary"])
def test_many_strings_in_a_binary_form_are_written_on_a_thread_not_inline(form: str) -> None:
    """Strings go into a TensorProto or V2 binary data one element at a time in Python
    (131,072 empty strings as tensor_proto held the event loop 27-31 ms): past INLINE_STRINGS
    an inline attempt hands them to a thread, whether their output was reserved before the
    run (`reserve`) or checked after it (`check_answer`); as JSON (orjson, in C) they stay."""
    many = np.array([""] * (INLINE_STRINGS + 1), dtype=object)
    inline = INLINE.for_format(form)
    with pytest.raises(RunOffLoop):
        inline.check_answer(many)
    with pytest.raises(RunOffLoop):
        inline.reserve(many.shape, many.dtype)
    inline.check_answer(many[:INLINE_STRINGS])  # at the bound: written inline
    inline.reserve((INLINE_STRINGS,), many.dtype)
    INLINE.check_answer(many)  # JSON: its byte bound, which a short string's text is within
    KernelContext(1 << 30, None, output_format=form).check_answer(many)  # on a thread


def _reply(y: np.ndarray) -> bytes:
    return pickle.dumps(("ok", {"outputs": {"y": ("value", y)}, "nodes": [], "trace": None}))


def test_a_workers_reply_is_taken_inline_only_for_its_model_once_and_short() -> None:
    """The reply answers its own model's run once; another model's run, a second run, or an
    answer too long to write inline raises RunOffLoop (the pool is never waited on from the
    loop), and the long reply is not used up: the thread's attempt takes it."""
    mine, other = object(), object()
    y = np.arange(4, dtype=np.float32)
    answered = Answered(None, mine, _reply(y), None, 0)  # type: ignore[arg-type]
    with pytest.raises(RunOffLoop):
        answered.run(other, {}, None, False, INLINE)  # type: ignore[arg-type]
    np.testing.assert_array_equal(answered.run(mine, {}, None, False, INLINE).outputs["y"], y)  # type: ignore[arg-type]
    with pytest.raises(RunOffLoop):  # used up: a second run in the same attempt
        answered.run(mine, {}, None, False, INLINE)  # type: ignore[arg-type]
    long = Answered(None, mine, _reply(LONG), None, 0)  # type: ignore[arg-type]
    with pytest.raises(RunOffLoop):
        long.run(mine, {}, None, False, INLINE)  # type: ignore[arg-type]
    on_thread = KernelContext(1 << 30, None, output_format="json")
    taken = long.run(mine, {}, None, False, on_thread)  # type: ignore[arg-type]
    np.testing.assert_array_equal(taken.outputs["y"], LONG)


def test_an_ensemble_of_steps_in_the_workers_answers_over_small_calls(tmp_path: Path) -> None:
    """One, two and three chained steps of a model in the isolated workers (Neg): each answer
    is the input negated once per step (two or more steps were a 500 on every small call)."""
    f = TensorProto.FLOAT
    graph = helper.make_graph([helper.make_node("Neg", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", f, [4])],
                              [helper.make_tensor_value_info("y", f, [4])])  # fmt: skip
    io = ('input [{name: "x" data_type: TYPE_FP32 dims: [4]}]\n'
          'output [{name: "y" data_type: TYPE_FP32 dims: [4]}]\n')  # fmt: skip
    (tmp_path / "neg" / "1").mkdir(parents=True)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
              tmp_path / "neg" / "1" / "model.onnx")  # fmt: skip
    (tmp_path / "neg" / "config.pbtxt").write_text(
        f'max_batch_size: 0\n{io}parameters {{ key: "isolated" value {{ string_value: "true" }} }}\n'
    )
    for steps in (1, 2, 3):
        (tmp_path / f"chain{steps}" / "1").mkdir(parents=True)
        (tmp_path / f"chain{steps}" / "config.pbtxt").write_text(
            f'platform: "ensemble"\nmax_batch_size: 0\n{io}'
            + chained_steps("neg", steps, ("x", "y"))
        )
    x = [1.0, 2.0, 3.0, 4.0]
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [4], "data": x}]}
    with TestClient(create_app(Settings(model_repository=tmp_path, access_log=False))) as client:
        for steps in (1, 2, 3, 2, 3):
            answer = client.post(f"/v2/models/chain{steps}/infer", json=body)
            assert answer.status_code == 200, answer.text
            assert answer.json()["outputs"][0]["data"] == [v * (-1) ** steps for v in x]


def test_a_workers_answer_compressed_on_a_thread_keeps_its_run_in_compute_infer(
    tmp_path: Path,
) -> None:
    """A small call on a model in the isolated workers whose answer is too long to compress on
    the event loop: the worker's run (awaited on the loop) still counts in compute_infer, not
    in the queue, and the thread only compresses the reply's outputs."""
    f = TensorProto.FLOAT
    graph = helper.make_graph([helper.make_node("Tile", ["x", "r"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", f, [1024]),
                               helper.make_tensor_value_info("r", TensorProto.INT64, [1])],
                              [helper.make_tensor_value_info("y", f, ["n"])])  # fmt: skip
    (tmp_path / "tile" / "1").mkdir(parents=True)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
              tmp_path / "tile" / "1" / "model.onnx")  # fmt: skip
    (tmp_path / "tile" / "config.pbtxt").write_text(
        'parameters { key: "isolated" value { string_value: "true" } }\n'
    )
    x = np.arange(1024, dtype=np.float32)
    r = np.array([64], np.int64)  # 256 KiB out
    call = binary_call({"x": x, "r": r}, "y")

    def stats(client: TestClient) -> dict:
        answer = client.get("/v2/models/tile/stats").json()
        return answer["model_stats"][0]["inference_stats"]

    with TestClient(create_app(Settings(model_repository=tmp_path, access_log=False))) as client:
        for _ in range(3):  # the first run sends the model to a worker, on a thread
            assert client.post("/v2/models/tile/infer", **call).status_code == 200
        before = stats(client)
        answer = client.post("/v2/models/tile/infer", **call)
        after = stats(client)
    assert answer.status_code == 200 and answer.headers["content-encoding"] == "gzip"
    np.testing.assert_array_equal(binary_output(answer), np.tile(x, 64))
    queue, infer = (after[k]["ns"] - before[k]["ns"] for k in ("queue", "compute_infer"))
    assert infer > queue, (queue, infer)  # the run: 1-5 ms; the queue before it: microseconds
