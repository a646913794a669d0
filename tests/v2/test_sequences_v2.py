"""Sequence batching over V2 HTTP, bounded: a flood of sequence ids holds at most
OPSERVE_MAX_SEQUENCES live sequences (here fewer than the model's own 16 slots), refuses the
rest with 503 and Retry-After, and frees a place as soon as a sequence ends. The model's own
bound, the budget and the timer: tests/v2/test_sequence_bounds.py."""

import time
import warnings
from collections.abc import Iterator

import pytest

from service.main import create_app
from service.settings import Settings
from tests.triton_examples import write_repository

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

LIVE = 10  # simple_sequence has 16 slots: 2 instances x max_batch_size 8


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    root = write_repository(tmp_path_factory.mktemp("models"), ["simple_sequence"])
    settings = Settings(model_repository=root, reference_fallback=True, access_log=False,
                        max_sequences=LIVE)  # fmt: skip
    with TestClient(create_app(settings), raise_server_exceptions=False) as test_client:
        yield test_client


def _step(client: TestClient, sequence_id: int, start: bool, end: bool = False) -> object:
    body = {"inputs": [{"name": "INPUT", "shape": [1, 1], "datatype": "INT32", "data": [1]}],
            "parameters": {"sequence_id": sequence_id, "sequence_start": start,
                           "sequence_end": end}}  # fmt: skip
    return client.post("/v2/models/simple_sequence/infer", json=body)


def test_a_flood_of_sequence_ids_is_bounded(client: TestClient) -> None:
    began = time.monotonic()
    answered = [(_step(client, 10_000 + i, start=True).status_code, time.monotonic() - began)
                for i in range(2_000)]  # fmt: skip
    statuses = [status for status, _at in answered]
    assert statuses[:LIVE] == [200] * LIVE
    assert set(statuses[LIVE:]) <= {200, 503} and 503 in statuses[LIVE:]
    # a place frees only once a sequence idled out (10 s): on a busy host the flood can
    # outlast that, and only then may a START past the bound be served
    assert all(at >= 10 for status, at in answered[LIVE:] if status == 200), answered[LIVE:][:5]
    refused = _step(client, 99_999, start=True)
    assert 1 <= int(refused.headers["retry-after"]) <= 10  # the idle time: 10 s
    assert "OPSERVE_MAX_SEQUENCES" in refused.json()["error"]
    ended = _step(client, 10_000, start=False, end=True)  # one ends: its place is free
    assert ended.status_code == 200
    assert _step(client, 99_999, start=True).status_code == 200
    assert _step(client, 10_000, start=False).status_code == 400  # ended: needs a START
