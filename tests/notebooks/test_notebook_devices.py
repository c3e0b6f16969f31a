"""Notebooks on a GPU: the cells that use `device` run with `device` a simulated second device.

CI has no GPU, and `make notebooks` runs on the CPU, where `device` is the CPU: a cell that moves the
model to `device` and then feeds it a batch straight from a DataLoader runs fine there and crashes on
every GPU (chapter 4 did). This test reads each notebook whose code uses the name `device`, picks the
code cells that depend on it (the cells that use `device` or a name such a cell set, and every cell
that sets a name those need), and executes them in order in one namespace, in this process, with
`device` replaced by the simulated second device of tests/tools/test_devices.py: real values on the
CPU, CUDA's rule that an op's tensors share one device. A cell that mixes devices fails the test,
naming the cell (its index in the notebook's `cells`, as in "04:c37") and the line.

What it cannot catch: a cell that makes its own CUDA tensors without naming `device`; code that runs
only when `device.type == "cuda"` (the simulated device is 'meta': pinned memory, float16 autocast,
torch.cuda calls); anything in the cells it leaves out, which also means a global setting such a cell
makes (a seed) is missing, so the slice's numbers may differ from the notebook's; an op on which real
CUDA is stricter or looser than the simulation (see tests/tools/test_devices.py); GPU numerics and
memory; outputs (it compares none: nbval does, on the CPU). A checkpoint written from the second
device reloads on the CPU here, on the GPU on a GPU machine.
"""
from __future__ import annotations

import ast
import importlib.util
import os
import re
import symtable
import traceback

import nbformat
import pytest
import torch
from notebook_rules import ROOT

import ptlab
from ptlab.course.nbrun import CPU_ONLY_ENV, kernel_env, notebook_paths

DEVICE = "device"


def _harness():
    """tests/tools/test_devices.py, loaded by path: the simulated second device lives there."""
    path = ROOT / "tests" / "tools" / "test_devices.py"
    spec = importlib.util.spec_from_file_location("_second_device_harness", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _code(source: str) -> str:
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())


def _root_name(node: ast.AST) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp,
           ast.GeneratorExp, ast.ClassDef)


def _imported(tree: ast.AST) -> set[str]:
    return {(a.asname or a.name).split(".")[0] for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
            for a in n.names}


def _end(node: ast.AST) -> tuple[int, int]:
    return node.end_lineno, node.end_col_offset


