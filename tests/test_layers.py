"""The floors import one way: the core (service/core) knows nothing of HTTP or gRPC, and the
wire contract (api_schemas) nothing of the server."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
FORBIDDEN = {
    "service/core": ("starlette", "fastapi", "grpc", "uvicorn", "service.api", "service.grpc"),
    "service/runtime": ("starlette", "fastapi", "grpc", "service.api", "service.core"),
    "api_schemas": ("service", "fastapi", "starlette", "numpy", "onnx", "grpc"),
}


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


@pytest.mark.parametrize("floor", sorted(FORBIDDEN))
def test_a_floor_imports_nothing_above_it(floor: str) -> None:
    files = sorted((ROOT / floor).rglob("*.py"))
    assert files
    for path in files:
        for name in _imports(path):
            for banned in FORBIDDEN[floor]:
                assert name != banned and not name.startswith(banned + "."), (
                    f"{path.relative_to(ROOT)} imports {name}"
                )
