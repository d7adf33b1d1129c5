"""The package's floors (docs/design.md §2.1): a module imports only from its own floor or below, and a student's
``import fuselab`` loads the student runtime alone.

Floors, low to high: foundation, student runtime, labs, speed grading, course operations, grading, tools. The
imports are read from the source (``ast``), lazy ones inside functions included, so a back edge cannot hide in a
function body.
"""

import ast
import importlib
import importlib.util
import subprocess
import sys

from .conftest import REPO

PACKAGE = REPO / "fuselab"

# module name (or package prefix) → floor; the longest matching prefix wins
FLOORS = {
    "fuselab.errors": 0, "fuselab.config": 0, "fuselab.quiet": 0, "fuselab.proctree": 0, "fuselab.notebook": 0,
    "fuselab.notebook_sources": 0, "fuselab.runmode": 0, "fuselab.cell_hints": 0, "fuselab.gpu_facts": 0,
    "fuselab.locks": 0,
    "fuselab": 1,  # the package's __init__: the student's API
    "fuselab.kernelbuild": 1, "fuselab.module": 1, "fuselab.prototypes": 1, "fuselab.toolchain": 1,
    "fuselab.diagnostics": 1, "fuselab.native_check": 1, "fuselab.check": 1, "fuselab.timing": 1, "fuselab.plots": 1,
    "fuselab.labs": 2,
    "fuselab.speed": 3,
    "fuselab.course": 4, "fuselab.doctor": 4,
    "fuselab.grading": 5,
    "fuselab.tools": 6, "fuselab.cli": 6,
}
NAMES = ["foundation", "student runtime", "labs", "speed grading", "course operations", "grading", "tools"]


def floor(module: str) -> int:
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in FLOORS:
            return FLOORS[".".join(parts[:n])]
    raise KeyError(f"{module} has no floor: add it to FLOORS and to docs/design.md §2.1")


def modules() -> dict:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def imports(module: str, path) -> set:
    """The fuselab modules ``module`` imports, resolved (``from . import x`` names the submodule x if it is one)."""
    known = modules()
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            targets = [f"{stem}.{alias.name}" if f"{stem}.{alias.name}" in known else stem for alias in node.names]
        else:
            continue
        found.update(t for t in targets if t.split(".")[0] in ("fuselab", "tests") and t != module)
    return found


def test_every_module_has_a_floor():
    for module in modules():
        floor(module)


def test_no_import_runs_up_a_floor():
    upward = []
    for module, path in sorted(modules().items()):
        for target in sorted(imports(module, path)):
            if target.split(".")[0] == "tests":
                upward.append(f"{module} imports {target}: the package never imports the repository's tests")
            elif floor(target) > floor(module):
                upward.append(f"{module} ({NAMES[floor(module)]}) imports {target} ({NAMES[floor(target)]})")
    assert not upward, "imports that run up a floor:\n" + "\n".join(upward)


def test_every_import_of_the_package_resolves():
    # lazy imports inside functions run only on some paths: a module moved or a name renamed must not wait for one
    missing = []
    for module, path in sorted(modules().items()):
        package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or not (node.level or (node.module or "").startswith("fuselab")):
                continue
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            stem = ".".join(base + ([node.module] if node.module else []))
            try:
                target = importlib.import_module(stem)
            except ImportError as exc:
                missing.append(f"{module}:{node.lineno}: {stem} ({exc})")
                continue
            for alias in node.names:
                if not hasattr(target, alias.name) and not _is_submodule(target, alias.name):
                    missing.append(f"{module}:{node.lineno}: {stem} has no {alias.name}")
    assert not missing, "imports that do not resolve:\n" + "\n".join(missing)


def _is_submodule(package, name) -> bool:
    return hasattr(package, "__path__") and importlib.util.find_spec(f"{package.__name__}.{name}") is not None


def test_the_floor_check_sees_lazy_and_relative_imports(tmp_path):
    # the checker itself: an import inside a function, written relative, is found and resolved
    source = tmp_path / "example.py"
    source.write_text("def f():\n    from ..grading.run import pipeline\n    from .. import speed\n")
    assert imports("fuselab.timing.example", source) == {"fuselab.grading.run.pipeline", "fuselab.speed"}


def test_import_fuselab_loads_the_student_runtime_only():
    code = ("import sys, fuselab; fuselab.check; fuselab.build; fuselab.timing.compare\n"
            "print('\\n'.join(m for m in sys.modules if m.startswith('fuselab')))")
    loaded = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    above = [m for m in loaded.stdout.split() if floor(m) > FLOORS["fuselab"]]
    assert not above, f"import fuselab loaded modules above the student runtime: {above}"


def test_a_speed_cell_finds_the_speed_test_after_import_fuselab():
    code = ("import fuselab; print(fuselab.speed.speedup_test.__module__)\n"
            "print(hasattr(fuselab, 'grade'))")  # no second name for it
    loaded = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert loaded.stdout.split() == ["fuselab.speed.graded", "False"]


def import_cycles() -> list:
    """Cycles of imports among the package's modules (a package's ``__init__`` left out: it gathers its own
    submodules, and a submodule taking a shared helper from it is no cycle of roles)."""
    known = modules()
    leaves = {m: p for m, p in known.items() if p.name != "__init__.py"}
    graph = {m: sorted(t for t in imports(m, p) if t in leaves) for m, p in leaves.items()}
    cycles, state = [], {}

    def visit(node, path):
        state[node] = "open"
        for target in graph[node]:
            if state.get(target) == "open":
                cycles.append(path[path.index(target):] + [target])
            elif target not in state:
                visit(target, path + [target])
        state[node] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    return cycles


def test_no_import_cycle():
    cycles = import_cycles()
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


# the grader's rooms, low to high (docs/design.md §2.3): a room imports only from its own room or those below
ROOMS = {"sandbox": 0, "gpus": 1, "recheck": 2, "records": 3, "outputs": 4, "run": 5}


def test_no_import_runs_up_a_room():
    upward = []
    for module, path in sorted(modules().items()):
        room = module.split(".")[2] if module.startswith("fuselab.grading.") else None
        if room not in ROOMS:
            continue
        for target in sorted(imports(module, path)):
            there = target.split(".")[2] if target.startswith("fuselab.grading.") else None
            if there in ROOMS and ROOMS[there] > ROOMS[room]:
                upward.append(f"{module} ({room}) imports {target} ({there})")
    assert not upward, "imports that run up a room of the grader:\n" + "\n".join(upward)


def test_every_grading_module_is_in_a_room():
    flat = [m for m in modules() if m.startswith("fuselab.grading.") and m.split(".")[2] not in ROOMS]
    assert not flat, f"grading modules outside a room (docs/design.md §2.3): {flat}"
