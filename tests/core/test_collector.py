"""What start-up made is frozen out of Python's full garbage collections (OPSERVE_GC_FREEZE,
service/kernels/collector.py), and collected and frozen again when a model is freed: a full
collection walks only what came after."""

import gc
import time
import warnings
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from service.kernels import collector
from service.kernels.collector import REFREEZE_SECONDS
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
    """This process (pytest's) given back to the collector after the test, once the refreezes
    its models started are done."""
    try:
        yield
    finally:
        while (pending := collector._pending) is not None:
            pending.join()
        gc.unfreeze()
        collector._frozen = False  # models freed in later tests start no refreeze here


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
        # a model freed: what was frozen is collected (REFREEZE_SECONDS later), and what is
        # left frozen again
        deadline = time.monotonic() + 10 * REFREEZE_SECONDS + 5
        while (collected() is not None or not gc.get_freeze_count()) and (
                time.monotonic() < deadline):  # fmt: skip
            time.sleep(0.05)
        assert collected() is None
        assert gc.get_freeze_count() > 10 * len(gc.get_objects())


class _Timers:
    """threading.Timer's stand-in: the timers made, started by hand (`fire`)."""

    def __init__(self) -> None:
        self.made: list[Any] = []

    def __call__(self, seconds: float, function: Any) -> "_Timers":
        self.made.append(function)
        return self

    def start(self) -> None: ...

    def fire(self) -> None:
        self.made[-1]()


def test_models_freed_together_cost_one_collection(monkeypatch: pytest.MonkeyPatch,
                                                   thawed: None) -> None:  # fmt: skip
    """An unload of a model of many versions frees each: they wait for one refreeze, and a
    model freed after it starts the next."""
    timers, refrozen = _Timers(), []
    monkeypatch.setattr(collector.threading, "Timer", timers)
    monkeypatch.setattr(collector, "_pending", None)
    monkeypatch.setattr(collector, "_frozen", True)
    monkeypatch.setattr(collector, "freeze_start_up", lambda: refrozen.append(1) or gc.freeze())
    gc.freeze()
    for _ in range(100):
        collector.refreeze()
    assert len(timers.made) == 1 and refrozen == []
    timers.fire()
    assert refrozen == [1] and collector._pending is None
    collector.refreeze()
    assert len(timers.made) == 2
    timers.fire()  # none left pending


def test_without_the_setting_nothing_is_frozen(thawed: None) -> None:
    gc.unfreeze()
    with TestClient(create_app(Settings(gc_freeze=False))):
        assert gc.get_freeze_count() == 0
