"""The floors import one way: the core (service/core) knows nothing of HTTP or gRPC, and the
wire contract (api_schemas) nothing of the server."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
DOORS = ("service.api", "service.grpc")
ABOVE_CORE = ("service.telemetry", "service.cluster")
FORBIDDEN = {
    "service/core": ("starlette", "fastapi", "grpc", "uvicorn", *DOORS, *ABOVE_CORE),
    "service/runtime": ("starlette", "fastapi", "grpc", *DOORS, "service.core"),
    "service/engines": ("starlette", "fastapi", "grpc", *DOORS, "service.core", *ABOVE_CORE),
    # cluster mode builds on the core, below the doors; the core never imports it
    "service/cluster": ("starlette", "fastapi", "grpc", "uvicorn", *DOORS),
    "service/telemetry": ("starlette", "fastapi", "grpc", "uvicorn", *DOORS),
    # no door imports another: what two doors share lives below both
    "service/api": ("grpc", "service.grpc"),
    "service/grpc": ("starlette", "fastapi", "uvicorn", "service.api"),
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


def test_no_module_of_the_service_imports_itself_round_a_circle() -> None:
    """Every import counts, those under TYPE_CHECKING and inside functions too: a circle
    means two modules that are one idea, or a piece that belongs below both."""
    modules = {_module_name(path): path for path in (ROOT / "service").rglob("*.py")}
    assert "service.grpc.servicer" in modules
    graph = {name: _service_imports(path, modules) for name, path in modules.items()}
    circles = [circle for circle in _circles(graph) if len(circle) > 1]
    assert not circles, f"modules that import each other: {circles}"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _service_imports(path: Path, modules: dict[str, Path]) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in modules)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.update({node.module} & modules.keys())
            found.update(f"{node.module}.{alias.name}" for alias in node.names
                         if f"{node.module}.{alias.name}" in modules)  # fmt: skip
    return found


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected parts of `graph` (Tarjan's algorithm, without recursion)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        while work:
            node, edges = work[-1]
            step = next(edges, None)
            if step is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    part = []
                    while (member := stack.pop()) != node:
                        part.append(member)
                    found.append([*part, node])
            elif step not in index:
                index[step] = low[step] = len(index)
                stack.append(step)
                work.append((step, iter(sorted(graph[step]))))
            elif step in stack:
                low[node] = min(low[node], index[step])
    return found
