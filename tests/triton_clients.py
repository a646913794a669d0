"""Triton's example clients (triton-inference-server/client, src/python/examples, as of
tritonclient 2.73) replayed: each function makes the calls its script makes, in its order, and
checks what it checks, raising AssertionError where the script would exit 1. The scripts
themselves are not part of this project (code does not carry over; what they call and expect
does). Where a checkout of them is at hand, the container test runs the real scripts instead
(OPSERVE_TRITON_EXAMPLES); these replays run everywhere else, CI included.

`url` is host:port, as the scripts' -u takes it. `between`, called before each call (each step
of a sequence; before a stream opens), lets a harness hold a replay at a call's boundary: the
container test SIGKILLs a replica there, mid-sequence or mid-control, since a unary call in
flight on a replica killed at that instant is lost whatever the server (the scripts carry no
retry policy, and nginx cannot send a gRPC call again)."""

import queue
import uuid
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

VALUES = [11, 7, 5, 3, 2, 0, 1]
"""The sequence examples' values; each sequence starts with another value before them."""
MODEL_CONTROL_MODELS = ["simple", "simple_int8", "simple_string", "simple_identity",
                        "simple_sequence", "simple_dyna_sequence", "densenet_onnx"]  # fmt: skip
"""The repository simple_http_model_control.py counts (7 models); simple_grpc_model_control.py
counts these and custom_identity_int32 (8)."""
Between = Callable[[], None]


def _nothing() -> None:
    return None


def simple_infer(url: str, door: str, between: Between = _nothing) -> None:
    """simple_http_infer_client.py / simple_grpc_infer_client.py: `simple` adds and subtracts
    two INT32 [1, 16] tensors (twice: with outputs named, and without); over HTTP an unknown
    model is refused with "Request for unknown model"."""
    kind: Any = httpclient if door == "http" else grpcclient
    client = kind.InferenceServerClient(url)
    try:
        in0 = np.arange(16, dtype=np.int32).reshape(1, 16)
        in1 = np.full((1, 16), -1 if door == "http" else 1, dtype=np.int32)
        inputs = [kind.InferInput("INPUT0", [1, 16], "INT32"),
                  kind.InferInput("INPUT1", [1, 16], "INT32")]  # fmt: skip
        inputs[0].set_data_from_numpy(in0)
        inputs[1].set_data_from_numpy(in1)
        named = [kind.InferRequestedOutput("OUTPUT0"), kind.InferRequestedOutput("OUTPUT1")]
        for outputs in (named, None):
            between()
            result = client.infer("simple", inputs, outputs=outputs)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), in0 + in1)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), in0 - in1)
        if door == "http":
            between()
            refused = _refused(lambda: client.infer("wrong_model_name", inputs), "")
            assert refused.message().startswith("Request for unknown model"), refused.message()
    finally:
        client.close()


def _sequence_values(dyna: bool = False) -> list[tuple[str, int | str, list[int]]]:
    """(model, sequence id, values) of the three sequences the scripts send; with -d (dyna)
    the integer ones go to simple_dyna_sequence and the string one, "1002", to
    simple_string_dyna_sequence."""
    if dyna:
        return [("simple_dyna_sequence", 1000, [0, *VALUES]),
                ("simple_dyna_sequence", 1001, [100, *(-v for v in VALUES)]),
                ("simple_string_dyna_sequence", "1002", [20, *(-v for v in VALUES)])]  # fmt: skip
    return [("simple_sequence", 1000, [0, *VALUES]),
            ("simple_sequence", 1001, [100, *(-v for v in VALUES)]),
            ("simple_sequence", str(uuid.uuid4()), [20, *(-v for v in VALUES)])]  # fmt: skip


def _check_sequences(answers: list[list[int]], dyna: bool = False) -> None:
    """The scripts' expectations. Without -d: READY * (INPUT + START) for each request. With
    -d the dyna models add the correlation id to a sequence's last request, and the string
    one accumulates: each answer is its value plus the answer before it (as the scripts
    compute it, from the answer received)."""
    first, second, third = answers
    ended = [0] * len(VALUES)
    if dyna:
        ended[-1] = 1  # the last request (value 1) adds its correlation id
    assert first == [1, *(v + e * 1000 for v, e in zip(VALUES, ended, strict=True))], first
    assert second == [101, *(-v + e * 1001 for v, e in zip(VALUES, ended, strict=True))], second
    if not dyna:
        assert third == [21, *(-v for v in VALUES)], third
        return
    expected = [20] + [-v + third[i] + e * 1002 for i, (v, e) in enumerate(zip(VALUES, ended,
                                                                               strict=True))]  # fmt: skip
    assert third == expected, third


def sequence_sync(url: str, door: str, between: Between = _nothing, dyna: bool = False) -> None:
    """simple_http_sequence_sync_infer_client.py / simple_grpc_sequence_sync_infer_client.py
    (`dyna`: with -d): three sequences, one request after another (unary calls: a load
    balancer spreads them)."""
    kind: Any = httpclient if door == "http" else grpcclient
    client = kind.InferenceServerClient(url)
    try:
        answers = []
        for model, sequence_id, values in _sequence_values(dyna):
            got = []
            for count, value in enumerate(values, 1):
                between()
                data = kind.InferInput("INPUT", [1, 1], "INT32")
                data.set_data_from_numpy(np.full((1, 1), value, dtype=np.int32))
                result = client.infer(model, [data], outputs=[kind.InferRequestedOutput("OUTPUT")],
                                      sequence_id=sequence_id, sequence_start=count == 1,
                                      sequence_end=count == len(values))  # fmt: skip
                got.append(int(result.as_numpy("OUTPUT")[0][0]))
            answers.append(got)
        _check_sequences(answers, dyna)
    finally:
        client.close()


