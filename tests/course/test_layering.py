"""The package's layers, read from its imports (AST only, nothing is run): what may import what, no cycles.

- foundation (claims, plots, core, timing, loop, data, shapes, models, reference) imports only the foundation;
- tools (every other module at the top of ptlab) import the foundation and tools;
- course (ptlab/course) imports the foundation, tools and course; lessons (ptlab/lessons) may import all of those
  and lessons; nothing else imports a lesson or the course (the registries find lessons on disk);
- the surface (ptlab/__init__.py, __main__.py) may import anything;
- no string in a tool, the foundation or ptlab/__init__.py names the course or a lesson (a name imported by string
  is an import all the same).
"""
from __future__ import annotations

import ast
import importlib
import json
import re
import shutil
from pathlib import Path

import pytest

from notebook_rules import ROOT

FOUNDATION = {"claims", "plots", "core", "timing", "loop", "data", "shapes", "models", "reference"}
SURFACE = {"ptlab", "ptlab.__main__"}
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
    memory.write_text(memory.read_text() + "\n\ndef planted():\n    from ptlab.diagnose import GradientFinding\n")
    problems = layering_violations(copy)
    assert any("ptlab.train" in p and "a tool may import only" in p for p in problems), problems
    assert any("ptlab.memory" in p and "inside a function" in p for p in problems), problems
    assert any(p.startswith("import cycle: ptlab.diagnose -> ptlab.memory") or "ptlab.memory -> ptlab.diagnose" in p
               for p in problems) is False   # a function-level import makes no module-level cycle
    claims = copy / "claims.py"
    claims.write_text(claims.read_text() + "\nfrom ptlab.timing import Timing  # planted\n")
    assert any(p.startswith("import cycle:") and "ptlab.claims" in p for p in layering_violations(copy))


BACK_EDGE_STRING = re.compile(r"\bptlab[./\\](?:lessons|course)\b")


def string_back_edges(package_root: Path) -> list[str]:
    """Every string literal in a tool or foundation module (or ptlab/__init__.py) that names the course or a lesson."""
    problems = []
    for path in sorted(package_root.rglob("*.py")):
        module = module_name(path, package_root)
        if layer(module) in ("course", "lesson") or module == "ptlab.__main__":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            found = BACK_EDGE_STRING.search(node.value) if isinstance(node, ast.Constant) \
                and isinstance(node.value, str) else None
            if found:
                line = node.lineno + node.value[:found.start()].count("\n")
                problems.append(f"{module} (line {line}) names {found.group(0)} in a string: only the course, a "
                                f"lesson and the CLI may (an import by name is a back-edge the import check misses)")
    return problems


def test_no_tool_or_foundation_module_names_the_course_or_a_lesson_in_a_string():
    assert string_back_edges(ROOT / "ptlab") == []


def test_the_string_check_fails_on_a_planted_module_path(tmp_path):
    planted = 'MOVED = {"checksum": "ptlab.lessons.ch07_ddp.rank_functions"}\nSEE = f"{1} in ptlab/course/x.py"\n'
    for path in ("__init__.py", "__main__.py", "course/__init__.py", "lessons/ch01_tensors/pitfalls.py", "timing.py",
                 "watch/detectors.py"):
        file = tmp_path / "ptlab" / path
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text(planted)
    problems = string_back_edges(tmp_path / "ptlab")
    # the course, a lesson and the CLI may name them; the surface, the foundation and the tools may not
    assert sorted({p.split(" (")[0] for p in problems}) == ["ptlab", "ptlab.timing", "ptlab.watch.detectors"], problems
    assert len(problems) == 6, problems
    assert problems[2].startswith("ptlab.timing (line 1) names ptlab.lessons in a string: only the course"), problems


def test_module_paths_in_strings_import():
    from ptlab import distributed
    from ptlab.course import topics

    for name in distributed._PRELOAD:        # the fork server swallows an ImportError here: a stale name only slows
        importlib.import_module(name)        # every rank's start, silently
    assert importlib.import_module(topics.LESSONS).__name__ == "ptlab.lessons"


@pytest.mark.parametrize("notebook", sorted((ROOT / "notebooks").rglob("*.ipynb")), ids=lambda p: p.name)
def test_every_notebook_import_resolves(notebook):
    for cell in json.loads(notebook.read_text(encoding="utf-8"))["cells"]:
        if cell["cell_type"] != "code":
            continue
        try:
            tree = ast.parse("".join(cell["source"]))
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ptlab"):
                module = importlib.import_module(node.module)
                missing = [a.name for a in node.names if not hasattr(module, a.name)
                           and importlib.util.find_spec(f"{node.module}.{a.name}") is None]
                assert not missing, f"{notebook.name}: {node.module} has no {missing}"
