"""The package's rooms stand on each other in one order, and no module imports itself round.

Every import of every module under ``src/xpulaunch`` counts, those inside functions too (they
only put the cost off): a lower room never imports a higher one, and the modules' import graph
has no circle, also through package ``__init__``s: ``from xpulaunch.leases import slots`` runs
``xpulaunch/leases/__init__.py`` first, so that is an arrow to the package's face as well as to
``slots``. (The circle check reads what runs: an import under ``if TYPE_CHECKING:`` is for type
checkers, and the floors check alone counts it.) The pure modules import only pure modules.
``docs/ARCHITECTURE.md`` draws the same floors.
"""

from __future__ import annotations

import ast
import fnmatch
import re
from pathlib import Path

import xpulaunch

SRC = Path(xpulaunch.__file__).parent

# From the ground up; a room may import its own floor's rooms and those below.
FLOORS = (
    ("errors", "textfiles", "_lazy"),
    ("model",),
    ("core", "in_worker", "root_cause"),
    ("events", "probing", "processes", "integrations"),
    ("joblog", "leases"),
    ("supervisor", "jobqueue"),
    ("nodes",),
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


def _type_checking_only(tree: ast.Module) -> set[ast.AST]:
    """The import statements inside ``if TYPE_CHECKING:`` blocks."""
    skipped: set[ast.AST] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                skipped.update(ast.walk(child))
    return skipped


def imports_of(path: Path, *, runtime: bool = False) -> set[str]:
    """The ``xpulaunch`` modules ``path`` imports, each resolved to the module it loads;
    ``runtime``: only those that run (not under ``if TYPE_CHECKING:``)."""
    package = module_name(path) if path.name == "__init__.py" else module_name(path.parent)
    found: set[str] = set()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped = _type_checking_only(tree) if runtime else set()
    for node in ast.walk(tree):
        if node in skipped:
            continue
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


def with_faces(targets: set[str]) -> set[str]:
    """The modules importing ``targets`` runs: each one and every package above it."""
    parts = [t.split(".") for t in targets]
    return {".".join(p[:n]) for p in parts for n in range(1, len(p) + 1)}


def runtime_graph() -> dict[str, set[str]]:
    """What importing each module runs, package faces included (a module's own package is
    already being imported when it runs, so that edge is no news)."""
    edges = {}
    for path in SRC.rglob("*.py"):
        name = module_name(path)
        edges[name] = with_faces(imports_of(path, runtime=True)) - {name}
    return edges


# The pure modules (no OS, no environment, no subprocess, no sleeping) are those ruff's
# banned-api holds to it: pyproject.toml lists them once, as globs under src/xpulaunch.
_PYPROJECT = (SRC.parent.parent / "pyproject.toml").read_text(encoding="utf-8")
_PURE_GLOBS = re.search(r'"!src/xpulaunch/\{([^}]*)\}" = \["TID251"\]', _PYPROJECT)
PURE = tuple(_PURE_GLOBS.group(1).split(",")) if _PURE_GLOBS else ()


def is_pure(module: str) -> bool:
    relative = Path(*module.split(".")[1:])
    files = (f"{relative}.py", f"{relative}/__init__.py")
    return any(fnmatch.fnmatchcase(f, glob) for f in files for glob in PURE)


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


def circles_of(edges: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of ``edges`` (Tarjan's strongly connected components)."""
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
    return circles


def test_no_module_imports_itself_round() -> None:
    """Neither in what runs, package faces included, nor file by file counting every import
    (those for type checkers too: a circle there is a knot for a reader all the same)."""
    assert circles_of(runtime_graph()) == []
    assert circles_of(graph()) == []


def test_the_check_sees_an_import_inside_a_function() -> None:
    """The checks above would pass on nothing if imports in functions were not read."""
    module = SRC / "cli" / "run_options.py"
    assert "xpulaunch.launch.run" in imports_of(module)  # imported inside launch()


def test_the_circle_check_sees_a_package_face() -> None:
    """``from xpulaunch.leases import slots`` runs the package's ``__init__`` too."""
    assert with_faces({"xpulaunch.leases.slots"}) == {
        "xpulaunch",
        "xpulaunch.leases",
        "xpulaunch.leases.slots",
    }


def test_the_pure_rooms_are_listed() -> None:
    """Each feature's pure rules, wherever its room is, are held pure (and every glob finds
    a file: a moved module cannot silently drop out of the list)."""
    for glob in PURE:
        assert list(SRC.glob(glob.replace("**", "**/*.py") if glob.endswith("**") else glob)), glob
    for module in (
        "xpulaunch.core.plan",
        "xpulaunch.core.masks.cuda",
        "xpulaunch.jobqueue.policy",
        "xpulaunch.supervisor.restart",
        "xpulaunch.nodes.settings",
        "xpulaunch.nodes.protocol",
        "xpulaunch.joblog.prometheus",
        "xpulaunch.integrations.accelerate_config",
        "xpulaunch.cli.config_schema",
        "xpulaunch.llamacpp.args",
    ):
        assert is_pure(module), module
    assert not is_pure("xpulaunch.nodes.hub")


def test_pure_modules_import_only_pure_modules() -> None:
    impure = sorted(
        f"{module} -> {target}"
        for module, targets in runtime_graph().items()
        if is_pure(module)
        for target in targets
        if not is_pure(target) and target not in ("xpulaunch", *_faces_of_pure())
    )
    assert impure == []


def _faces_of_pure() -> tuple[str, ...]:
    """The package faces above pure modules, which must stay bare for that to hold (a test
    of their own says so)."""
    return tuple(sorted({f for m in graph() if is_pure(m) for f in with_faces({m}) if f != m}))


def test_the_faces_above_pure_modules_import_nothing() -> None:
    bare = {"xpulaunch", "xpulaunch._lazy"}  # a PEP 562 face imports only the helper
    edges = runtime_graph()
    loud = {face: sorted(edges[face] - bare) for face in ("xpulaunch", *_faces_of_pure())}
    assert {face: found for face, found in loud.items() if found} == {}


def drawing() -> str:
    """The rooms from the top floor down, each with the rooms it imports (any import, those in
    functions and under ``TYPE_CHECKING`` too): ``docs/ARCHITECTURE.md`` shows this text, and
    ``python tests/api/test_layers.py`` prints it after a change."""
    arrows: dict[str, set[str]] = {}
    for module, targets in graph().items():
        here = room(module)
        arrows.setdefault(here, set()).update(room(t) for t in targets if room(t) != here)
    width = max(len(r) for r in FLOOR)
    lines = []
    for level in reversed(range(len(FLOORS))):
        for name in FLOORS[level]:
            shown = "(package face)" if name == "__init__" else name
            below = ", ".join(sorted(arrows.get(name, ()), key=lambda r: (-FLOOR[r], r)))
            lines.append(f"{level:>2}  {shown:<{width + 4}} -> {below}".rstrip(" ->"))
    return "\n".join(lines)


def test_the_architecture_page_shows_the_drawing_of_the_code() -> None:
    page = (SRC.parent.parent / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    assert f"```\n{drawing()}\n```" in page, "run python tests/api/test_layers.py"


if __name__ == "__main__":
    print(drawing())
