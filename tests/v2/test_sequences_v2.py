"""Sequence batching over V2 HTTP, bounded: a flood of sequence ids holds at most
OPSERVE_MAX_SEQUENCES live sequences (here fewer than the model's own 16 slots), refuses the
rest with 503 and Retry-After, and frees a place as soon as a sequence ends. The model's own
bound, the budget and the timer: tests/v2/test_sequence_bounds.py."""

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
IDLE_SECONDS = 3600


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    root = write_repository(tmp_path_factory.mktemp("models"), ["simple_sequence"])
    # Triton's example idles a sequence out after 10 s, which a flood on a busy host can
    # outlast; here no sequence idles out within the test, so every place is freed by an END
    config = root / "simple_sequence" / "config.pbtxt"
    text = config.read_text()
    assert "max_sequence_idle_microseconds: 10000000" in text
    config.write_text(
        text.replace(
            "max_sequence_idle_microseconds: 10000000",
            f"max_sequence_idle_microseconds: {IDLE_SECONDS * 1_000_000}",
        )
    )
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
    statuses = [_step(client, 10_000 + i, start=True).status_code for i in range(1_000)]
    assert statuses[:LIVE] == [200] * LIVE
    assert set(statuses[LIVE:]) == {503}  # no place frees: none ended, none idles out
    refused = _step(client, 99_999, start=True)
    assert 1 <= int(refused.headers["retry-after"]) <= IDLE_SECONDS  # at most the idle time
    assert "OPSERVE_MAX_SEQUENCES" in refused.json()["error"]
    ended = _step(client, 10_000, start=False, end=True)  # one ends: its place is free
    assert ended.status_code == 200
    assert _step(client, 99_999, start=True).status_code == 200
    assert _step(client, 10_000, start=False).status_code == 400  # ended: needs a START
