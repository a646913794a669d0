"""Hostile V2 bodies: each gets a clean 4xx with `{"error": "<text>"}`, never a 5xx, and no
size is trusted before it is checked against what the body holds and the limits."""

import gzip
import json
import struct
import warnings
import zlib
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.main import create_app
from service.settings import Settings

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

LIMIT = 1 << 20
URL = "/v2/models/Tile/versions/13/infer"


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with TestClient(create_app(Settings(max_request_bytes=LIMIT))) as test_client:
        yield test_client


def _binary(
    inputs: list[dict[str, Any]], data: bytes, header_extra: int = 0
) -> tuple[bytes, dict[str, str]]:
    header = json.dumps({"inputs": inputs}).encode()
    return header + data, {"Inference-Header-Content-Length": str(len(header) + header_extra)}


def _tensor(name: str, datatype: str, shape: list[int], size: int) -> dict[str, Any]:
    return {
        "name": name,
        "datatype": datatype,
        "shape": shape,
        "parameters": {"binary_data_size": size},
    }


FLOATS = struct.pack("<6f", 1, 2, 3, 4, 5, 6)
REPEATS = struct.pack("<2q", 2, 2)
GOOD = [_tensor("input", "FP32", [2, 3], 24), _tensor("repeats", "INT64", [2], 16)]


def _refused(client: TestClient, status: int, words: str, body: bytes, headers: dict[str, str] | None = None,
             url: str = URL) -> None:  # fmt: skip
    answer = client.post(url, content=body, headers=headers or {})
    assert answer.status_code == status, answer.text
    assert answer.headers["content-type"] == "application/json"
    error = answer.json()["error"]
    assert isinstance(error, str) and words in error, error
    if "inputs" in error:  # located as on v1: `Tile-13: inputs.<name>: <what>`
        assert error.startswith(f"{url.split('/')[3]}-{url.split('/')[5]}: "), error


def test_the_good_binary_body_runs(client: TestClient) -> None:
    body, headers = _binary(GOOD, FLOATS + REPEATS)
    assert client.post(URL, content=body, headers=headers).status_code == 200


@pytest.mark.parametrize(("extra", "value"), [(10_000, None), (0, "-5"), (0, "12abc"), (0, "0")])
def test_header_length_must_lie_within_the_body(
    client: TestClient, extra: int, value: str | None
) -> None:
    body, headers = _binary(GOOD, FLOATS + REPEATS, header_extra=extra)
    if value is not None:
        headers["Inference-Header-Content-Length"] = value
    _refused(client, 400, "Inference-Header-Content-Length", body, headers)


@pytest.mark.parametrize(("inputs", "data", "words"), [
    (GOOD, FLOATS, "more than the 0 bytes of binary data left"),
    (GOOD, FLOATS + REPEATS + b"\x00", "1 bytes of binary data after"),
    ([_tensor("input", "FP32", [2, 3], 20), _tensor("repeats", "INT64", [2], 20)],
     FLOATS + REPEATS, "binary_data_size is 20 bytes but shape [2, 3] of float needs 24"),
    ([_tensor("input", "FP32", [2, 3], -1), GOOD[1]], FLOATS + REPEATS, "non-negative integer"),
    ([_tensor("input", "FP32", [2**40, 2**40], 0), GOOD[1]], REPEATS, "over the limit"),
    ([_tensor("input", "BYTES", [1], 6), GOOD[1]], struct.pack("<I", 99) + b"ab" + REPEATS,
     "says 99 bytes, past the end"),
    ([_tensor("input", "BYTES", [50_000_000], 4), GOOD[1]], b"\x00" * 4 + REPEATS,
     "cannot hold 50000000 elements"),
    ([_tensor("input", "BYTES", [2], 8), GOOD[1]], struct.pack("<I", 1) + b"abcd" + REPEATS,
     "element 1 has no length prefix"),
    ([_tensor("input", "FP99", [1], 4), GOOD[1]], FLOATS[:4] + REPEATS, "unknown datatype 'FP99'"),
])  # fmt: skip
def test_binary_sizes_are_checked(client: TestClient, inputs: list[dict[str, Any]], data: bytes,
                                  words: str) -> None:  # fmt: skip
    body, headers = _binary(inputs, data)
    status = 413 if "over the limit" in words else 400
    _refused(client, status, words, body, headers)


