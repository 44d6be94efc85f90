"""The package's import graph, read with ``ast`` (no module is imported).

tbs is laid out as stages in data-flow order; a stage may import its own and
earlier stages only, so each can be understood, tested and replaced alone, and
no import cycle can form. TensorFlow and JAX are reached only through
``tbs/backends/``, and only its dispatcher (``tbs/backends/__init__.py``) may
tell the backends apart by name. Lazy imports inside functions count too: they
couple the modules just the same.
"""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE_DIR = ROOT / "tbs"

FOUNDATION = ("tbs.errors", "tbs.units", "tbs.schema", "tbs.columns", "tbs.endpoints")
STAGES = ("tbs.backends", "tbs.load", "tbs.capture", "tbs.measure", "tbs.profiles", "tbs.predictions", "tbs.cost",
          "tbs.compare", "tbs.place", "tbs.report")
TOP = ("tbs", "tbs.api", "tbs.loading", "tbs.verbs", "tbs.run", "tbs.checks", "tbs.progress", "tbs.cli", "tbs.cluster", "tbs.__main__", "tbs.testing")
TOP_PACKAGES = ("tbs.cli", "tbs.cluster", "tbs.testing")  # the cluster driver runs whole profiles, like the API
FRAMEWORKS = ("tensorflow", "jax", "jaxlib")
BACKEND_NAMES = ("tensorflow", "jax")
DISPATCHER = "tbs.backends"
NAME_OPS = (ast.Eq, ast.NotEq, ast.Is, ast.IsNot)
MEMBER_OPS = (ast.In, ast.NotIn)


@dataclass(frozen=True)
class Import:
    target: str  # a dotted module name: a tbs module, or the external module as written
    line: int
    type_only: bool = False  # under ``if TYPE_CHECKING:``: never runs, so it cannot close a cycle


