"""Run the course notebooks: refresh outputs in place (`make notebooks`); ptlab.course.bench times them."""
from __future__ import annotations

import os
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import nbformat
import psutil

from ptlab.core import env_importing_this_ptlab

SKIP_MARKS = ("NBVAL_SKIP", "NBVAL_IGNORE_OUTPUT")
# nbval reads a cell's tags as well as comment markers; the course uses tags (learners never see them).
TAG_MARKS = {"nbval-skip": "NBVAL_SKIP", "nbval-ignore-output": "NBVAL_IGNORE_OUTPUT",
             "nbval-raises-exception": "NBVAL_RAISES_EXCEPTION", "raises-exception": "NBVAL_RAISES_EXCEPTION",
             "nbval-check-output": "NBVAL_CHECK_OUTPUT"}
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
# The environment every notebook kernel gets, here and under nbval: stable hashing, and every
# DeprecationWarning shown (Python hides those outside __main__), so strict nbval sees any of them.
KERNEL_ENV = {"PYTHONHASHSEED": "0", "PYTHONWARNINGS": "default::DeprecationWarning"}
# The course's one thread rule, for every command that runs torch (the Makefile exports the same default; README,
# "Threads"): torch keeps one thread per core, and OpenMP's idle threads sleep (PASSIVE) instead of spinning, so a
# step on a laptop busy with other programs does not wait for a thread that lost its core. A policy the user set
# is kept. OpenMP reads it once, when torch is imported, so it reaches kernels and child processes, not this one.
THREAD_DEFAULTS = {"OMP_WAIT_POLICY": "PASSIVE"}
# The second configuration CI runs the notebooks in (`make test-second-config`): other float digits,
# other speed. On any x86 CPU it changes the thread count and the ATen and oneDNN instruction sets.
SECOND_CONFIG = {"OMP_NUM_THREADS": "1", "ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "AVX2"}
# What the kernels that regenerate the stored outputs (`python -m ptlab notebooks`, `make notebooks`) run
# with: on the CPU, every CUDA device hidden from torch (a GPU would print its name and `device='cuda:0'`
# into outputs, and a cell could take a GPU-only branch). Apple's MPS cannot be hidden by an environment
# variable: PTLAB_DEVICE=cpu makes the course's own device choice the CPU there.
CPU_ONLY_ENV = {"PTLAB_DEVICE": "cpu", "CUDA_VISIBLE_DEVICES": ""}
BUDGETS = {"notebook_s": 120.0, "cell_s": 20.0, "rss_mib": 3 * 1024.0, "total_s": 900.0, "checked": 0.80}
# Chapters whose lesson needs more time than the default: real processes (7) and compilation (8).
NOTEBOOK_S = {"07_ddp": 150.0, "08_compile_export": 180.0}


def notebook_budget_s(path: Path) -> float:
    """The wall-time budget of one notebook (its chapter's, else the default)."""
    return NOTEBOOK_S.get(Path(path).stem, BUDGETS["notebook_s"])


def notebook_paths(paths: list[Path]) -> list[Path]:
    """Notebooks under the given files or folders, solutions included, checkpoints excluded."""
    found: list[Path] = []
    for path in paths:
        if path.is_dir():
            found += [p for p in sorted(path.rglob("*.ipynb")) if ".ipynb_checkpoints" not in p.parts]
        elif path.suffix == ".ipynb" and path.exists():
            found.append(path)
        else:
            raise FileNotFoundError(f"{path}: not a notebook or a folder of notebooks")
    return found


def code_cells(nb) -> list:
    """The code cells that hold code (blank cells are ignored)."""
    return [c for c in nb.cells if c.cell_type == "code" and c.source.strip()]


def comment_marks(cell) -> set[str]:
    """NBVAL_* comment markers in a cell's source, read as nbval reads them (alone on a comment line)."""
    comments = (line.strip().lstrip("#").strip() for line in cell.source.splitlines() if line.strip().startswith("#"))
    return {c for c in comments if re.fullmatch(r"NBVAL_[A-Z_]+", c)}


def cell_marks(cell) -> set[str]:
    """The nbval markers that apply to a cell, from its tags and from comment markers, as NBVAL_* names."""
    tags = cell.get("metadata", {}).get("tags", []) or []
    return comment_marks(cell) | {TAG_MARKS[t] for t in tags if t in TAG_MARKS}


def compared_output(output) -> bool:
    """True when nbval compares something real in this output: a stream, an error, or a text result
    that is neither a widget view nor a figure's repr. (nbval skips a widget's model and an image, but it does
    compare their text/plain: the widget's repr and '<IPython.core.display.Image object>', which check nothing.)"""
    if output.output_type in ("stream", "error"):
        return True
    data = output.get("data", {})
    if WIDGET_MIME in data:
        return False
    text = data.get("text/plain", "")
    if isinstance(text, list):
        text = "".join(text)
    if not text or re.fullmatch(r"<(Figure|matplotlib\.\S+|IPython\.core\.display\.Image)( [^>]*)?>", text.strip()):
        return bool(data.get("text/html"))  # an HTML table is compared; an image alone is not
    return True


def is_checked(cell) -> bool:
    """Strict nbval compares real output in this cell: not skipped or ignored, and a compared output."""
    return not (cell_marks(cell) & set(SKIP_MARKS)) and any(compared_output(o) for o in cell.outputs)


def checked_fraction(nb) -> float:
    """Share of code cells whose output strict nbval really compares (see is_checked)."""
    cells = code_cells(nb)
    if not cells:
        return 0.0
    return sum(is_checked(c) for c in cells) / len(cells)


@dataclass
class NotebookRun:
    """What one execution of a notebook cost, and the first error it stopped at (None if it passed)."""

    path: Path
    wall_s: float
    slowest_cell_s: float
    slowest_cell: int
    peak_rss_mib: float
    checked: float
    error: str | None = None


class _PeakRss:
    """Samples the kernel's RSS plus its workers' private memory in a thread; keeps the peak.

    Forked DataLoader workers share the kernel's pages; adding their full RSS would count the
    same memory once per worker, so workers count only what they own (USS).
    """

    def __init__(self, interval: float = 0.05):
        self.interval, self.peak, self._stop = interval, 0, threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        me = psutil.Process()
        while not self._stop.is_set():
            total = 0
            for kernel in me.children():
                try:
                    total += kernel.memory_info().rss
                    for worker in kernel.children(recursive=True):
                        total += worker.memory_full_info().uss
                except psutil.Error:  # a process that just ended
                    pass
            self.peak = max(self.peak, total)
            self._stop.wait(self.interval)

    def __enter__(self) -> "_PeakRss":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def _client(nb, path: Path, **hooks):
    from nbclient import NotebookClient

    return NotebookClient(nb, timeout=600, kernel_name="python3", record_timing=False,
                          resources={"metadata": {"path": str(path.parent)}}, **hooks)


def coalesce_streams(outputs: list) -> list:
    """Merge consecutive stream outputs of the same name (stdout, stderr), as nbval compares them.

    How the kernel splits one cell's printing into messages depends on timing; merged, a rerun writes
    the same outputs.
    """
    merged: list = []
    for output in outputs:
        if (output.get("output_type") == "stream" and merged and merged[-1].get("output_type") == "stream"
                and merged[-1].get("name") == output.get("name")):
            merged[-1]["text"] = merged[-1]["text"] + output["text"]
        else:
            merged.append(output)
    return merged


def with_thread_defaults(environ: dict[str, str]) -> dict[str, str]:
    """`environ` with THREAD_DEFAULTS added where it does not set them (a user's own setting wins)."""
    return {**THREAD_DEFAULTS, **environ}


def kernel_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a notebook kernel starts with: THREAD_DEFAULTS unless this process's environment sets
    them, then this process's, then KERNEL_ENV, then `extra`; its
    PYTHONPATH starts with the folder this ptlab is in, so the kernel imports the ptlab that runs it (a
    kernel starts in the notebook's folder, where `import ptlab` would find the one pip installed, which
    in a second checkout of the repository is another one)."""
    return env_importing_this_ptlab({**with_thread_defaults(dict(os.environ)), **KERNEL_ENV, **(extra or {})})


def run_notebook(path: Path, write: bool = False, env: dict[str, str] | None = None) -> NotebookRun:
    """Execute one notebook top to bottom in a fresh kernel; optionally write the outputs back.

    The kernel gets kernel_env(env): this process's environment with KERNEL_ENV and `env` on top
    (this process's own environment is left alone). A cell that raises ends the run; the error is
    recorded in the result rather than raised.
    """
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.read(path, as_version=4)
    cell_times: dict[int, float] = {}
    started: dict[int, float] = {}

    def on_start(cell, cell_index):
        started[cell_index] = time.perf_counter()

    def on_done(cell, cell_index, **_):
        cell_times[cell_index] = time.perf_counter() - started.get(cell_index, time.perf_counter())

    error = None
    start = time.perf_counter()
    with _PeakRss() as rss:
        try:
            _client(nb, path, on_cell_start=on_start, on_cell_executed=on_done).execute(env=kernel_env(env))
        except CellExecutionError as err:
            failed = max(started, default=-1)
            error = f"cell {failed}: {err.ename}: {str(err.evalue).strip()[:200]}"
    wall = time.perf_counter() - start
    if write and error is None:
        for cell in nb.cells:
            cell.metadata.pop("execution", None)
            if cell.cell_type == "code":
                cell.outputs = coalesce_streams(cell.outputs)
        nbformat.write(nb, path)
    slowest = max(cell_times, key=cell_times.get) if cell_times else -1
    return NotebookRun(path, wall, cell_times.get(slowest, 0.0), slowest, rss.peak / 2**20,
                       checked_fraction(nb), error)


def execute_in_place(paths: list[Path]) -> int:
    """Re-execute every notebook on the CPU (CPU_ONLY_ENV) and store its outputs (what `make notebooks` runs)."""
    failed = 0
    for path in notebook_paths(paths):
        run = run_notebook(path, write=True, env=CPU_ONLY_ENV)
        if run.error:
            failed += 1
            print(f"{path}: NOT written, it failed at {run.error}")
        else:
            print(f"{path}: executed in {run.wall_s:.1f} s, {run.checked:.0%} of code cells output-checked")
    return 1 if failed else 0


def budget_problems(run: NotebookRun) -> list[str]:
    """Which of the course's per-notebook budgets this run broke."""
    problems = [f"failed at {run.error}"] if run.error else []
    if run.wall_s > notebook_budget_s(run.path):
        problems.append(f"ran {run.wall_s:.0f} s > {notebook_budget_s(run.path):.0f} s")
    if run.slowest_cell_s > BUDGETS["cell_s"]:
        problems.append(f"cell {run.slowest_cell} took {run.slowest_cell_s:.0f} s > {BUDGETS['cell_s']:.0f} s")
    if run.peak_rss_mib > BUDGETS["rss_mib"]:
        problems.append(f"peak RSS {run.peak_rss_mib:.0f} MiB > {BUDGETS['rss_mib']:.0f} MiB")
    if run.checked < BUDGETS["checked"]:
        problems.append(f"only {run.checked:.0%} of code cells output-checked < {BUDGETS['checked']:.0%}")
    return problems
