"""What start-up made is frozen out of Python's full garbage collections (OPSERVE_GC_FREEZE,
service/kernels/collector.py), and collected and frozen again when a model is freed: a full
collection walks only what came after."""

import gc
import warnings
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest

from service.main import create_app
from service.settings import Settings
from tests.runtime.models import tiler

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient


class _Held:
    """An object in a reference cycle with itself."""

    def __init__(self) -> None:
        self.me = self


@pytest.fixture
def thawed() -> Iterator[None]:
    """This process (pytest's) given back to the collector after the test."""
    try:
        yield
    finally:
        gc.unfreeze()


def test_start_up_freezes_and_a_freed_model_refreezes(tmp_path: Path, thawed: None) -> None:
    (tmp_path / "tiler" / "1").mkdir(parents=True)
    (tmp_path / "tiler" / "1" / "model.onnx").write_bytes(tiler([1, 1]))
    settings = Settings(model_repository=tmp_path, model_control_mode="explicit",
                        load_models="tiler", gc_freeze=True)  # fmt: skip
    gc.unfreeze()
    held = _Held()  # alive through start-up: frozen with what start-up made
    collected = weakref.ref(held)
    with TestClient(create_app(settings)) as client:
        # the model loaded at start-up, and everything else start-up made, are frozen: what a
        # full collection walks is what came after (the test client's own requests)
        assert gc.get_freeze_count() > 10 * len(gc.get_objects())
        del held  # frozen garbage in a cycle now, as a model made at start-up may be once freed
        gc.collect()
        assert collected() is not None  # full collections leave what is frozen alone
        assert client.post("/v2/repository/models/tiler/unload").status_code == 200
        # a model freed: what was frozen was collected, and what is left frozen again
        assert collected() is None
        assert gc.get_freeze_count() > 10 * len(gc.get_objects())


def test_without_the_setting_nothing_is_frozen(thawed: None) -> None:
    gc.unfreeze()
    with TestClient(create_app(Settings(gc_freeze=False))):
        assert gc.get_freeze_count() == 0
