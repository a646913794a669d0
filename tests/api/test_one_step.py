"""The one-step answer of small v1 calls (operator_lane.OneStep) against the general path: on
generated requests, the same status, headers, body, access-log line, metrics and statistics;
a read that fails, a refusal, an output for a kernel thread and a shutdown go the general
path's way."""

import asyncio
import contextlib
import io
import json
import logging
import sys
from typing import Any

import httpx
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from service.api import observe as observe_module
from service.api.one_step import OneStep
from service.api.operator_lane import ServedPaths
from service.api.send_answer import SLICE_BYTES
from service.api.v2_operator_call import OperatorCall
from service.kernels import random_uniform_like
from service.main import create_app
from service.settings import Settings
from service.telemetry import recorder
from tests.api.test_v2_common_call import SMALL as SMALL_V2
from tests.api.test_v2_common_call import bodies as v2_bodies
from tests.operators.test_common_request import SMALL_TILE, TILE, bodies

PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
VOLATILE = {"time", "duration_ms"}  # of a log line


def _exchange(app: Any, path: str, body: bytes, headers: dict[str, str]) -> dict[str, Any]:
    """One request through `app`: the answer, its log line and what it added to the metrics
    and statistics."""
    stream = io.StringIO()
    metrics, plane = app.state.metrics, app.state.plane
    metrics.add_pending()
    before_series = {k: list(v) for k, v in metrics.series.items()}
    before_stats = {k: (s.success[0], s.fail[0]) for k, s in plane.stats.models.items()}

    async def scenario() -> httpx.Response:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            answer = await client.post(path, content=body, headers=headers)
        app.state.telemetry.flush()
        return answer

    with contextlib.redirect_stdout(stream):
        answer = asyncio.run(scenario())
    (line,) = [json.loads(x) for x in stream.getvalue().splitlines()]
    assert line["request_id"] == answer.headers["x-request-id"]
    series = {k: [a - b for a, b in zip(v, before_series.get(k, [0] * len(v)), strict=True)]
              for k, v in metrics.series.items()}  # fmt: skip
    series = {k: v[:3] for k, v in series.items() if any(v)}  # requests, bytes in and out
    counts = {k: (s.success[0], s.fail[0]) for k, s in plane.stats.models.items()}
    stats = {k: (ok - before_stats.get(k, (0, 0))[0], failed - before_stats.get(k, (0, 0))[1])
             for k, (ok, failed) in counts.items()}  # fmt: skip
    shown = {k for k in answer.headers if k not in ("x-request-id", "date")}
    return {
        "status": answer.status_code,
        "headers": {k: answer.headers[k] for k in sorted(shown)},
        "body": answer.content,
        "line": {k: v for k, v in line.items() if k not in VOLATILE | {"request_id"}},
        "series": series,
        "stats": stats,
    }


def _app(**settings: Any) -> Any:
    app = create_app(Settings(access_log=True, **settings))
    app.state.telemetry = _telemetry_of(app)
    return app


def _telemetry_of(app: Any) -> recorder.Telemetry:
    """The app's Telemetry (flushed by the tests to read its line at once)."""
    found = [c.cell_contents for c in app.entry.__closure__ or ()
             if isinstance(c.cell_contents, recorder.Telemetry)]  # fmt: skip
    assert found, "require_api_keys keeps the telemetry in its closure"
    return found[0]


@pytest.fixture(scope="module")
def apps() -> tuple[Any, Any]:
    return _app(), _app()


def _general(app: Any, monkeypatch: pytest.MonkeyPatch, *args: Any) -> dict[str, Any]:
    with monkeypatch.context() as patch:
        patch.setattr(ServedPaths, "get", lambda self, path: None)
        return _exchange(app, *args)


@PROPERTY
@given(case=bodies(),
       media=st.sampled_from(["application/json", "application/json; charset=utf-8", "text/plain"]),
       rid=st.sampled_from([None, "abc-1", "bad id"]))  # fmt: skip