def sequence_stream(url: str, between: Between = _nothing, dyna: bool = False) -> None:
    """simple_grpc_sequence_stream_infer_client.py (`dyna`: with -d): the three sequences sent
    at once on one stream (request ids `<sequence id>_<count>`), the answers sorted by
    sequence."""
    client = grpcclient.InferenceServerClient(url)
    got: queue.Queue[Any] = queue.Queue()
    sequences = _sequence_values(dyna)
    try:
        between()
        client.start_stream(callback=lambda result, error: got.put(error or result))
        for model, sequence_id, values in sequences:
            for count, value in enumerate(values, 1):
                data = grpcclient.InferInput("INPUT", [1, 1], "INT32")
                data.set_data_from_numpy(np.full((1, 1), value, dtype=np.int32))
                client.async_stream_infer(model, [data], request_id=f"{sequence_id}_{count}",
                                          outputs=[grpcclient.InferRequestedOutput("OUTPUT")],
                                          sequence_id=sequence_id, sequence_start=count == 1,
                                          sequence_end=count == len(values))  # fmt: skip
        answers: dict[str, list[int]] = {str(seq): [] for _, seq, _ in sequences}
        for _ in range(sum(len(values) for _, _, values in sequences)):
            item = got.get(timeout=30)
            if isinstance(item, InferenceServerException):
                raise AssertionError(f"a stream request was refused: {item}")
            answers[item.get_response().id.split("_")[0]].append(
                int(item.as_numpy("OUTPUT")[0][0]))  # fmt: skip
        _check_sequences(list(answers.values()), dyna)
    finally:
        client.stop_stream()
        client.close()


def model_control(url: str, door: str, between: Between = _nothing) -> None:
    """simple_http_model_control.py / simple_grpc_model_control.py: the repository index
    counts 7 (HTTP) or 8 (gRPC) models; load `simple`; a malformed override fails to load
    and leaves it serving; an override of max_batch_size 16 shows in its configuration;
    unload; (gRPC) a file: name over NAME_MAX answers INTERNAL "failed to poll from model
    repository" and the server stays live; an unknown model fails to load. It leaves `simple`
    unloaded, as the scripts do."""
    kind: Any = httpclient if door == "http" else grpcclient
    client = kind.InferenceServerClient(url)
    try:
        between()
        index = client.get_model_repository_index()
        count = len(index) if door == "http" else len(index.models)
        assert count == (7 if door == "http" else 8), f"the index lists {count} models"
        between()
        client.load_model("simple")
        assert client.is_model_ready("simple"), "simple is not ready after its load"
        between()
        _refused(lambda: client.load_model(
            "simple", config='"parameters": {"config": {{"max_batch_size": "16"}}}'),
            "failed to load")  # the scripts' malformed override  # fmt: skip
        between()
        client.load_model("simple", config='{"max_batch_size":"16"}')
        between()
        config = client.get_model_config("simple")
        batch = config["max_batch_size"] if door == "http" else config.config.max_batch_size
        assert batch == 16, f"Expect max_batch_size = 16, got: {batch}"
        between()
        client.unload_model("simple")
        assert not client.is_model_ready("simple"), "simple is ready after its unload"
        if door == "grpc":
            between()
            refused = _refused(lambda: client.load_model(
                "simple", config="{}", files={"file:" + "A" * 256: b"a"}),
                "failed to poll from model repository")  # fmt: skip
            assert refused.status() == "StatusCode.INTERNAL", refused.status()
            assert client.is_server_live(), "the server is not live after a refused load"
        between()
        _refused(lambda: client.load_model("wrong_model_name"), "failed to load")
    finally:
        client.close()


def _refused(call: Callable[[], object], words: str) -> InferenceServerException:
    try:
        call()
    except InferenceServerException as refused:
        assert words in str(refused.message()), refused.message()
        return refused
    raise AssertionError(f"expected an error saying {words!r}")


REPLAYS: dict[str, Callable[..., None]] = {
    "simple_http_infer_client.py": partial(simple_infer, door="http"),
    "simple_grpc_infer_client.py": partial(simple_infer, door="grpc"),
    "simple_http_sequence_sync_infer_client.py": partial(sequence_sync, door="http"),
    "simple_grpc_sequence_sync_infer_client.py": partial(sequence_sync, door="grpc"),
    "simple_grpc_sequence_stream_infer_client.py": sequence_stream,
    "simple_http_sequence_sync_infer_client.py -d": partial(sequence_sync, door="http", dyna=True),
    "simple_grpc_sequence_sync_infer_client.py -d": partial(sequence_sync, door="grpc", dyna=True),
    "simple_grpc_sequence_stream_infer_client.py -d": partial(sequence_stream, dyna=True),
    "simple_http_model_control.py": partial(model_control, door="http"),
    "simple_grpc_model_control.py": partial(model_control, door="grpc"),
}
"""Each example script's replay, by the script's name and its flags (`-d`: the dynamic
sequence models, the `oldest` strategy): `replay(url, between=...)`."""
