"""The shape of the package's imports, read from the source: no circles between modules, and imports only go down
the floors (STYLE.md's house rules).

Every import counts: at the top of a file, inside a function, and under `if TYPE_CHECKING:`. A package's
`__init__.py` is a module of its own (`draftsmith.eval`); `from draftsmith.eval import metrics` imports both it and
`draftsmith.eval.metrics`.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# The floors, bottom first: a module may import modules of its own floor or of a floor below, never above. A module
# stands on the floor of the longest name here that is itself or a package above it, so the package's own flat
# modules (errors, config, files, sampling, cost, target*, kv_cache, small_batch, sharding, hub) are the bottom floor.
# train and serving both read eval (train validates and ends a pipeline with an eval; serve-sim replays eval's
# traces), and neither reads the other.
FLOORS = [
    ("draftsmith",),
    ("draftsmith.data", "draftsmith.drafters"),
    ("draftsmith.export",),
    ("draftsmith.eval",),
    ("draftsmith.train", "draftsmith.serving"),
    ("draftsmith.cli", "draftsmith.__main__"),
]


def module_files(root: Path, package: str = "draftsmith") -> dict[str, Path]:
    """Module name -> file, for every .py file of `package` under `root` (a package's __init__ named as the package)."""
    modules = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def imported_names(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    """Every dotted name an import statement may load: the module it names and, for `from X import Y`, X.Y."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:  # relative: counted from the importing module's package
        package = module.split(".") if is_package else module.split(".")[:-1]
        anchor = package[: len(package) - node.level + 1]
        base = ".".join(anchor + ([base] if base else []))
    return [base] + [f"{base}.{alias.name}" for alias in node.names]


def import_graph(modules: dict[str, Path], root: Path = ROOT) -> dict[tuple[str, str], str]:
    """(importer, imported) -> where the first such import is (file:line under `root`), between `modules`."""
    edges = {}
    for module, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for name in imported_names(node, module, path.name == "__init__.py"):
                if name in modules and name != module:
                    edges.setdefault((module, name), f"{path.relative_to(root)}:{node.lineno}")
    return edges


def circles(edges) -> list[list[str]]:
    """The groups of modules that import each other, directly or through others (each group sorted)."""
    imports: dict[str, set[str]] = {}
    for importer, imported in edges:
        imports.setdefault(importer, set()).add(imported)

    def reachable(start: str) -> set[str]:
        seen, todo = set(), list(imports.get(start, ()))
        while todo:
            module = todo.pop()
            if module not in seen:
                seen.add(module)
                todo.extend(imports.get(module, ()))
        return seen

    reach = {module: reachable(module) for module in imports}
    groups = {frozenset({module} | {other for other in reach[module] if module in reach.get(other, ())})
              for module in imports if module in reach[module]}
    return sorted(sorted(group) for group in groups)


def floor_of(module: str) -> int:
    """Index in FLOORS of the longest name that is `module` or a package above it."""
    matches = [(len(name), floor) for floor, names in enumerate(FLOORS) for name in names
               if module == name or module.startswith(name + ".")]
    return max(matches)[1]


def upward(edges) -> list[str]:
    """Every import of a module on a higher floor, as a line naming both floors and where it is."""
    return [f"{where}: {importer} (floor {floor_of(importer)}) imports {imported} (floor {floor_of(imported)})"
            for (importer, imported), where in sorted(edges.items()) if floor_of(imported) > floor_of(importer)]


# --------------------------------------------------------------------------- the package
def test_no_module_imports_itself_through_others():
    edges = import_graph(module_files(ROOT))
    described = []
    for group in circles(edges):
        described.append(" <-> ".join(group))
        described += [f"    {where}: {a} imports {b}" for (a, b), where in sorted(edges.items())
                      if a in group and b in group]
    assert not described, "modules that import each other (cut at the cause: a Protocol for a type, a function " \
                          "moved down to a floor both use):\n" + "\n".join(described)


def test_imports_only_go_down_the_floors():
    climbing = upward(import_graph(module_files(ROOT)))
    assert not climbing, "imports that climb a floor (FLOORS, bottom first: " + \
        " | ".join(", ".join(names) for names in FLOORS) + "):\n" + "\n".join(climbing)


def test_every_package_has_a_floor_of_its_own():
    packages = {module for module, path in module_files(ROOT).items() if path.name == "__init__.py"}
    placed = {name for names in FLOORS for name in names}
    assert packages <= placed, f"packages on no floor of their own: {sorted(packages - placed)}; add them to FLOORS"


# --------------------------------------------------------------------------- the checks themselves
def test_the_checks_find_a_circle_and_a_climbing_import(tmp_path):
    files = {"__init__.py": "", "errors.py": "", "data/__init__.py": "", "eval/__init__.py": "",
             "data/suite.py": "from draftsmith.eval.prompts import humaneval_path\n",
             "eval/prompts.py": "def read():\n    from draftsmith.data import suite\n",
             "eval/runner.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .report import Report\n",
             "eval/report.py": "from draftsmith.eval import runner\nfrom draftsmith import errors\n"}
    for name, text in files.items():
        (tmp_path / "draftsmith" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "draftsmith" / name).write_text(text)
    edges = import_graph(module_files(tmp_path), tmp_path)
    assert circles(edges) == [["draftsmith.data.suite", "draftsmith.eval.prompts"],
                              ["draftsmith.eval.report", "draftsmith.eval.runner"]]
    assert [line.split(": ", 1)[1] for line in upward(edges)] == [
        "draftsmith.data.suite (floor 1) imports draftsmith.eval.prompts (floor 3)"]