class _Events(ast.NodeVisitor):
    """Where in a cell each global name is first read or set, in the order Python runs them: a name
    whose first event is a read must come from an earlier cell (a loop variable set here does not)."""

    def __init__(self, modules: frozenset[str]) -> None:
        self.modules, self.events = modules, []   # (position, name, "read" | "set")

    def _set(self, target: ast.AST, at: tuple[int, int]) -> None:
        for node in ast.walk(target):
            if isinstance(node, ast.Name):
                self.events.append((at, node.id, "set"))
            elif isinstance(node, (ast.Attribute, ast.Subscript)):   # x.attr = ..., x[i] = ...: x changes
                self.events.append((at, _root_name(node), "set"))
        for node in ast.walk(target):                                 # x[i] = ...: i and x are read first
            if isinstance(node, (ast.Attribute, ast.Subscript)):
                self.visit(node.value)
                if isinstance(node, ast.Subscript):
                    self.visit(node.slice)

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load):
            self.events.append(((node.lineno, node.col_offset), node.id, "read"))

    def visit_Assign(self, node) -> None:
        self.visit(node.value)
        for target in node.targets:
            self._set(target, _end(node))

    def visit_AugAssign(self, node) -> None:
        self.visit(node.value)
        self.visit(ast.Name(node.target.id, ast.Load(), lineno=node.lineno, col_offset=node.col_offset)
                   if isinstance(node.target, ast.Name) else node.target)
        self._set(node.target, _end(node))

    def visit_AnnAssign(self, node) -> None:
        if node.value is not None:
            self.visit(node.value)
        self._set(node.target, _end(node))

    def visit_NamedExpr(self, node) -> None:
        self.visit(node.value)
        self._set(node.target, _end(node))

    def visit_For(self, node) -> None:
        self.visit(node.iter)
        self._set(node.target, _end(node.iter))
        for child in [*node.body, *node.orelse]:
            self.visit(child)

    visit_AsyncFor = visit_For

    def visit_With(self, node) -> None:
        for item in node.items:
            self.visit(item.context_expr)
            if item.optional_vars is not None:
                self._set(item.optional_vars, _end(item.context_expr))
        for child in node.body:
            self.visit(child)

    visit_AsyncWith = visit_With

    def visit_Import(self, node) -> None:
        for alias in node.names:
            self.events.append((_end(node), (alias.asname or alias.name).split(".")[0], "set"))

    visit_ImportFrom = visit_Import

    def visit_Call(self, node: ast.Call) -> None:
        self.generic_visit(node)
        root = _root_name(node.func) if isinstance(node.func, ast.Attribute) else None
        if root is not None and root not in self.modules:             # model.train() changes model
            self.events.append((_end(node), root, "set"))

    def _scope(self, node) -> None:
        """A function, lambda, class or comprehension: its global names are read where it stands."""
        at = (node.lineno, node.col_offset)
        table = symtable.symtable(ast.unparse(node if not isinstance(node, ast.expr) else ast.Expr(node)),
                                  "<scope>", "exec")
        local = {s.get_name() for s in table.get_symbols() if s.is_assigned() or s.is_imported()}
        stack = list(table.get_children())
        while stack:
            child = stack.pop()
            stack.extend(child.get_children())
            for symbol in child.get_symbols():
                if symbol.is_global() and symbol.is_referenced() and symbol.get_name() not in local:
                    self.events.append((at, symbol.get_name(), "read"))
        for symbol in table.get_symbols():                            # decorators, defaults, first iterable
            if symbol.is_referenced() and not symbol.is_assigned():
                self.events.append((at, symbol.get_name(), "read"))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            self.events.append((_end(node), node.name, "set"))

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = visit_Lambda = _scope
    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = _scope


def names(source: str, modules: frozenset[str] = frozenset()) -> tuple[set[str], set[str]]:
    """(global names a cell sets, global names it needs from earlier cells).

    Setting also counts `x.attr = ...`, `x[i] = ...` and a method call `x.f(...)` on a name x that is
    not a module (`model.train()` changes model). A name the cell sets before it reads it (a loop
    variable) is not needed from earlier cells."""
    visitor = _Events(modules)
    visitor.visit(ast.parse(_code(source)))
    first: dict[str, str] = {}
    for _, name, kind in sorted(visitor.events, key=lambda e: e[0]):
        first.setdefault(name, kind)
    sets = {name for _, name, kind in visitor.events if kind == "set"}
    return sets, {name for name, kind in first.items() if kind == "read"}


def device_slice(nb) -> list[int]:
    """Indices (in nb.cells) of the code cells to run: those that read `device` or a name set by such a
    cell, and every earlier cell that sets a name they read; in notebook order."""
    sources = {i: c.source for i, c in enumerate(nb.cells) if c.cell_type == "code" and c.source.strip()}
    modules = frozenset().union(*(_imported(ast.parse(_code(src))) for src in sources.values()))
    cells = {i: names(src, modules) for i, src in sources.items()}
    tainted, chosen = {DEVICE}, set()
    for i, (sets, reads) in cells.items():
        if reads & tainted:
            chosen.add(i)
            tainted |= sets
    if not chosen:
        return []
    needed = set().union(*(cells[i][1] for i in chosen))
    for i in sorted(cells, reverse=True):
        if i in chosen or (i < max(chosen) and cells[i][0] & needed):
            chosen.add(i)
            needed |= cells[i][1]
    return sorted(chosen)


NOTEBOOKS = [p for p in notebook_paths([ROOT / "notebooks"])
             if device_slice(nbformat.read(p, as_version=4))]


def test_the_slice_of_a_small_notebook():
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(src) for src in [
        "import torch\ndevice = torch.device('cpu')",                        # 0: sets device
        "data = torch.ones(4, 2)\nunused = 3",                              # 1: needed by 3
        "other = torch.zeros(1)",                                           # 2: not needed
        "model = torch.nn.Linear(2, 1).to(device)\nout = model(data)",       # 3: reads device
        "model.eval()",                                                     # 4: reads model
        "print(unused)",                                                    # 5: nothing of device
    ]])
    assert device_slice(nb) == [0, 1, 3, 4]


