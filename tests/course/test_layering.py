"""The package's layers, read from its imports (AST only, nothing is run): what may import what, no cycles.

- foundation (claims, plots, core, timing, loop, data, models, reference, _legacy) imports only the foundation;
- tools (every other module at the top of ptlab) import the foundation and tools;
- course (ptlab/course) imports the foundation, tools and course; lessons (ptlab/lessons) may import all of those
  and lessons; nothing else imports a lesson or the course (the registries find lessons on disk);
- the surface (ptlab/__init__.py, __main__.py) and the old-path shims may import anything; nothing imports a shim.
"""
from __future__ import annotations

import ast
import importlib
import json
import shutil
from pathlib import Path

import pytest

from notebook_rules import ROOT

FOUNDATION = {"claims", "plots", "core", "timing", "loop", "data", "models", "reference", "_legacy"}
SURFACE = {"ptlab", "ptlab.__main__"}
SHIMS = {"ptlab.loading", "ptlab.finetune", "ptlab.doctor", "ptlab.pitfalls", "ptlab.exercises"}
ALLOWED = {"foundation": {"foundation"}, "tool": {"foundation", "tool"},
           "course": {"foundation", "tool", "course"}, "lesson": {"foundation", "tool", "course", "lesson"}}
# Function-level imports of ptlab modules allowed, each for import cost: the CLI loads a command's modules on use,
# `show_pitfall` loads ipywidgets on use, and the pitfall comparison loads matplotlib only to plot.
LAZY_OK = {("ptlab.__main__", None), ("ptlab", "ptlab.course.widgets"), ("ptlab.course.pitfalls", "ptlab.plots")}


