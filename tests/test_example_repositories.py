"""The example repositories the project ships (examples/): triton_repository is what
tests/triton_examples.py makes (so the docs' examples and the tests use the same models), and
both load whole, every model ready (the Triton one with the reference fallback)."""

import asyncio
from pathlib import Path

import pytest

from service.runtime.repository import ModelRepository
from service.settings import Settings
from tests.triton_examples import write_repository

ROOT = Path(__file__).parents[1]
TRITON = ROOT / "examples" / "triton_repository"


def test_the_triton_repository_is_what_the_tests_make(tmp_path: Path) -> None:
    names = sorted(p.name for p in TRITON.iterdir())
    write_repository(tmp_path, names)
    shipped = sorted(p.relative_to(TRITON) for p in TRITON.rglob("*") if p.is_file())
    made = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    assert shipped == made
    for path in shipped:  # regenerate with tests.triton_examples.write_repository
        assert (TRITON / path).read_bytes() == (tmp_path / path).read_bytes(), path


@pytest.mark.parametrize(("folder", "fallback"), [("model_repository", False),
                                                  ("triton_repository", True)])  # fmt: skip
def test_every_example_model_is_ready(folder: str, fallback: bool) -> None:
    repository = ModelRepository(ROOT / "examples" / folder,
                                 Settings(reference_fallback=fallback))  # fmt: skip
    asyncio.run(repository.start())
    rows = repository.index(False)
    assert rows and all(row["state"] == "READY" for row in rows), rows
