"""The package's rooms stand on each other in one order, and no module imports itself round.

Every import of every module under ``src/xpulaunch`` counts, those inside functions too (they
only put the cost off): a lower room never imports a higher one, and the modules' import graph
has no circle. ``docs/ARCHITECTURE.md`` draws the same floors.
"""

from __future__ import annotations

import ast
from pathlib import Path

import xpulaunch

SRC = Path(xpulaunch.__file__).parent

# From the ground up; a room may import its own floor's rooms and those below.
FLOORS = (
    ("errors", "textfiles", "_lazy", "in_worker"),
    ("model",),
    ("core",),
    ("events", "probing", "processes", "integrations"),
    ("joblog", "leases"),
    ("supervisor", "jobqueue"),
    ("launch",),
    ("llamacpp", "api"),
    ("__init__",),
    ("cli",),
    ("__main__",),
)
FLOOR = {room: level for level, rooms in enumerate(FLOORS) for room in rooms}


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def exists(name: str) -> bool:
    relative = Path(*name.split("."))
    return (SRC.parent / relative).with_suffix(".py").is_file() or (
        SRC.parent / relative / "__init__.py"
    ).is_file()


def imports_of(path: Path) -> set[str]:
    """The ``xpulaunch`` modules ``path`` imports, each resolved to the module it loads."""
    package = module_name(path) if path.name == "__init__.py" else module_name(path.parent)
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("xpulaunch"))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            if not base.startswith("xpulaunch"):
                continue
            for alias in node.names:  # `from xpulaunch.x import y`: y may be a module
                sub = f"{base}.{alias.name}"
                found.add(sub if exists(sub) else base)
    return found


def room(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "__init__"
    return parts[1]


def graph() -> dict[str, set[str]]:
    return {module_name(p): imports_of(p) for p in SRC.rglob("*.py")}


def test_every_room_has_a_floor() -> None:
    rooms = {room(m) for m in graph()}
    assert rooms == set(FLOOR), (rooms - set(FLOOR), set(FLOOR) - rooms)


def test_no_room_imports_a_higher_one() -> None:
    upward = sorted(
        f"{module} -> {target}"
        for module, targets in graph().items()
        for target in targets
        if FLOOR[room(target)] > FLOOR[room(module)]
    )
    assert upward == []


def test_no_module_imports_itself_round() -> None:
    edges = graph()
    circles: list[list[str]] = []
    # Tarjan's strongly connected components: any with more than one module is a circle.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(edges.get(node, ())):
            if target not in edges:
                continue
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    assert circles == []


def test_the_check_sees_an_import_inside_a_function() -> None:
    """The checks above would pass on nothing if imports in functions were not read."""
    module = SRC / "cli" / "run_options.py"
    assert "xpulaunch.launch.run" in imports_of(module)  # imported inside launch()
