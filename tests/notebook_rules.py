"""What a committed notebook must satisfy; shared by the hygiene tests and their own tests."""
from __future__ import annotations

import ast
import importlib
import inspect
import os
import pkgutil
import re
import sys
import tempfile
from pathlib import Path

import ptlab
from ptlab.course.nbrun import cell_marks, code_cells

ROOT = Path(__file__).resolve().parent.parent
WARNING_WORDS = ("FutureWarning", "DeprecationWarning")
# The text Jupyter stores for a matplotlib Figure it could not draw: what the learner then sees instead of the plot.
FIGURE_REPR = re.compile(r"<(Figure size [^>]*|matplotlib\.figure\.\w*Figure[^>]*)>")


def ptlab_exports() -> set[str]:
    """Public functions and classes defined anywhere in the ptlab package."""
    names = set(ptlab.__all__)
    for info in pkgutil.walk_packages(ptlab.__path__, prefix="ptlab."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if not name.startswith("_") and (inspect.isfunction(obj) or inspect.isclass(obj)) \
                    and getattr(obj, "__module__", "") == module.__name__:
                names.add(name)
    return names


def machine_path_pattern() -> re.Pattern:
    """Absolute paths of this machine that must never reach a committed output."""
    roots = {str(ROOT), str(ROOT.parent), tempfile.gettempdir(), os.path.expanduser("~"), sys.prefix}
    roots = {r for r in roots if r not in ("/", "")}
    return re.compile("|".join(re.escape(r) + r"(/|\b)" for r in sorted(roots, key=len, reverse=True)))


def _code_without_magics(source: str) -> str:
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())


