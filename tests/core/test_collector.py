"""What start-up made is frozen out of Python's full garbage collections (OPSERVE_GC_FREEZE,
service/kernels/collector.py), and given back when a model is freed: a full collection then
walks only what came after start-up."""

import gc
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from service.main import create_app
from service.settings import Settings
from tests.runtime.models import tiler

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient


@pytest.fixture
def thawed() -> Iterator[None]:
    """This process (pytest's) given back to the collector after the test."""
    try:
        yield
    finally:
        gc.unfreeze()


def test_start_up_freezes_and_a_freed_model_thaws(tmp_path: Path, thawed: None) -> None:
    (tmp_path / "tiler" / "1").mkdir(parents=True)
    (tmp_path / "tiler" / "1" / "model.onnx").write_bytes(tiler([1, 1]))
    settings = Settings(model_repository=tmp_path, model_control_mode="explicit",
                        load_models="tiler", gc_freeze=True)  # fmt: skip
    gc.unfreeze()
    with TestClient(create_app(settings)) as client:
        frozen = gc.get_freeze_count()
        # the model loaded at start-up, and everything else start-up made, are frozen: what a
        # full collection walks is what came after (the test client's own requests)
        assert frozen > 10 * len(gc.get_objects()), (frozen, len(gc.get_objects()))
        assert client.post("/v2/repository/models/tiler/unload").status_code == 200
        assert gc.get_freeze_count() == 0  # the freed model may be garbage in a cycle


def test_without_the_setting_nothing_is_frozen(thawed: None) -> None:
    gc.unfreeze()
    with TestClient(create_app(Settings(gc_freeze=False))):
        assert gc.get_freeze_count() == 0