def test_chapter_4_is_checked():
    """Chapter 4 moves its model to `device`: it must be among the notebooks this test runs."""
    assert any(p.name == "04_cnn_training.ipynb" and "solutions" not in p.parts for p in NOTEBOOKS)


def _failing_line(err: BaseException, filename: str, source: str) -> str:
    """The cell's line the error came from (the innermost frame in the cell), with its text."""
    frames = [f for f in traceback.extract_tb(err.__traceback__) if f.filename == filename]
    if not frames:
        return ""
    lines = source.splitlines()
    number = frames[-1].lineno
    return f"line {number}: {lines[number - 1].strip() if 0 < number <= len(lines) else ''}"


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[str(p.relative_to(ROOT / "notebooks")) for p in NOTEBOOKS])
def test_cells_that_use_device_run_on_a_second_device(path, monkeypatch):
    harness = _harness()
    nb = nbformat.read(path, as_version=4)
    chapter = path.stem[:2]
    monkeypatch.chdir(path.parent)
    namespace: dict = {"__name__": "__main__"}
    mixed = None
    with harness.SecondDevice():
        for i in device_slice(nb):
            filename = f"<{chapter}:c{i}>"
            try:
                exec(compile(_code(nb.cells[i].source), filename, "exec"), namespace)
            except harness.DeviceMixed as err:
                mixed = (f"{path.name} cell {chapter}:c{i} mixes devices when `device` is a GPU (simulated): "
                         f"{_failing_line(err, filename, nb.cells[i].source)}\n  {err}")
                break
            if DEVICE in names(nb.cells[i].source)[0]:
                namespace[DEVICE] = harness.SECOND
    if mixed:
        pytest.fail(mixed, pytrace=False)
    on_second = [name for name, value in namespace.items() if isinstance(value, torch.nn.Module)
                 and any(p.device == harness.SECOND for p in value.parameters())]
    assert on_second, "no model ended on the simulated device: the notebook's `device` was not used"


# ---------------------------------------------------------------- make notebooks: every accelerator hidden


def test_regenerating_outputs_hides_every_cuda_device_and_pins_the_cpu(monkeypatch):
    """`python -m ptlab notebooks` (and so `make notebooks`) starts kernels with CPU_ONLY_ENV, over any
    device the caller's environment names."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setenv("PTLAB_DEVICE", "cuda")
    env = kernel_env(CPU_ONLY_ENV)
    assert env["CUDA_VISIBLE_DEVICES"] == "" and env["PTLAB_DEVICE"] == "cpu"
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0"                       # this process is left alone


@pytest.mark.slow
def test_make_notebooks_kernels_see_no_gpu(tmp_path, monkeypatch):
    """A real kernel started by execute_in_place: it sees the CPU-only environment and no CUDA device, and
    imports the ptlab this test imports (a worktree's, not the one pip installed elsewhere)."""
    from ptlab.course.nbrun import execute_in_place

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setenv("PTLAB_DEVICE", "cuda")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "import os, torch, ptlab\n"
        "print(repr(os.environ['CUDA_VISIBLE_DEVICES']), os.environ['PTLAB_DEVICE'], torch.cuda.device_count(), "
        f"ptlab.get_device(), ptlab.__file__ == {ptlab.__file__!r})")])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path = tmp_path / "probe.ipynb"
    nbformat.write(nb, path)
    assert execute_in_place([path]) == 0
    assert nbformat.read(path, as_version=4).cells[0].outputs[0]["text"] == "'' cpu 0 cpu True\n"


def test_the_makefile_leaves_the_environment_to_the_command():
    """The Makefile's notebooks target runs the CLI and sets no device variable that could disagree with it."""
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    recipe = re.search(r"^notebooks:.*\n((?:\t.*\n)+)", makefile, re.M).group(1)
    assert "-m ptlab notebooks" in recipe
    for name, value in re.findall(r"\b([A-Z_]+)=(\S*)", recipe):
        assert name not in CPU_ONLY_ENV or value == CPU_ONLY_ENV[name], f"the Makefile sets {name}={value}"