@example(case=(TILE, SMALL_TILE), media="application/json", rid=None)
@example(case=(TILE, SMALL_TILE.replace(b"[2,2]", b"[2,2,2]")), media="application/json", rid="r")
def test_one_step_answers_as_the_general_path(
    case: tuple, media: str, rid: str | None, apps: tuple[Any, Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    op, body = case
    headers = {"content-type": media} | ({"x-request-id": rid} if rid else {})
    path = f"/v1/ops/{op.op_type}/{op.since_version}"
    one_step, general = apps
    with monkeypatch.context() as patch:  # RandomUniformLike without a seed: the same draws
        seeded = random_uniform_like._generator
        patch.setattr(random_uniform_like, "_generator",
                      lambda seed: seeded(0.0 if seed is None else seed))  # fmt: skip
        assert _exchange(one_step, path, body, headers) == _general(general, monkeypatch, path,
                                                                    body, headers)  # fmt: skip


TILE_V2 = "/v2/models/Tile/versions/13/infer"
SHAPE_V2 = b'{"inputs":[{"name":"data","shape":[2,3],"datatype":"FP32","data":[1,2,3,4,5,6]}]}'
SHAPE_OF = b'{"inputs":[{"name":"input","shape":[2],"datatype":"INT64","data":[2,3]}]}'
REPEATS = b'{"name":"repeats","shape":[2],"datatype":"INT64","data":[2,2]}'


@PROPERTY
@given(body=v2_bodies(),
       path=st.sampled_from(["/v2/models/Tile/versions/13/infer", "/v2/models/Tile/infer",
                             "/v2/models/Shape/versions/21/infer", "/v2/models/Nope/infer",
                             "/v2/models/ConstantOfShape/versions/21/infer",
                             "/v2/models/Constant/versions/21/infer"]),
       media=st.sampled_from(["application/json", "application/octet-stream"]),
       extra=st.sampled_from([{}, {"accept-encoding": "gzip"}, {"accept-encoding": "gzip;q=0"},
                              {"x-request-id": "v2-1"}]))  # fmt: skip
@example(body=SMALL_V2, path="/v2/models/Tile/versions/13/infer", media="application/json",
         extra={})  # fmt: skip
@example(body=SMALL_V2.replace(b"[2,2]", b"[2,2,2]"), path="/v2/models/Tile/versions/13/infer",
         media="application/json", extra={})  # fmt: skip
# the one step's own work (v2_operator_call.py): an id; declined: named outputs, an input
# given twice, Constant's tensor attribute; other operators
@example(body=SMALL_V2[:-1] + b',"id":"a-1"}', path=TILE_V2, media="application/json", extra={})
@example(body=SMALL_V2[:-1] + b',"outputs":[{"name":"output"}]}', path=TILE_V2,
         media="application/json", extra={})  # fmt: skip
@example(body=SMALL_V2[:-1] + b',"outputs":[{"name":"nope"}]}', path=TILE_V2,
         media="application/json", extra={})  # fmt: skip
@example(body=SMALL_V2[:-2] + b"," + REPEATS + b"]}", path=TILE_V2, media="application/json",
         extra={})  # fmt: skip
@example(body=SHAPE_V2, path="/v2/models/Shape/versions/21/infer", media="application/json",
         extra={"x-request-id": "v2-1"})  # fmt: skip
@example(body=SHAPE_OF, path="/v2/models/ConstantOfShape/versions/21/infer",
         media="application/json", extra={})  # fmt: skip
@example(body=b'{"inputs":[{"name":"value","shape":[1],"datatype":"FP32","data":[1.5]}]}',
         path="/v2/models/Constant/versions/21/infer", media="application/json", extra={})  # fmt: skip
def test_one_step_answers_v2_as_the_general_path(
    body: bytes, path: str, media: str, extra: dict[str, str], apps: tuple[Any, Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    headers = {"content-type": media, "accept-encoding": "identity", **extra}  # not httpx's gzip
    one_step, general = apps
    with monkeypatch.context() as patch:
        patch.setattr(type(general.state.plane), "one_step_model", lambda self, n, v: None)
        expected = _exchange(general, path, body, headers)
    assert _exchange(one_step, path, body, headers) == expected


def _binary_body(draw: Any) -> tuple[bytes, int]:
    """A V2 body of the binary extension (JSON, then each input's bytes), as tritonclient.http
    sends one by default, at times with what the one step declines or the general path
    refuses: a parameter that is an attribute, named outputs, sizes that do not add up."""
    op = draw(st.sampled_from(["Tile", "Shape"]))
    dtype = draw(st.sampled_from(["float32", "int64", "uint8", "bool", "float16"]))
    shape = draw(st.lists(st.integers(0, 3), min_size=1, max_size=3))
    data = (np.arange(int(np.prod(shape))) % 2).astype(dtype).reshape(shape)
    name = "input" if op == "Tile" else "data"
    arrays = {name: data}
    if op == "Tile":
        arrays["repeats"] = np.array(draw(st.lists(st.integers(0, 2), min_size=len(shape),
                                                   max_size=len(shape))), dtype=np.int64)  # fmt: skip
    datatypes = {"float32": "FP32", "int64": "INT64", "uint8": "UINT8", "bool": "BOOL",
                 "float16": "FP16"}  # fmt: skip
    inputs = [{"name": k, "shape": list(v.shape), "datatype": datatypes[v.dtype.name],
               "parameters": {"binary_data_size": v.nbytes}} for k, v in arrays.items()]  # fmt: skip
    request: dict[str, Any] = {"inputs": inputs}
    extra = draw(st.sampled_from(["", "", "json out", "no output flag", "id", "attribute",
                                  "outputs", "short", "input parameter"]))  # fmt: skip
    request["parameters"] = {"binary_data_output": extra != "json out"}
    if extra == "no output flag":
        del request["parameters"]
    elif extra == "id":
        request["id"] = "b-1"
    elif extra == "attribute":  # Shape-15's start
        request["parameters"]["start"] = 1
    elif extra == "outputs":  # as tritonclient's examples name them; a wrong name; two
        output = {"name": "output" if op == "Tile" else "shape"}
        flag = draw(st.sampled_from([None, True, False, "yes"]))
        if flag is not None:
            output["parameters"] = {"binary_data": flag}
        request["outputs"] = draw(st.sampled_from([[output], [{"name": "nope"}],
                                                   [output, output]]))  # fmt: skip
    elif extra == "short":
        inputs[0]["parameters"]["binary_data_size"] += 1
    elif extra == "input parameter":
        inputs[0]["parameters"]["custom"] = True
    head = json.dumps(request).encode()
    return head + b"".join(v.tobytes() for v in arrays.values()), len(head)


@PROPERTY
@given(data=st.data(), media=st.sampled_from([None, "application/octet-stream",
                                              "application/json", "text/plain"]),
       version=st.sampled_from(["13", "6", ""]))  # fmt: skip
def test_one_step_answers_binary_v2_as_the_general_path(
    data: Any, media: str | None, version: str, apps: tuple[Any, Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    body, json_length = _binary_body(data.draw)
    op = json.loads(body[:json_length])["inputs"][0]["name"]
    model = "Tile" if op == "input" else "Shape"
    path = (
        f"/v2/models/{model}/versions/{version}/infer" if version else f"/v2/models/{model}/infer"
    )
    if model == "Shape" and version:
        path = path.replace(f"/{version}/", "/15/" if version == "6" else "/21/")
    headers = {"inference-header-content-length": str(json_length),
               "accept-encoding": "identity"} | ({"content-type": media} if media else {})  # fmt: skip
    one_step, general = apps
    with monkeypatch.context() as patch:
        patch.setattr(type(general.state.plane), "one_step_model", lambda self, n, v: None)
        expected = _exchange(general, path, body, headers)
    assert _exchange(one_step, path, body, headers) == expected


def _binary(outputs: Any = None, parameters: Any = None, size: int = 24) -> tuple[bytes, int]:
    """The small Tile-13 call in the binary form, its JSON changed as asked."""
    request: dict[str, Any] = {"inputs": [
        {"name": "input", "shape": [2, 3], "datatype": "FP32",
         "parameters": {"binary_data_size": size}},
        {"name": "repeats", "shape": [2], "datatype": "INT64",
         "parameters": {"binary_data_size": 16}}],
        "parameters": {"binary_data_output": True} if parameters is None else parameters}  # fmt: skip
    if outputs is not None:
        request["outputs"] = outputs
    head = json.dumps(request).encode()
    data = np.arange(1, 7, dtype=np.float32).tobytes() + np.array([2, 2], np.int64).tobytes()
    return head + data, len(head)


@pytest.mark.parametrize(("body", "taken"), [
    (_binary(), True),
    (_binary(outputs=[{"name": "output", "parameters": {"binary_data": True}}]), True),
    (_binary(outputs=[{"name": "output", "parameters": {"binary_data": False}}]), True),
    (_binary(outputs=[{"name": "output"}], parameters={}), True),  # a JSON answer
    (_binary(outputs=[{"name": "nope"}]), False),
    (_binary(outputs=[{"name": "output"}, {"name": "output"}]), False),
    (_binary(outputs=[{"name": "output", "parameters": {"classification": 2}}]), False),
    (_binary(parameters={"binary_data_output": True, "sequence_id": 7}), False),
    (_binary(size=20), False),  # the sizes do not add up: refused by the general path
])  # fmt: skip
def test_binary_cases_answer_as_the_general_path(
    body: tuple[bytes, int], taken: bool, apps: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The binary form's named outputs and parameters, each taken by the one step or declined
    as said, and answered as the general path answers it either way."""
    content, json_length = body
    headers = {"inference-header-content-length": str(json_length), "accept-encoding": "identity"}
    one_step, general = apps
    with monkeypatch.context() as patch:
        patch.setattr(type(general.state.plane), "one_step_model", lambda self, n, v: None)
        expected = _exchange(general, TILE_V2, content, headers)
    made = []
    with monkeypatch.context() as patch:
        original = OperatorCall._binary_answer
        patch.setattr(OperatorCall, "_binary_answer",
                      lambda self, *a: made.append(1) or original(self, *a))  # fmt: skip
        assert _exchange(one_step, TILE_V2, content, headers) == expected
    assert bool(made) == taken


def test_the_small_call_takes_one_step(apps: tuple[Any, Any],
                                       monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """So the property compares two paths: the small Tile never reaches the general path."""
    one_step, _ = apps
    with monkeypatch.context() as patch:
        patch.setattr(type(one_step.state.plane), "infer", None)  # unused by v1 anyway
        calls: list[Any] = []
        observed = _counting_observe(calls)
        _patch_observe(patch, observed)
        answer = _exchange(one_step, "/v1/ops/Tile/13", SMALL_TILE,
                           {"content-type": "application/json"})  # fmt: skip
    assert answer["status"] == 200 and calls == []
    with monkeypatch.context() as patch:
        _patch_observe(patch, observed)
        answer = _exchange(one_step, "/v2/models/Tile/versions/13/infer", SMALL_V2,
                           {"content-type": "application/json",  # httpx asks for gzip else
                            "accept-encoding": "identity"})  # fmt: skip
    assert answer["status"] == 200 and calls == []
    # tritonclient.http's default form: binary inputs and outputs, no Content-Type
    body, json_length = _tritonclient_body()
    with monkeypatch.context() as patch:
        _patch_observe(patch, observed)
        answer = _exchange(one_step, "/v2/models/Tile/versions/13/infer", body,
                           {"inference-header-content-length": str(json_length),
                            "accept-encoding": "identity"})  # fmt: skip
    assert answer["status"] == 200 and calls == []
    head = int(answer["headers"]["inference-header-content-length"])
    output = json.loads(answer["body"][:head])["outputs"][0]
    assert output["parameters"] == {"binary_data_size": 96}
    tiled = np.frombuffer(answer["body"][head:], dtype=np.float32).reshape(4, 6)
    assert (tiled == np.tile(np.arange(1, 7, dtype=np.float32).reshape(2, 3), (2, 2))).all()


def _counting_observe(calls: list[Any]) -> Any:
    """The HTTP door's observe, appending its arguments to `calls` first."""
    original = observe_module.observe

    async def counted(*args: Any) -> None:
        calls.append(args)
        await original(*args)

    return counted


def _patch_observe(patch: pytest.MonkeyPatch, replacement: Any) -> None:
    """`replacement` as observe in every module that took the HTTP door's observe by name (the
    general path is entered through it, from any lane)."""
    original = observe_module.observe
    modules = [m for m in list(sys.modules.values())
               if m is not None and getattr(m, "observe", None) is original]  # fmt: skip
    assert len(modules) >= 4  # observe.py and the lanes that hand requests to it
    for module in modules:
        patch.setattr(module, "observe", replacement)


def _tritonclient_body() -> tuple[bytes, int]:
    """The body tritonclient.http makes for the small Tile-13 call, and its JSON's length."""
    import tritonclient.http as httpclient
    from tritonclient.http._utils import _get_inference_request

    inputs = [httpclient.InferInput("input", [2, 3], "FP32"),
              httpclient.InferInput("repeats", [2], "INT64")]  # fmt: skip
    inputs[0].set_data_from_numpy(np.arange(1, 7, dtype=np.float32).reshape(2, 3))
    inputs[1].set_data_from_numpy(np.array([2, 2], dtype=np.int64))
    body, json_length = _get_inference_request(
        inputs=inputs, request_id="", outputs=None, sequence_id=0, sequence_start=False,
        sequence_end=False, priority=0, timeout=None, custom_parameters=None)  # fmt: skip
    return body, json_length


def test_an_output_for_a_kernel_thread_is_the_general_paths(
    apps: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    large = SMALL_TILE.replace(b"[2,2]", b"[300,300]")  # 2.1 MB of float32: off the loop
    one_step, general = apps
    headers = {"content-type": "application/json"}
    answer = _exchange(one_step, "/v1/ops/Tile/13", large, headers)
    assert answer["status"] == 200 and len(json.loads(answer["body"])["outputs"]["output"]["data"])
    assert answer == _general(general, monkeypatch, "/v1/ops/Tile/13", large, headers)


def test_a_mid_size_answer_takes_one_step_and_a_long_json_one_a_thread(
    apps: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """30,000 float32 (at most 480 KB as JSON) are the one step's; 100,000 (400 KB, at most
    1.6 MB as JSON: one piece, but too long to write on the event loop,
    INLINE_JSON_ANSWER_BYTES) are left to the general path, which makes them on a thread. Both
    answer as the general path does."""
    one_step, general = apps
    headers = {"content-type": "application/json"}
    for count, taken in ((30_000, True), (100_000, False)):
        body = SMALL_TILE.replace(b"[2,3]", b"[1]").replace(b"[1,2,3,4,5,6]", b"[0.5]")
        body = body.replace(b'"shape":[2],"data":[2,2]', b'"shape":[1],"data":[%d]' % count)
        observed: list[Any] = []
        with monkeypatch.context() as patch:
            _patch_observe(patch, _counting_observe(observed))
            answer = _exchange(one_step, "/v1/ops/Tile/13", body, headers)
        assert answer["status"] == 200 and (observed == []) == taken, count
        assert json.loads(answer["body"])["outputs"]["output"]["data"] == [0.5] * count
        assert answer == _general(general, monkeypatch, "/v1/ops/Tile/13", body, headers)


def test_a_one_step_that_fails_is_logged_once_and_answered_by_the_general_path(
    apps: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A bug in a one step's work (here V2's reading of the call) costs the general path's
    answer, and one warning with its traceback per exception type, not silence; a refusal
    logs nothing (the general path answers it in its words)."""
    from service.core import fallback

    one_step, _ = apps
    headers = {"content-type": "application/json", "accept-encoding": "identity"}
    monkeypatch.setattr(fallback, "_logged", set())
    with caplog.at_level(logging.WARNING, logger="opserve"):
        refused = _exchange(one_step, "/v1/ops/Tile/13", SMALL_TILE.replace(b"[2,2]", b"[-1,2]"),
                            {"content-type": "application/json"})  # fmt: skip
        assert refused["status"] == 422 and caplog.records == []

        def broken(self: OperatorCall) -> None:
            raise KeyError("a bug")

        monkeypatch.setattr(OperatorCall, "_call", broken)
        path = "/v2/models/Tile/versions/13/infer"
        answers = [_exchange(one_step, path, SMALL_V2, headers) for _ in range(2)]
    assert [a["status"] for a in answers] == [200, 200]
    (record,) = caplog.records
    assert "KeyError" in record.getMessage() and record.exc_info is not None


BOOLS = 1_000_000  # 1 MB of bool, within the inline allowance; about 5 MB as JSON
LARGE_ANSWER_CALLS = [
    ("/v1/ops/Tile/13", json.dumps({"inputs": {
        "input": {"dtype": "bool", "shape": [1], "data": [True]},
        "repeats": {"dtype": "int64", "shape": [1], "data": [BOOLS]}}}).encode()),
    ("/v2/models/Tile/versions/13/infer", json.dumps({"inputs": [
        {"name": "input", "shape": [1], "datatype": "BOOL", "data": [True]},
        {"name": "repeats", "shape": [1], "datatype": "INT64", "data": [BOOLS]}]}).encode()),
]  # fmt: skip


@pytest.mark.parametrize(("path", "body"), LARGE_ANSWER_CALLS, ids=["v1", "v2"])
def test_an_answer_too_large_for_one_piece_is_made_once(
    apps: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch, path: str, body: bytes
) -> None:
    """An answer sent in slices is the general path's: the one step leaves it before the
    output is made, so its JSON is written once (not made, thrown away and made again)."""
    from service.codecs import v2_json, wire

    one_step, general = apps
    headers = {"content-type": "application/json", "accept-encoding": "identity"}
    written: list[int] = []
    for module in (wire, v2_json):
        original = module.json_data

        def counted(array: Any, et: Any, original: Any = original) -> Any:
            written.append(array.size)
            return original(array, et)

        monkeypatch.setattr(module, "json_data", counted)
    answer = _exchange(one_step, path, body, headers)
    assert written == [BOOLS]
    outputs = json.loads(answer["body"])["outputs"]
    output = outputs["output"] if isinstance(outputs, dict) else outputs[0]
    assert answer["status"] == 200 and output["data"] == [True] * BOOLS
    assert len(answer["body"]) > SLICE_BYTES  # sent in slices
    assert answer == _general(general, monkeypatch, path, body, headers)


def _raw(app: Any, receive: Any, headers: list[tuple[bytes, bytes]],
         cancel_after: float | None = None) -> tuple[list[dict], str]:  # fmt: skip
    """Drive the ASGI app with `receive`; the messages it sent and its log."""
    sent: list[dict] = []
    stream = io.StringIO()

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/v1/ops/Tile/13", "query_string": b"",
             "headers": headers, "client": ("127.0.0.1", 9)}  # fmt: skip

    async def scenario() -> None:
        task = asyncio.ensure_future(app(scope, receive, send))
        if cancel_after is not None:
            await asyncio.sleep(cancel_after)
            task.cancel()
        await task
        app.state.telemetry.flush()

    with contextlib.redirect_stdout(stream):
        asyncio.run(scenario())
    return sent, stream.getvalue()


HEADERS = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(SMALL_TILE))]


@pytest.mark.parametrize("failing", ["http.response.start", "http.response.body"])
def test_a_send_that_fails_is_logged_as_the_general_path_logs_it(
    failing: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """uvloop can raise from a write to a closed transport: the one step still records the
    call, with the status and bytes telemetry.observe records (a review found no line)."""

    async def receive() -> dict:
        return {"type": "http.request", "body": SMALL_TILE, "more_body": False}

    def outcome(app: Any) -> tuple[str | None, dict[str, Any]]:
        stream = io.StringIO()

        async def send(message: dict) -> None:
            if message["type"] == failing:
                raise RuntimeError("the transport is closed")

        scope = {"type": "http", "method": "POST", "path": "/v1/ops/Tile/13", "query_string": b"",
                 "headers": HEADERS, "client": ("127.0.0.1", 9)}  # fmt: skip
        raised = None
        with contextlib.redirect_stdout(stream):
            try:
                asyncio.run(app(scope, receive, send))
            except RuntimeError as exc:
                raised = str(exc)
            app.state.telemetry.flush()
        (line,) = [json.loads(x) for x in stream.getvalue().splitlines()]
        return raised, {k: v for k, v in line.items() if k not in VOLATILE | {"request_id"}}

    one_step = outcome(_app())
    with monkeypatch.context() as patch:
        patch.setattr(ServedPaths, "get", lambda self, path: None)
        general = outcome(_app())
    assert one_step == general
    assert one_step[1]["status"] == 200


def test_a_client_gone_before_its_body_is_logged_499_with_nothing_sent() -> None:
    async def receive() -> dict:
        return {"type": "http.disconnect"}

    sent, log = _raw(_app(), receive, HEADERS)
    assert sent == [] and json.loads(log)["status"] == 499


def test_a_stalled_body_gets_the_general_paths_408() -> None:
    async def receive() -> dict:
        await asyncio.sleep(60)
        return {}

    sent, log = _raw(_app(body_timeout_seconds=0.3), receive, HEADERS)
    assert sent[0]["status"] == 408 and (b"connection", b"close") in sent[0]["headers"]
    assert b"OPSERVE_BODY_TIMEOUT_SECONDS" in sent[1]["body"]
    assert json.loads(log)["status"] == 408


def test_a_call_cut_short_by_shutdown_is_answered_503_and_logged_499() -> None:
    async def receive() -> dict:
        await asyncio.sleep(60)
        return {}

    sent, log = _raw(_app(), receive, HEADERS, cancel_after=0.2)
    assert sent[0]["status"] == 503 and json.loads(log)["status"] == 499


@pytest.mark.parametrize("headers", [
    [(b"content-type", b"application/json"), (b"content-length", b"9" * 5000)],  # int() refuses
    [(b"content-type", b"application/json"), (b"content-length", b"12"), (b"content-length", b"12")],
    [(b"content-type", b"application/json; charset=utf-8"), (b"content-length", b"12")],
    [(b"content-type", b"application/json"), (b"content-length", b"12"),
     (b"content-encoding", b"gzip")],
    [(b"content-type", b"application/json"), (b"content-length", b"%d" % (64 * 1024 + 1))],
])  # fmt: skip
def test_headers_that_ask_for_more_go_the_general_way(headers: list) -> None:
    app = _app()
    one_step = next(c.cell_contents for c in _entry_cells(app) if isinstance(c.cell_contents,
                                                                           OneStep))  # fmt: skip
    assert one_step.small_call({"headers": headers}) is None
    plain = [(b"content-type", b"application/json"), (b"content-length", b"12")]
    # what they differ from
    assert one_step.small_call({"headers": plain}) == (12, None, None, None)


def _one_steps(app: Any) -> dict[bool, OneStep]:
    """The app's two OneSteps, V2's (which takes binary data) under True and v1's under False:
    found in the closures of the entry pipeline."""
    found: dict[bool, OneStep] = {}
    functions = [app.entry]
    while functions:
        for cell in functions.pop().__closure__ or ():
            value = cell.cell_contents
            if isinstance(value, OneStep):
                found[value.binary] = value
            elif callable(value) and getattr(value, "__closure__", None):
                functions.append(value)
    return found


BINARY = [(b"content-length", b"12"), (b"inference-header-content-length", b"8")]


@pytest.mark.parametrize(("media", "extra", "taken"), [
    (None, [], True),  # tritonclient.http sends no Content-Type
    (b"application/octet-stream", [], True),
    (b"application/json", [], True),
    (b"text/plain", [], False),
    (b"application/json; charset=utf-8", [], False),  # the general path reads it
    (None, [(b"inference-header-content-length", b"8")], False),  # given twice
    (None, [(b"content-encoding", b"gzip")], False),
])  # fmt: skip
def test_binary_calls_take_v2s_one_step_only(media: bytes | None, extra: list,
                                             taken: bool) -> None:  # fmt: skip
    steps = _one_steps(_app())
    headers = BINARY + extra + ([(b"content-type", media)] if media else [])
    assert steps[True].small_call({"headers": headers}) == ((12, None, 8, None) if taken else None)
    assert steps[False].small_call({"headers": headers}) is None  # v1 takes no binary data


def test_a_call_that_accepts_compression_takes_the_one_step_unless_its_answer_is_long(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """httpx's clients (the KServe SDK's) accept gzip on every call: V2's one step takes such a
    call, answers it as it is under SHORT_ANSWER_BYTES, compresses it as the general path
    does up to INLINE_COMPRESSED_BYTES, and hands a longer one to the general path (which
    compresses it on a kernel thread). v1 never compresses: the header is not its concern.
    The kernel runs once, but for the long answer (once in the one step, once more on the
    general path)."""
    import service.kernels.tile as tile_module

    runs: list[int] = []
    tile = tile_module.tile

    def counted(*args: Any, **kwargs: Any) -> Any:
        runs.append(1)
        return tile(*args, **kwargs)

    steps = _one_steps(_app())
    headers = [(b"content-type", b"application/json"), (b"content-length", b"12"),
               (b"accept-encoding", b"gzip, deflate")]  # fmt: skip
    assert steps[True].small_call({"headers": headers}) == (12, None, None, b"gzip, deflate")
    assert steps[False].small_call({"headers": headers}) == (12, None, None, None)
    twice = [*headers, (b"accept-encoding", b"br")]  # two lines are one list (RFC 9110, 5.3)
    assert steps[True].small_call({"headers": twice}) == (12, None, None, b"gzip, deflate, br")
    one_step, general = _app(), _app()
    for repeats, taken, coding in ((2, True, None), (200, True, "gzip"), (10_000, False, "gzip")):
        body = json.dumps({"inputs": [
            {"name": "input", "datatype": "FP32", "shape": [2], "data": [1, 2]},
            {"name": "repeats", "datatype": "INT64", "shape": [1], "data": [repeats]}]}).encode()  # fmt: skip
        sent = {"content-type": "application/json", "accept-encoding": "gzip, deflate"}
        observed: list[Any] = []
        runs.clear()
        with monkeypatch.context() as patch:
            _patch_observe(patch, _counting_observe(observed))
            patch.setattr(tile_module, "tile", counted)
            answer = _exchange(one_step, "/v2/models/Tile/versions/13/infer", body, sent)
        assert answer["status"] == 200 and (observed == []) == taken, repeats
        assert len(runs) == (1 if taken else 2), repeats
        assert answer["headers"].get("content-encoding") == coding
        assert json.loads(answer["body"])["outputs"][0]["data"] == [1.0, 2.0] * repeats
        with monkeypatch.context() as patch:
            patch.setattr(type(general.state.plane), "one_step_model", lambda self, n, v: None)
            expected = _exchange(general, "/v2/models/Tile/versions/13/infer", body, sent)
        assert answer == expected


@pytest.mark.parametrize("count", [b"8 ", b"x", b"-8", b"\xc2\xb2", b"9" * 19])
def test_an_odd_json_length_is_the_general_paths(count: bytes) -> None:
    headers = [(b"content-length", b"12"), (b"inference-header-content-length", count)]
    assert _one_steps(_app())[True].small_call({"headers": headers}) is None


def _entry_cells(app: Any) -> list:
    """The cells of the operator shortcut's closure, below the API-key check."""
    cells = [c for c in app.entry.__closure__ or ()]
    inner = next(c.cell_contents for c in cells if callable(c.cell_contents)
                 and getattr(c.cell_contents, "__name__", "") == "entry")  # fmt: skip
    return list(inner.__closure__ or ())


def test_a_repository_model_named_as_an_operator_wins_over_the_one_step(tmp_path: Any) -> None:
    """The one step finds an operator version once per name and version (model_lookup.
    operator_named); a repository model of the operator's name, loaded after that, answers
    from then on, as find_model has it (a repository model wins over an operator)."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Tile", ["x", "r"], ["y"])], "tiler",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, None])],
        [helper.make_tensor("r", TensorProto.INT64, [2], [1, 2])],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    (tmp_path / "Tile" / "1").mkdir(parents=True)
    (tmp_path / "Tile" / "1" / "model.onnx").write_bytes(model.SerializeToString())
    app = create_app(Settings(model_repository=tmp_path, model_control_mode="explicit"))
    repository_call = json.dumps({"inputs": [{"name": "x", "shape": [2, 3], "datatype": "FP32",
                                              "data": [1, 2, 3, 4, 5, 6]}]}).encode()  # fmt: skip
    headers = {"content-type": "application/json", "accept-encoding": "identity"}

    async def scenario() -> list[httpx.Response]:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
                answers = [await client.post("/v2/models/Tile/infer", content=SMALL_V2,
                                             headers=headers)]  # fmt: skip
                answers.append(await client.post("/v2/repository/models/Tile/load"))
                for body in (repository_call, SMALL_V2):
                    answers.append(await client.post("/v2/models/Tile/infer", content=body,
                                                     headers=headers))  # fmt: skip
                return answers

    with contextlib.redirect_stdout(io.StringIO()):
        operator, loaded, repository, refused = asyncio.run(scenario())
    assert operator.status_code == 200 and operator.json()["model_version"] == "13"
    assert loaded.status_code == 200, loaded.text
    assert repository.status_code == 200, repository.text
    answer = repository.json()
    assert answer["model_version"] == "1" and answer["outputs"][0]["shape"] == [2, 6]
    assert refused.status_code == 400 and "input" in refused.json()["error"], refused.text