@pytest.mark.parametrize(("body", "words"), [
    (b"{", "not valid JSON"),
    (b'{"inputs": {}}', "inputs: Input should be a valid array"),
    (b'{"inputs": [{"name": "input", "datatype": "FP32", "shape": [-1], "data": [1]}]}',
     "greater than or equal to 0"),
    (b'{"inputs": [{"name": "input", "datatype": "FP32", "shape": [2], "data": [1]}]}',
     "data has shape [1] (1 elements) but shape is [2]"),
    (b'{"inputs": [{"name": "input", "datatype": "FP32", "shape": [1]}]}', "But no field is set"),
    (b'{"inputs": [], "parameters": {"classification": 2}}', "classification"),
    (b'{"inputs": [], "parameters": {"bogus": [1]}}', "parameters.bogus"),
    (b'{"inputs": [], "parameters": {"binary_data_output": 1}}', "must be true or false"),
    (b'{"inputs": [], "outputs": [{"name": "output", "parameters": {"binary_data": "yes"}}]}',
     "outputs.output: binary_data must be true or false"),
])  # fmt: skip
def test_bad_json_headers(client: TestClient, body: bytes, words: str) -> None:
    _refused(client, 400, words, body)


def test_a_gzip_bomb_is_refused_once_past_the_body_limit(client: TestClient) -> None:
    bomb = gzip.compress(b"\x00" * (64 * LIMIT))  # 64 MiB of zeros in about 64 KiB
    assert len(bomb) < LIMIT
    _refused(client, 413, "decompressed body is over the limit", bomb, {"Content-Encoding": "gzip"})


@pytest.mark.parametrize(("coding", "body", "status", "words"), [
    ("gzip", gzip.compress(b"{}", mtime=0)[:-4], 400, "truncated"),
    ("deflate", b"not zlib at all", 400, "cannot be decompressed"),
    ("deflate", zlib.compress(b"{}") + b"junk", 400, "bytes after its end"),
    ("br", b"{}", 415, "Content-Encoding 'br' is not supported"),
])  # fmt: skip
def test_bad_compressed_bodies(
    client: TestClient, coding: str, body: bytes, status: int, words: str
) -> None:
    _refused(client, status, words, body, {"Content-Encoding": coding})


@pytest.mark.parametrize("content_type", ["application/x-www-form-urlencoded",
                                          "multipart/form-data; boundary=x", "text/plain"])  # fmt: skip
def test_browser_simple_content_types_are_refused(client: TestClient, content_type: str) -> None:
    body, headers = _binary(GOOD, FLOATS + REPEATS)
    _refused(client, 415, "is not accepted", body, {**headers, "Content-Type": content_type})


def test_a_declared_body_over_the_limit_is_refused_unread(client: TestClient) -> None:
    _refused(client, 413, "over the limit", b"x" * (LIMIT + 1))


@pytest.mark.parametrize(("method", "url", "status", "words"), [
    ("GET", URL, 405, "Method Not Allowed"),
    ("POST", "/v2/models/Tile/versions/13", 405, "Method Not Allowed"),
    ("GET", "/v2/models/Tile/versions/x13", 404, "Request for unknown model: 'Tile' version "
     "'x13' is not found"),
    ("GET", "/v2/models/Tile/versions/99", 404, "Request for unknown model: 'Tile' version 99 "
     "is not found"),
    ("GET", "/v2/models/Tile/nope", 404, "Not Found"),
    ("GET", "/v2/models", 404, "Not Found"),
    ("GET", "/v2/", 404, "Not Found"),
    ("DELETE", "/v2/health/live", 405, "Method Not Allowed"),
    ("GET", "/v2/models/Nope/ready", 404, "Request for unknown model: 'Nope' is not found"),
])  # fmt: skip
def test_routes_and_methods(
    client: TestClient, method: str, url: str, status: int, words: str
) -> None:
    answer = client.request(method, url)
    assert answer.status_code == status and words in answer.json()["error"], answer.text
    if status == 405:
        assert answer.headers["allow"] == ("POST" if url == URL else "GET")


_HEADER = json.dumps({"inputs": [_tensor("input", "BYTES", [2], 12), GOOD[1]]}).encode()


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    cut=st.integers(0, len(_HEADER) + 40),
    noise=st.binary(max_size=40),
    length=st.one_of(
        st.none(),
        st.integers(-5, len(_HEADER) + 60).map(str),
        st.text(st.characters(min_codepoint=33, max_codepoint=126), max_size=5),
    ),
)
def test_mangled_bodies_never_get_a_5xx(client: TestClient, cut: int, noise: bytes,
                                        length: str | None) -> None:  # fmt: skip
    """A valid binary request cut, padded with noise and given any header length."""
    body = (_HEADER + struct.pack("<I", 4) + b"abcd" + REPEATS)[:cut] + noise
    headers = {} if length is None else {"Inference-Header-Content-Length": length}
    answer = client.post(URL, content=body, headers=headers)
    assert answer.status_code < 500 and (answer.status_code == 200 or "error" in answer.json())


def test_a_missing_tensor_attribute_is_named_as_an_input(client: TestClient) -> None:
    _refused(client, 400, "Constant-1: inputs.value: Field required", b'{"inputs": []}',
             url="/v2/models/Constant/versions/1/infer")  # fmt: skip
