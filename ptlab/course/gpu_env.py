"""What the GPU check states before it runs anything: the machine, and which packages it lacks, with the fix.

Nothing here imports more than the standard library at the top, so `python -m ptlab gpu-check` can say what is
missing on a machine that lacks nbclient or nbformat instead of failing on an import.
"""
from __future__ import annotations

import ast
import datetime
import importlib.util
import json
import os
import platform
import subprocess
import sys
from collections import Counter
from pathlib import Path

from ptlab.core import PTLAB_ROOT

REHEARSAL = "CPU (no GPU): a rehearsal, not a GPU check"
WHEELHOUSE = ".gpu-wheels"
# What the check itself runs on: without these it cannot start a kernel or read a notebook.
RUNNER_NEEDS = ("nbclient", "nbformat", "ipykernel", "jupyter_client", "pytest")
# Imported where a scan of import statements cannot see it: torch.onnx.export (chapter 8) imports onnx and
# onnxscript; pytest-timeout limits each test of the check's test run.
ALSO_NEEDED = ("onnx", "onnxscript", "pytest_timeout")
DISTRIBUTION = {"PIL": "pillow", "IPython": "ipython", "pytest_timeout": "pytest-timeout", "yaml": "pyyaml",
                "jupyter_client": "jupyter-client", "zmq": "pyzmq"}


def _imported_names(source: str) -> set[str]:
    """Top-level module names of the absolute imports in `source` (IPython magics and shell lines dropped)."""
    lines = [line for line in source.splitlines() if not line.lstrip().startswith(("%", "!"))]
    try:
        tree = ast.parse("\n".join(lines))
    except SyntaxError:
        return set()
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.add(node.module.split(".")[0])
    return names


def third_party_imports(notebooks: list[Path], sources: list[Path], local: set[str] = frozenset()) -> set[str]:
    """Modules outside the standard library, ptlab and `local` (the tests' own helper modules) that the notebooks'
    code cells or the given .py files import, plus ALSO_NEEDED and RUNNER_NEEDS."""
    names = set(ALSO_NEEDED) | set(RUNNER_NEEDS)
    for path in notebooks:
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        for cell in cells:
            if cell["cell_type"] == "code":
                names |= _imported_names("".join(cell["source"]))
    for path in sources:
        names |= _imported_names(path.read_text(encoding="utf-8"))
    return {n for n in names - set(local) if n not in sys.stdlib_module_names and n != "ptlab"
            and not n.startswith("_")}


def local_modules(folder: Path) -> set[str]:
    """Names a file under `folder` can import without installing anything: its .py files and folders."""
    return {p.stem for p in folder.rglob("*.py")} | {p.name for p in folder.rglob("*") if p.is_dir()}


def missing_modules(names: set[str]) -> list[str]:
    """The names that this Python cannot find."""
    return sorted(n for n in names if importlib.util.find_spec(n) is None)


def fix_lines(missing: list[str], root: Path) -> list[str]:
    """What to do about missing modules: which distributions, whether the wheelhouse has them, the two commands."""
    if not missing:
        return []
    dists = [DISTRIBUTION.get(m, m.replace("_", "-").lower()) for m in missing]
    lines = [f"missing: {', '.join(missing)} (pip: {' '.join(dists)})",
             f"fix: here `make gpu-wheels`, carry {WHEELHOUSE}/ with the tree, there "
             f"`pip install --no-index --find-links {WHEELHOUSE} -r {WHEELHOUSE}/requirements.txt`"]
    listed = root / WHEELHOUSE / "requirements.txt"
    if listed.exists():
        have = {line.split("==")[0].strip().lower() for line in listed.read_text().splitlines() if "==" in line}
        absent = [d for d in dists if d.lower() not in have]
        if absent:
            lines.append(f"not in {WHEELHOUSE}: {' '.join(absent)}; add them to GPU_WHEELS in the Makefile")
    return lines


def cannot_start() -> str | None:
    """Why the check cannot run here (what it runs on is missing, with the fix), or None."""
    missing = missing_modules(set(RUNNER_NEEDS))
    if not missing:
        return None
    return "gpu-check: cannot start, " + "\n  ".join(fix_lines(missing, Path(PTLAB_ROOT)))


def git_commit(root: Path) -> str:
    """`git rev-parse --short HEAD` in `root`, or 'unknown' (a copied tree has no .git)."""
    try:
        done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                              timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return done.stdout.strip() if done.returncode == 0 and done.stdout.strip() else "unknown"


def device_line() -> str:
    """The GPUs torch sees, counted by name, or the rehearsal's label."""
    import torch

    if not torch.cuda.is_available():
        return REHEARSAL
    names = Counter(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
    count = sum(names.values())
    return f"{count} GPU{'s' if count > 1 else ''}: " + ", ".join(f"{n} x {name}" for name, n in names.items())


def environment_header(root: Path = Path(PTLAB_ROOT)) -> list[str]:
    """The report's first lines: device, versions, CPUs, date (UTC), commit, and the device variables if set."""
    import torch

    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"- device: {device_line()}",
             f"- torch {torch.__version__}, CUDA {torch.version.cuda or 'none'}, cuDNN {cudnn or 'none'}; "
             f"Python {platform.python_version()}; {os.cpu_count()} CPUs ({platform.machine()})",
             f"- date: {now}; commit: {git_commit(root)}"]
    shown = {k: os.environ[k] for k in ("PTLAB_DEVICE", "CUDA_VISIBLE_DEVICES") if k in os.environ}
    if shown:
        lines.append("- set here (the kernels inherit them): " + ", ".join(f"{k}={v!r}" for k, v in shown.items()))
    return lines


def cuda_test_ids(tests_root: Path) -> list[str]:
    """Node ids (relative to tests_root's parent) of tests marked `@pytest.mark.cuda`, read from the source
    (a whole module when its `pytestmark` names cuda); nothing is imported or collected."""
    ids: list[str] = []
    for path in sorted(tests_root.rglob("test_*.py")):
        rel = path.relative_to(tests_root.parent).as_posix()
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "pytestmark" for t in node.targets):
                if "mark.cuda" in ast.unparse(node.value):
                    ids.append(rel)
                    break
            for item, prefix in _test_functions(node):
                if any("mark.cuda" in ast.unparse(d) for d in item.decorator_list):
                    ids.append(f"{rel}::{prefix}{item.name}")
    return list(dict.fromkeys(ids))


def _test_functions(node: ast.stmt) -> list[tuple[ast.FunctionDef, str]]:
    """Test functions at module level, and test methods of a class with its marks, as (function, id prefix)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
        return [(node, "")]
    if isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
        if any("mark.cuda" in ast.unparse(d) for d in node.decorator_list):
            return [(node, "")]  # the class's id selects every method
        return [(f, f"{node.name}::") for f in node.body
                if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and f.name.startswith("test")]
    return []