@dataclass
class Module:
    name: str
    path: Path
    where: str  # the path as reported: relative to the package's parent folder
    imports: list[Import] = field(default_factory=list)
    name_checks: list[int] = field(default_factory=list)  # lines comparing a value with a backend's name


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def resolve(module: Module, node: ast.ImportFrom, known: set[str]) -> list[str]:
    """The modules ``from X import a, b`` imports: X, or X.a where a is a submodule."""
    base = node.module or ""
    if node.level:
        package = module.name.split(".")
        if module.path.name != "__init__.py":
            package = package[:-1]
        package = package[:len(package) - (node.level - 1)]
        base = ".".join(package + ([base] if base else []))
    targets = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in known]
    if len(targets) < len(node.names):
        targets.append(base)
    return targets


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """ids of the nodes inside ``if TYPE_CHECKING:`` blocks."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        test = getattr(node, "test", None)
        if isinstance(node, ast.If) and (getattr(test, "id", None) == "TYPE_CHECKING"
                                         or getattr(test, "attr", None) == "TYPE_CHECKING"):
            inside.update(id(child) for stmt in node.body for child in ast.walk(stmt))
    return inside


def _dynamic_import(node: ast.Call) -> str | None:
    """``importlib.import_module("x")`` or ``__import__("x")`` with a literal name."""
    func = node.func
    name = getattr(func, "attr", None) or getattr(func, "id", None)
    if name in ("import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant):
        value = node.args[0].value
        return value if isinstance(value, str) else None
    return None


def _names_a_backend(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return node.value in BACKEND_NAMES
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(isinstance(e, ast.Constant) and e.value in BACKEND_NAMES for e in node.elts)
    return False


def _compares_backend_name(node: ast.AST) -> bool:
    """``x == "jax"``, ``"tensorflow" != x``, ``x in ("tensorflow", ...)``, ``case "jax":``."""
    if isinstance(node, ast.MatchValue):
        return _names_a_backend(node.value)
    if not isinstance(node, ast.Compare):
        return False
    sides = [node.left, *node.comparators]
    for op, left, right in zip(node.ops, sides, sides[1:]):
        if isinstance(op, NAME_OPS) and (_names_a_backend(left) or _names_a_backend(right)):
            return True
        if isinstance(op, MEMBER_OPS) and _names_a_backend(right) and not isinstance(right, ast.Constant):
            return True
    return False


def read_module(module: Module, known: set[str]) -> None:
    """Every import of the module (module level, in functions, dynamic) and every backend-name check."""
    tree = ast.parse(module.path.read_text(encoding="utf-8"), str(module.path))
    type_only = _type_checking_nodes(tree)
    for node in ast.walk(tree):
        hidden = id(node) in type_only
        if isinstance(node, ast.Import):
            module.imports += [Import(a.name, node.lineno, hidden) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            module.imports += [Import(t, node.lineno, hidden) for t in resolve(module, node, known)]
        elif isinstance(node, ast.Call) and _dynamic_import(node):
            module.imports.append(Import(_dynamic_import(node), node.lineno, hidden))
        if _compares_backend_name(node):
            module.name_checks.append(getattr(node, "lineno", 0))


def collect(package_dir: Path) -> dict[str, Module]:
    """Every module of the package under ``package_dir``, by dotted name, with its imports read."""
    root = package_dir.parent
    modules = {module_name(p, root): Module(module_name(p, root), p, str(p.relative_to(root)))
               for p in sorted(package_dir.rglob("*.py"))}
    for module in modules.values():
        read_module(module, set(modules))
    return modules


def stage_of(name: str) -> int | None:
    """0 foundation, 1.. the stages in data-flow order, then top; None: in no stage."""
    if name in FOUNDATION:
        return 0
    for rank, stage in enumerate(STAGES, start=1):
        if name == stage or name.startswith(stage + "."):
            return rank
    if name in TOP or any(name.startswith(p + ".") for p in TOP_PACKAGES):
        return len(STAGES) + 1
    return None


def stage_label(rank: int) -> str:
    return "foundation" if rank == 0 else "top" if rank > len(STAGES) else STAGES[rank - 1]


def internal_imports(modules: dict[str, Module]) -> list[tuple[Module, Import]]:
    return [(m, i) for m in modules.values() for i in m.imports if i.target in modules and i.target != m.name]


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (``a -> b -> ... -> a``) per strongly connected component of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan; the graph is a few hundred modules, recursion is fine
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_cycle_in(graph, set(c), c[0]) for c in components]


def _cycle_in(graph: dict[str, set[str]], members: set[str], start: str) -> list[str]:
    """A shortest path from ``start`` back to itself inside one component (breadth first)."""
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(graph.get(node, ()) & members):
                if nxt == start:
                    return paths[node] + [start]
                if nxt not in paths:
                    paths[nxt] = paths[node] + [nxt]
                    following.append(nxt)
        frontier = following
    return [start]


def cycle_violations(modules: dict[str, Module]) -> list[str]:
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for module, imp in internal_imports(modules):
        if not imp.type_only:
            graph[module.name].add(imp.target)
    return ["import cycle: " + " -> ".join(cycle) for cycle in find_cycles(graph)]


def stage_violations(modules: dict[str, Module]) -> list[str]:
    found = []
    for module, imp in internal_imports(modules):
        own, other = stage_of(module.name), stage_of(imp.target)
        if own is not None and other is not None and other > own:
            found.append(f"{module.where}:{imp.line}: {module.name} ({stage_label(own)}) imports "
                         f"{imp.target} ({stage_label(other)}, a later stage)")
    return found


def unstaged_modules(modules: dict[str, Module]) -> list[str]:
    return [f"{m.where}: {m.name} is in no stage (move it into one, or add it to TOP in tests/test_imports.py)"
            for m in modules.values() if stage_of(m.name) is None]


def dangling_imports(modules: dict[str, Module]) -> list[str]:
    """Imports of tbs modules that do not exist (a module moved without its importers)."""
    return [f"{m.where}:{i.line}: {m.name} imports {i.target}, which does not exist"
            for m in modules.values() for i in m.imports
            if (i.target == "tbs" or i.target.startswith("tbs.")) and i.target not in modules]


def framework_violations(modules: dict[str, Module]) -> list[str]:
    found = []
    for module in modules.values():
        if module.name == DISPATCHER or module.name.startswith(DISPATCHER + "."):
            continue
        for imp in module.imports:
            if imp.target.split(".")[0] in FRAMEWORKS:
                found.append(f"{module.where}:{imp.line}: {module.name} imports {imp.target} outside tbs/backends/")
    return found


def name_check_violations(modules: dict[str, Module]) -> list[str]:
    return [f"{m.where}:{line}: {m.name} compares a value with a backend's name (ask the Device or tbs.backends)"
            for m in modules.values() if m.name != DISPATCHER for line in m.name_checks]


def _fail_on(violations: list[str]) -> None:
    assert not violations, f"{len(violations)} violation(s):\n" + "\n".join(violations)


@pytest.fixture(scope="module")
def package() -> dict[str, Module]:
    """The real package, read once (about a second each time): the checks below only read it."""
    return collect(PACKAGE_DIR)


def test_the_real_package_is_read(package):
    assert set(FOUNDATION) <= set(package) and len(package) > 30
    assert sum(len(m.imports) for m in package.values()) > 100


def test_no_import_cycles(package):
    _fail_on(cycle_violations(package))


def test_stages_import_only_their_own_and_earlier_stages(package):
    _fail_on(stage_violations(package))


def test_imported_tbs_modules_exist(package):
    _fail_on(dangling_imports(package))


def test_every_module_belongs_to_a_stage(package):
    _fail_on(unstaged_modules(package))


def test_tensorflow_and_jax_are_imported_only_in_backends(package):
    _fail_on(framework_violations(package))


def test_backends_are_told_apart_by_name_only_in_the_dispatcher(package):
    _fail_on(name_check_violations(package))


SYNTHETIC = {
    "__init__.py": "",
    "errors.py": "from tbs.measure import timing\n",  # foundation importing a stage
    "schema.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from tbs.units import Unit\n",
    "units.py": "from tbs.schema import Status\n",  # with schema's type-only import: no cycle at run time
    "odd.py": "",
    "measure/__init__.py": "",
    "measure/timing.py": "from . import eta\n",
    "measure/eta.py": "def later():\n    from .timing import Timer\n",  # lazy, closes timing -> eta -> timing
    "load/__init__.py": "",
    "load/inputs.py": "def read():\n    from tensorflow.python.framework import ops\n",
    "capture/__init__.py": "",
    "capture/recorder.py": "from ..load import inputs\nfrom tbs.place import solvers\n",
    "place/__init__.py": "",
    "place/solvers.py": "import importlib\nnp = importlib.import_module('jax.numpy')\nfast = backend == 'jax'\n",
    "backends/__init__.py": "import tensorflow\nif name in ('tensorflow', 'jax'):\n    pass\n",
    "backends/jax/__init__.py": "",
    "backends/jax/device.py": "import jax\nmatch kind:\n    case 'tensorflow':\n        pass\n",
    "report/__init__.py": "",
    "report/html.py": "from tbs.schema import Status\nfrom tbs import cli\nimport tbs.report.gone\n",
    "cli/__init__.py": "from tbs.report import html\n",
}


def test_the_checker_catches_each_kind_of_violation(tmp_path):
    for relative, source in SYNTHETIC.items():
        path = tmp_path / "tbs" / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
    modules = collect(tmp_path / "tbs")
    assert sorted(cycle_violations(modules)) == [
        "import cycle: tbs.cli -> tbs.report.html -> tbs.cli",
        "import cycle: tbs.measure.eta -> tbs.measure.timing -> tbs.measure.eta",
    ]
    stages = stage_violations(modules)
    assert len(stages) == 3, stages
    for expected in ("tbs.errors (foundation) imports tbs.measure.timing (tbs.measure",
                     "tbs.capture.recorder (tbs.capture) imports tbs.place.solvers (tbs.place",
                     "tbs.report.html (tbs.report) imports tbs.cli (top"):
        assert any(expected in v for v in stages), expected
    frameworks = framework_violations(modules)
    assert sorted(v.split(": ", 1)[1] for v in frameworks) == [
        "tbs.load.inputs imports tensorflow.python.framework outside tbs/backends/",
        "tbs.place.solvers imports jax.numpy outside tbs/backends/",
    ]
    assert sorted(v.split(":")[0] for v in name_check_violations(modules)) == [
        "tbs/backends/jax/device.py", "tbs/place/solvers.py"]
    assert [v.split(":")[0] for v in unstaged_modules(modules)] == ["tbs/odd.py"]
    assert [v.split(": ", 1)[1] for v in dangling_imports(modules)] == [
        "tbs.report.html imports tbs.report.gone, which does not exist"]


def test_no_module_of_the_package_is_ignored_by_git():
    """A module git ignores works here and is missing from every clone (a '.gitignore' rule once hid tbs/profiles/)."""
    import shutil
    import subprocess

    root = Path(__file__).resolve().parent.parent
    if shutil.which("git") is None or not (root / ".git").exists():
        pytest.skip("not a git checkout")
    files = [str(p.relative_to(root)) for p in (root / "tbs").rglob("*.py")]
    ignored = subprocess.run(["git", "check-ignore", *files], cwd=root, capture_output=True, text=True).stdout.split()
    assert ignored == [], f"git ignores {ignored}: fix .gitignore"


def test_the_tests_shared_setup_starts_no_framework():
    """conftest.py builds no model at collection: tests of fakes and renderers run without TensorFlow."""
    probe = ("import sys; sys.path.insert(0, 'tests'); import conftest; "
             "started = [m for m in ('keras', 'tensorflow', 'jax') if m in sys.modules]; "
             "assert not started, started")
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