def module_name(path: Path, package_root: Path) -> str:
    parts = list(path.relative_to(package_root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(module: str) -> str:
    if module in SURFACE:
        return "surface"
    if module in SHIMS:
        return "shim"
    if module.startswith("ptlab.course"):
        return "course"
    if module.startswith("ptlab.lessons"):
        return "lesson"
    return "foundation" if module.split(".")[1] in FOUNDATION else "tool"


def import_edges(package_root: Path) -> list[tuple[str, str, bool, int]]:
    """(importer, imported module, at module level, line) for every import of a ptlab module."""
    modules = {module_name(p, package_root) for p in package_root.rglob("*.py")}
    edges = []
    for path in sorted(package_root.rglob("*.py")):
        importer = module_name(path, package_root)
        package = importer if path.name == "__init__.py" else importer.rsplit(".", 1)[0]
        tree = ast.parse(path.read_text(encoding="utf-8"))
        top = {id(node) for node in tree.body}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([node.module] if node.module else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            else:
                continue
            for target in dict.fromkeys(targets):
                if target == "ptlab" or target.startswith("ptlab."):
                    edges.append((importer, target, id(node) in top, node.lineno))
    return edges


def layering_violations(package_root: Path) -> list[str]:
    """Every import that breaks the layers, every function-level ptlab import not in LAZY_OK, every cycle."""
    problems, graph = [], {}
    for importer, target, at_top, line in import_edges(package_root):
        where = f"{importer} (line {line}) imports {target}"
        if layer(target) == "shim" and layer(importer) != "shim":
            problems.append(f"{where}: an old-path shim; import the module's new home")
        if layer(importer) in ALLOWED and layer(target) not in ALLOWED[layer(importer)]:
            problems.append(f"{where}: a {layer(importer)} may import only {sorted(ALLOWED[layer(importer)])}")
        if not at_top and (importer, None) not in LAZY_OK and (importer, target) not in LAZY_OK:
            problems.append(f"{where} inside a function: import it at the top of the module")
        if at_top and layer(importer) in ALLOWED:
            graph.setdefault(importer, set()).add(target)
    problems += [f"import cycle: {' -> '.join(cycle)}" for cycle in _cycles(graph)]
    return problems


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    found, state = [], {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                found.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return found


def test_the_package_keeps_its_layers():
    assert layering_violations(ROOT / "ptlab") == []


def test_the_check_fails_on_a_planted_back_import(tmp_path):
    copy = tmp_path / "ptlab"
    shutil.copytree(ROOT / "ptlab", copy, ignore=shutil.ignore_patterns("__pycache__"))
    train = copy / "train.py"
    train.write_text(train.read_text() + "\nfrom ptlab.course.pitfalls import all_pitfalls  # planted\n")
    memory = copy / "memory.py"
    memory.write_text(memory.read_text() + "\n\ndef planted():\n    from ptlab.diagnose import Finding\n")
    problems = layering_violations(copy)
    assert any("ptlab.train" in p and "a tool may import only" in p for p in problems), problems
    assert any("ptlab.memory" in p and "inside a function" in p for p in problems), problems
    assert any(p.startswith("import cycle: ptlab.diagnose -> ptlab.memory") or "ptlab.memory -> ptlab.diagnose" in p
               for p in problems) is False   # a function-level import makes no module-level cycle
    claims = copy / "claims.py"
    claims.write_text(claims.read_text() + "\nfrom ptlab.timing import Timing  # planted\n")
    assert any(p.startswith("import cycle:") and "ptlab.claims" in p for p in layering_violations(copy))


def test_every_moved_name_and_old_path_still_resolves():
    from ptlab import _legacy

    for module in ("ptlab.amp", "ptlab.distributed", "ptlab.compiling", "ptlab.exporting", "ptlab.clinic"):
        importlib.import_module(module)
    assert set(_legacy.MOVED_NAMES) == {"ptlab.amp", "ptlab.distributed", "ptlab.compiling", "ptlab.exporting",
                                        "ptlab.clinic"}
    for module, names in _legacy.MOVED_NAMES.items():
        for name, home in names.items():
            assert getattr(importlib.import_module(module), name) is getattr(importlib.import_module(home), name)
    from ptlab.exercises.training import mystery_setup
    from ptlab.loading import SquaresDataset, normalize_batch
    from ptlab.pitfalls.autograd import ListMLP

    assert SquaresDataset.__module__ == "ptlab.lessons.ch03_data.datasets" and normalize_batch.__name__ == "normalize_uint8"
    assert ListMLP.__module__ == "ptlab.lessons.ch02_autograd.pitfalls"
    assert mystery_setup.__module__ == "ptlab.lessons.ch04_cnn_training.exercises"
    for shim in SHIMS:
        importlib.import_module(shim)


def test_module_paths_in_strings_import():
    from ptlab import distributed
    from ptlab.course import topics

    for name in distributed._PRELOAD:        # the fork server swallows an ImportError here: a stale name only slows
        importlib.import_module(name)        # every rank's start, silently
    assert importlib.import_module(topics.LESSONS).__name__ == "ptlab.lessons"


@pytest.mark.parametrize("notebook", sorted((ROOT / "notebooks").rglob("*.ipynb")), ids=lambda p: p.name)
def test_notebooks_import_no_old_path_and_every_import_resolves(notebook):
    for cell in json.loads(notebook.read_text(encoding="utf-8"))["cells"]:
        if cell["cell_type"] != "code":
            continue
        try:
            tree = ast.parse("".join(cell["source"]))
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ptlab"):
                assert node.module not in SHIMS and not any(node.module.startswith(s + ".") for s in SHIMS), \
                    f"{notebook.name} imports the old path {node.module}"
                module = importlib.import_module(node.module)
                missing = [a.name for a in node.names if not hasattr(module, a.name)
                           and importlib.util.find_spec(f"{node.module}.{a.name}") is None]
                assert not missing, f"{notebook.name}: {node.module} has no {missing}"


def test_each_chapter_folder_holds_its_pitfalls_and_exercises():
    from ptlab import all_pitfalls
    from ptlab.course.exercises import all_exercises

    folders = {int(p.name[2:4]): p.name for p in (ROOT / "ptlab" / "lessons").glob("ch[0-9][0-9]_*")}
    assert sorted(folders) == list(range(1, 9))
    for record in all_pitfalls():
        assert record.reproduce.__module__.startswith(f"ptlab.lessons.{folders[record.chapter]}."), record.id
    for ex in all_exercises():
        assert ex.checker.__module__ == f"ptlab.lessons.{folders[ex.chapter]}.exercises", ex.id
