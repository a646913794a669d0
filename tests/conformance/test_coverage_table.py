"""The coverage table committed in docs/operators.md is the one the conformance tables generate."""

import importlib.util
from pathlib import Path
from types import ModuleType

TOOL = Path(__file__).resolve().parents[2] / "tools" / "coverage_table.py"


def _tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("coverage_table", TOOL)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_table_is_generated() -> None:
    tool = _tool()
    text = tool.DOC.read_text()
    committed = text[text.index(tool.BEGIN) : text.index(tool.END) + len(tool.END)]
    assert committed == tool.section(), "run: python tools/coverage_table.py --write"


def test_every_cell_has_an_oracle_and_a_hand_check() -> None:
    tool = _tool()
    from conformance.oracles import cells

    assert all("H" in tool.oracles_of(cell).split() for cell in cells())