def defined_names(nb) -> set[str]:
    """Functions and classes a notebook defines at any depth."""
    names = set()
    for cell in code_cells(nb):
        for node in ast.walk(ast.parse(_code_without_magics(cell.source))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
    return names


def output_text(output) -> str:
    if output.output_type == "stream":
        return output.text
    if output.output_type == "error":
        return "\n".join(output.traceback)
    return "\n".join(str(v) for k, v in output.get("data", {}).items() if not k.startswith("image/"))


def figure_without_image(output) -> str | None:
    """The figure's text repr when an output stores a figure as that text alone, with no image; else None."""
    data = output.get("data", {})
    text = data.get("text/plain", "")
    text = "".join(text) if isinstance(text, list) else text
    if FIGURE_REPR.fullmatch(text.strip()) and not any(k.startswith("image/") for k in data):
        return text.strip()
    return None


_CUDA_CALLS = ("torch.cuda.is_available", "torch.cuda.device_count")


def _cuda_polarity(test: ast.AST, flags: set[str]) -> bool | None:
    """True when `test` holds exactly where a CUDA GPU is (torch.cuda.is_available(), device_count(),
    `x.type == "cuda"`, `"cuda" in ...`, or a name set from one of those), False when it holds exactly where
    none is (`not ...`, `!= "cuda"`), None when it does not ask about a GPU."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = _cuda_polarity(test.operand, flags)
        return None if inner is None else not inner
    if isinstance(test, ast.Name) and test.id in flags:
        return True
    if isinstance(test, ast.Call) and ast.unparse(test.func) in _CUDA_CALLS:
        return True
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        sides = [test.left, *test.comparators]
        names_cuda = any("cuda" in {c.value for c in ast.walk(side) if isinstance(c, ast.Constant)} for side in sides)
        if names_cuda:
            return not isinstance(test.ops[0], (ast.NotEq, ast.NotIn, ast.IsNot))
        if any(_cuda_polarity(side, flags) for side in sides):           # torch.cuda.device_count() > 0
            return True
    if isinstance(test, ast.BoolOp):
        parts = [_cuda_polarity(v, flags) for v in test.values]
        return next((p for p in parts if p is not None), None)
    return None


def cuda_flags(source: str, flags: set[str] | None = None) -> set[str]:
    """`flags` plus the names this cell sets from a CUDA test (`has_gpu = torch.cuda.is_available()`)."""
    found = set(flags or ())
    for node in ast.walk(ast.parse(_code_without_magics(source))):
        if isinstance(node, ast.Assign) and _cuda_polarity(node.value, found):
            found |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return found


def gpu_branch_problem(cell, flags: set[str] = frozenset()) -> str | None:
    """Why a cell that branches on a CUDA GPU breaks the rule, or None.

    Such a cell prints other things on a GPU than the CPU stored: it must be tagged nbval-ignore-output, so
    its compared output is the same (nothing) on every machine, and its GPU branch (the `if` body, or the
    `else` of a test that holds without a GPU) must still assert a claim. `flags` are names earlier cells set
    from a CUDA test. Not seen: a conditional expression (`a if torch.cuda.is_available() else b`), whose
    value may be printed; a device held in a variable that is not compared with "cuda"."""
    tree = ast.parse(_code_without_magics(cell.source))
    flags = cuda_flags(cell.source, set(flags))
    branches = []
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            polarity = _cuda_polarity(node.test, flags)
            if polarity is not None:
                branches.append(node.body if polarity else node.orelse)
    if not branches:
        return None
    if "NBVAL_IGNORE_OUTPUT" not in cell_marks(cell):
        return "branches on a CUDA GPU but is not tagged nbval-ignore-output: a GPU prints other output"
    asserted = any(isinstance(n, ast.Call) and ast.unparse(n.func) in ("claim", "claim_measured")
                   for branch in branches for stmt in branch for n in ast.walk(stmt))
    if not asserted:
        return "branches on a CUDA GPU but asserts no claim there: on a GPU it would check nothing"
    return None


def problems(nb) -> list[str]:
    """Every hygiene rule this notebook breaks, as readable lines."""
    found = []
    cells = code_cells(nb)
    counts = [c.execution_count for c in cells]
    if None in counts:
        found.append(f"{counts.count(None)} of {len(cells)} code cells have no stored execution "
                     "(strict nbval checks nothing there): run `make notebooks`")
    elif counts != list(range(1, len(cells) + 1)):
        found.append(f"execution counts {counts} are not 1..{len(cells)}: re-run top to bottom with `make notebooks`")
    pattern = machine_path_pattern()
    flags: set[str] = set()                     # names set from a CUDA test in an earlier cell
    for i, cell in enumerate(cells):
        where = f"code cell {i} ({cell.source.strip().splitlines()[0][:50]!r})"
        if not cell.outputs:
            found.append(f"{where} has no stored output: show what it did")
        gpu_problem = gpu_branch_problem(cell, flags)
        flags = cuda_flags(cell.source, flags)
        if gpu_problem:
            found.append(f"{where} {gpu_problem}")
        for line in cell.source.splitlines():
            comment = line.strip().lstrip("#").strip() if line.strip().startswith("#") else ""
            if comment.startswith("NBVAL_"):
                found.append(f"{where}: {comment!r} is a comment learners read; use the cell tag "
                             f"({comment.lower().replace('_', '-')}) instead")
        for output in cell.outputs:
            text = output_text(output)
            if output.output_type == "error" and "NBVAL_RAISES_EXCEPTION" not in cell_marks(cell):
                found.append(f"{where} stores an error: {output.ename}: {output.evalue[:80]}")
            if pattern.search(text):
                found.append(f"{where} shows a path of this machine")
            for word in WARNING_WORDS:
                if word in text:
                    found.append(f"{where} shows a {word}: a deprecated API must not be taught")
            figure = figure_without_image(output)
            if figure:
                found.append(f"{where} stores the figure as the text {figure!r} and no image, which is all a "
                             "learner sees: display it as a PNG (ptlab.plots.show_figure) and re-run the notebook")
    clashes = defined_names(nb) & ptlab_exports()
    if clashes:
        found.append(f"defines {sorted(clashes)}, which ptlab exports: import them instead")
    return found
