"""`python -m ptlab gpu-check`: every notebook on the GPU with its claims asserted, the GPU tests, one short report.

Made for a borrowed GPU machine and its few minutes: the notebooks run in parallel lanes, slowest first, each cell
with a timeout and the whole run with a deadline, so an unfinished notebook is reported instead of the run hanging.
A claim asserts by raising, so every error output is a failed claim or a crash: each is reported as `NN:cI` (the
course's notation, cell I of nb.cells) with the exception's last line. Outputs are not compared with the stored
ones (those were made on a CPU); the GPU-gated cells' outputs are collected, so a reader sees what the GPU measured.
"""
from __future__ import annotations

import asyncio
import importlib.util
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
import psutil
import torch

from ptlab.core import PTLAB_ROOT, env_importing_this_ptlab
from ptlab.course.gpu_env import (cuda_test_ids, environment_header, fix_lines, local_modules, missing_modules,
                                  third_party_imports)
from ptlab.course.nbrun import cell_marks, kernel_env, notebook_paths

GATED = "torch.cuda.is_available()"
RECORD_VAR = "PTLAB_GPU_RECORD"
# The tests that exercise what a GPU changes besides the @pytest.mark.cuda ones: resume (generator states and
# map_location), checkpoints, and the collectives.
GPU_TEST_FILES = ("tests/tools/test_train_script.py", "tests/tools/test_checkpoint.py",
                  "tests/tools/test_distributed.py")
# Seconds each notebook took on the first H200 run, 4 lanes (shared/reference/gpu/h200-first-run.md): the order
# the lanes take them in, slowest first. A notebook not listed counts as UNKNOWN_S (a new chapter).
FIRST_RUN_S = {"08": 167.0, "07": 72.0, "03": 49.0, "04b": 45.0, "06": 40.0, "05": 39.0, "04": 35.0,
               "01": 15.0, "02": 12.0}
SOLUTION_S, UNKNOWN_S = 12.0, 60.0
# The budget: at most 8 minutes on one H200 with 16 cores. 4 lanes of 4 threads, slowest first: chapter 8 (167 s
# on the first run) fills one lane while the three others take the remaining 16 notebooks (about 400 s in all):
# about 170 s for the notebooks. They must end by DEADLINE_S - TESTS_S = 270 s (1.6x that); the tests get the
# rest, at least TESTS_S; the whole check ends by DEADLINE_S = 420 s (plus GRACE_S only if a kernel hangs in its
# shutdown), a minute under 8 minutes for the start-up and the report.
CELL_TIMEOUT_S, DEADLINE_S, TESTS_S = 240.0, 420.0, 150.0
GRACE_S = 30.0  # after the deadline: time for the kernels' shutdown before the lanes are cancelled
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
GATED_LINES, GATED_TOTAL_LINES, ERROR_LINES = 12, 90, 40


def notebook_label(path: Path) -> str:
    """The course's short name of a notebook: '07', '04b' (the second 04_*), 'sol06' (its solutions)."""
    number = re.match(r"(\d+)_", path.stem)
    if not number:
        return path.stem
    same = sorted(p.stem for p in path.parent.glob(f"{number.group(1)}_*.ipynb"))
    rank = same.index(path.stem) if path.stem in same else 0
    prefix = "sol" if path.parent.name == "solutions" else ""
    return f"{prefix}{number.group(1)}{'abcdefghij'[rank] if rank else ''}"


def cell_label(path: Path, index: int) -> str:
    """`NN:cI`: cell `index` of nb.cells in the notebook at `path`."""
    return f"{notebook_label(path)}:c{index}"


def slowest_first(paths: list[Path]) -> list[Path]:
    """The notebooks in the order the lanes take them: longest expected run first (FIRST_RUN_S)."""
    def expected(path: Path) -> float:
        label = notebook_label(path)
        return SOLUTION_S if label.startswith("sol") else FIRST_RUN_S.get(label, UNKNOWN_S)
    return sorted(paths, key=lambda p: -expected(p))


def default_lanes(cpus: int | None = None) -> int:
    """min(4, CPUs // 4), at least 1: 4 lanes of 4 threads on a 16-core GPU machine."""
    cpus = cpus or os.cpu_count() or 1
    return min(4, cpus // 4 or 1)


def _text(value) -> str:
    return ANSI.sub("", "".join(value) if isinstance(value, list) else str(value))


def output_text(output) -> str:
    """An output as plain text: a stream's text, a result's text/plain, an error's last traceback line."""
    if output.get("output_type") == "stream":
        return _text(output.get("text", ""))
    if output.get("output_type") == "error":
        return f"{output.get('ename')}: {output.get('evalue')}\n"
    text = output.get("data", {}).get("text/plain", "")
    return _text(text) + "\n" if text else ""


def error_line(output) -> str:
    """'ename: ' and the last non-empty line of the exception's message."""
    lines = [line for line in _text(output.get("evalue", "")).splitlines() if line.strip()]
    return f"{output.get('ename')}: {lines[-1].strip()}" if lines else str(output.get("ename"))


@dataclass
class NotebookResult:
    """One notebook's run: its wall time, how far it got, its errors and its GPU-gated outputs."""

    path: Path
    status: str = "not started"  # 'done', or why it stopped: the deadline, a cell's timeout, a dead kernel
    wall_s: float = 0.0
    cells: int = 0
    current: int = -1
    errors: list[str] = field(default_factory=list)
    tracebacks: list[str] = field(default_factory=list)
    gated: list[tuple[str, str]] = field(default_factory=list)
    nb: object = None

    @property
    def label(self) -> str:
        """The short name of the notebook."""
        return notebook_label(self.path)

    def read_outputs(self) -> None:
        """Collect the error outputs (expected ones tagged raises-exception excepted) and the gated cells' text."""
        self.errors, self.tracebacks, self.gated = [], [], []
        for index, cell in enumerate(self.nb.cells if self.nb is not None else []):
            if cell.cell_type != "code":
                continue
            if GATED in cell.source:
                self.gated.append((cell_label(self.path, index), "".join(output_text(o) for o in cell.outputs)))
            if "NBVAL_RAISES_EXCEPTION" in cell_marks(cell):
                continue
            for output in cell.outputs:
                if output.get("output_type") == "error":
                    self.errors.append(f"{cell_label(self.path, index)} {error_line(output)}"[:240])
                    trace = "\n".join(_text(t) for t in output.get("traceback", []))
                    self.tracebacks.append(f"== {cell_label(self.path, index)} ({self.path})\n{trace}\n")


async def _execute(result: NotebookResult, env: dict[str, str], cell_timeout_s: float, deadline: float) -> None:
    """Run one notebook cell by cell in a fresh kernel; stop at the deadline, a cell's timeout or a dead kernel."""
    from nbclient import NotebookClient
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    result.nb = nb = nbformat.read(result.path, as_version=4)
    result.cells, result.status = len(nb.cells), "running"

    def on_start(cell, cell_index):
        result.current = cell_index

    client = NotebookClient(nb, timeout=int(cell_timeout_s), kernel_name="python3", allow_errors=True,
                            record_timing=False, on_cell_start=on_start,
                            resources={"metadata": {"path": str(result.path.parent)}})
    start = time.monotonic()
    try:
        async with client.async_setup_kernel(env=env):
            try:
                for index, cell in enumerate(nb.cells):
                    left = deadline - time.monotonic()
                    if left < 1:
                        result.status = f"not finished (deadline, at c{index} of {len(nb.cells)})"
                        client.shutdown_kernel = "immediate"
                        break
                    client.timeout = int(max(1, min(cell_timeout_s, left)))
                    await client.async_execute_cell(cell, index, execution_count=client.code_cells_executed + 1)
                else:
                    result.status = "done"  # the kernel shuts down gracefully: its atexit hooks run
            except BaseException:
                client.shutdown_kernel = "immediate"  # a kernel still busy with a cell, or a dead one
                raise
    except CellTimeoutError:
        at = result.current
        result.status = (f"not finished (deadline, at c{at} of {len(nb.cells)})" if time.monotonic() >= deadline - 1
                         else f"stopped: {cell_label(result.path, at)} timed out after {cell_timeout_s:.0f} s")
    except DeadKernelError:
        result.status = f"stopped: the kernel died in {cell_label(result.path, result.current)}"
    except Exception as err:  # a kernel that does not start, a broken notebook: report it, run the others
        result.status = f"stopped: {type(err).__name__}: {str(err).strip()[:160]}"
    finally:
        result.wall_s = time.monotonic() - start
        result.read_outputs()


def run_notebooks(paths: list[Path], lanes: int, env: dict[str, str], cell_timeout_s: float,
                  deadline: float, log=None) -> list[NotebookResult]:
    """Run the notebooks in `lanes` parallel kernels, slowest first, until each is done or the deadline passes."""
    results = [NotebookResult(p) for p in slowest_first(paths)]
    queue = list(results)
    began = time.monotonic()

    async def lane() -> None:
        while queue and time.monotonic() < deadline - 1:
            result = queue.pop(0)
            await _execute(result, env, cell_timeout_s, deadline)
            if log:
                log(f"[{time.monotonic() - began:5.0f} s] {result.label}: {result.status}, "
                    f"{len(result.errors)} errors, {result.wall_s:.1f} s")

    async def all_lanes() -> None:
        tasks = [asyncio.ensure_future(lane()) for _ in range(lanes)]
        _, pending = await asyncio.wait(tasks, timeout=max(0.0, deadline - time.monotonic()) + GRACE_S)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=GRACE_S)

    asyncio.run(all_lanes())
    for result in results:
        if result.status == "running":  # cancelled after the grace period
            result.status = f"not finished (cancelled, at c{result.current} of {result.cells})"
            result.read_outputs()
    return sorted(results, key=lambda r: str(r.path))


def end_leftover_processes(before: set[int]) -> int:
    """Kill what the kernels left behind (a torchrun's process, a DataLoader worker): this process's descendants
    that were not there before the notebooks started (`before`, their pids)."""
    children = [c for c in psutil.Process().children(recursive=True) if c.pid not in before]
    for child in children:
        try:
            child.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(children, timeout=5)
    return len(children)


@dataclass
class TestRun:
    """The pytest run: its summary line, the failures, and whether the timeout cut it."""

    summary: str
    failures: list[str]
    passed: bool
    wall_s: float


def default_test_ids(root: Path = Path(PTLAB_ROOT)) -> list[str]:
    """The GPU-relevant tests: those marked `cuda`, and GPU_TEST_FILES."""
    files = [f for f in GPU_TEST_FILES if (root / f).exists()]
    return [t for t in cuda_test_ids(root / "tests") if t.split("::")[0] not in files] + files


def pytest_command(ids: list[str], timeout_s: float) -> list[str]:
    """pytest verbose, every failure reported (no -x); pytest-timeout and pytest-xdist used when installed."""
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-v", "-ra"]
    if importlib.util.find_spec("pytest_timeout"):
        command += [f"--timeout={int(max(10, min(300, timeout_s)))}"]
    if importlib.util.find_spec("xdist"):
        command += ["-n", str(max(2, min(8, (os.cpu_count() or 2) // 2)))]
    return command + list(ids)


def run_tests(ids: list[str], timeout_s: float, log_path: Path, root: Path = Path(PTLAB_ROOT)) -> TestRun:
    """Run the tests in a subprocess with a timeout (its whole process group is killed at it); read the outcome."""
    command = pytest_command(ids, timeout_s)
    start, cut = time.monotonic(), False
    with open(log_path, "w", encoding="utf-8") as log:
        log.write(" ".join(command) + "\n")
        log.flush()
        proc = subprocess.Popen(command, cwd=root, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env=env_importing_this_ptlab())
        try:
            proc.wait(timeout=max(1.0, timeout_s))
        except subprocess.TimeoutExpired:
            cut = True
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    wall = time.monotonic() - start
    text = ANSI.sub("", log_path.read_text(encoding="utf-8", errors="replace"))
    failures = [line for line in text.splitlines() if line.startswith(("FAILED ", "ERROR "))]
    ends = [line.strip("= ") for line in text.splitlines() if re.fullmatch(r"=+ .* in [\d.]+s.* =+", line)]
    if cut or not ends:
        counts = {w: len(re.findall(rf"::\S+ {w}\b", text)) for w in ("PASSED", "FAILED", "ERROR", "SKIPPED")}
        failures = failures or [line for line in text.splitlines() if re.search(r"::\S+ (FAILED|ERROR)\b", line)]
        so_far = ", ".join(f"{n} {w.lower()}" for w, n in counts.items() if n)
        why = f"cut at {timeout_s:.0f} s" if cut else f"pytest exited {proc.returncode} without a summary"
        return TestRun(f"{why}: {so_far or 'nothing'} so far", failures, False, wall)
    return TestRun(ends[-1], failures, proc.returncode == 0, wall)


def _gated_section(results: list[NotebookResult]) -> list[str]:
    lines: list[str] = []
    for result in results:
        for label, text in result.gated:
            body = text.strip().splitlines() or ["(no output)"]
            shown = [line[:160] for line in body[:GATED_LINES]]
            if len(body) > GATED_LINES:
                shown.append(f"... {len(body) - GATED_LINES} more lines in gpu-cells.txt")
            lines += [f"**{label}**", "```", *shown, "```"]
    if len(lines) > GATED_TOTAL_LINES:
        lines = lines[:GATED_TOTAL_LINES] + ["```", "... the rest in gpu-cells.txt"]
    return lines or ["(none ran)"]


def render_report(header: list[str], settings: str, packages: list[str], results: list[NotebookResult],
                  tests: TestRun | str, files: list[str], verdict: str) -> str:
    """report.md: header, the notebook table, the error lines, the test summary, the GPU-gated outputs."""
    errors = [e for r in results for e in r.errors]
    unfinished = [r for r in results if r.status != "done"]
    lines = ["# GPU check", "", *header, f"- {settings}", *[f"- {p}" for p in packages], "",
             f"## Notebooks: {len(results)}, {len(errors)} cell errors, {len(unfinished)} not finished", "",
             "| notebook | s | errors |", "|---|---|---|"]
    for r in results:
        count = str(len(r.errors)) + ("" if r.status == "done" else f"; {r.status}")
        name = r.path.stem if r.label == r.path.stem else f"{r.label} {r.path.stem}"
        lines.append(f"| {name} | {r.wall_s:.1f} | {count} |")
    lines.append("")
    lines += errors[:ERROR_LINES] + ([f"... {len(errors) - ERROR_LINES} more in tracebacks.txt"]
                                     if len(errors) > ERROR_LINES else [])
    lines += ["", "## Tests", ""]
    if isinstance(tests, str):
        lines.append(tests)
    else:
        lines += [f"{tests.summary} ({tests.wall_s:.0f} s; tests.txt has the log)", *tests.failures[:ERROR_LINES]]
    lines += ["", f"## GPU-gated cells (code cells that test `{GATED}`)", "", *_gated_section(results), "",
              f"Files: {', '.join(files)}", "", verdict]
    return "\n".join(lines) + "\n"


def _write_files(out: Path, results: list[NotebookResult], keep_notebooks: bool) -> None:
    (out / "tracebacks.txt").write_text("".join(t for r in results for t in r.tracebacks), encoding="utf-8")
    (out / "gpu-cells.txt").write_text("".join(f"== {label}\n{text}\n" for r in results for label, text in r.gated),
                                       encoding="utf-8")
    if keep_notebooks:
        (out / "executed").mkdir(exist_ok=True)
        for r in results:
            if r.nb is not None:
                nbformat.write(r.nb, out / "executed" / f"{r.label}_{r.path.name}")


def failures(results: list[NotebookResult], missing: list[str], tests: TestRun | str) -> list[str]:
    """What failed, counted: cell errors, unfinished notebooks, missing packages, the test run."""
    counts = ((sum(len(r.errors) for r in results), "cell errors"),
              (sum(r.status != "done" for r in results), "notebooks not finished"),
              (len(missing), "packages missing"), (int(isinstance(tests, TestRun) and not tests.passed),
                                                   "test run failed"))
    return [f"{n} {what}" for n, what in counts if n]


def gpu_check(notebooks: list[Path], out: Path, lanes: int, cell_timeout_s: float, deadline_s: float,
              tests_s: float, test_ids: list[str] | None, allow_cpu: bool = False, keep_notebooks: bool = False,
              log=None) -> int:
    """The whole check; returns the exit status: 0 all passed, 1 something failed, 2 refused (no GPU).

    report.md is written when the notebooks start, again before the tests, and last at the end, so a run cut
    short from outside still leaves what it had found."""
    start = time.monotonic()
    if not torch.cuda.is_available() and not allow_cpu:
        print("gpu-check: no CUDA GPU here (torch.cuda.is_available() is False); run it on a GPU machine, "
              "or add --allow-cpu to rehearse it on the CPU", file=sys.stderr)
        return 2
    log = log or (lambda line: print(line, file=sys.stderr, flush=True))
    root = Path(PTLAB_ROOT)
    out.mkdir(parents=True, exist_ok=True)
    record = (out / "gpu-record.json").resolve()
    record.unlink(missing_ok=True)  # the lessons append to it: this run's figures only
    header = environment_header(root)
    log("\n".join(header))
    paths = notebook_paths(notebooks)
    sources = sorted((root / "ptlab").rglob("*.py")) + [root / t.split("::")[0] for t in (test_ids or [])]
    sources = [s for s in sources if s.suffix == ".py" and s.exists()]
    missing = missing_modules(third_party_imports(paths, sources, local_modules(root / "tests")))
    packages = fix_lines(missing, root) or ["packages: all that the notebooks, ptlab and the tests import are here"]
    threads = max(1, (os.cpu_count() or 1) // lanes)
    notebook_deadline = start + deadline_s - (tests_s if test_ids else 0.0)
    settings = (f"{len(paths)} notebooks in {lanes} lanes x OMP_NUM_THREADS={threads}; cell timeout "
                f"{cell_timeout_s:.0f} s; deadline {deadline_s:.0f} s, notebooks stop at "
                f"{notebook_deadline - start:.0f} s; {RECORD_VAR}=<this folder>/{record.name}")
    log(settings)

    def write(results: list[NotebookResult], tests: TestRun | str, verdict: str) -> str:
        files = ["report.md"] + sorted(p.name for p in out.iterdir() if p.is_file() and p.name != "report.md")
        report = render_report(header, settings, packages, results, tests, files, verdict)
        (out / "report.md").write_text(report, encoding="utf-8")
        return report

    write([], "not run yet", "RESULT: INCOMPLETE (the notebooks were running)")
    env = kernel_env({"OMP_NUM_THREADS": str(threads), RECORD_VAR: str(record)})
    before = {c.pid for c in psutil.Process().children(recursive=True)}
    results = run_notebooks(paths, lanes, env, cell_timeout_s, notebook_deadline, log)
    if end_leftover_processes(before):
        log("ended processes the kernels left behind")
    _write_files(out, results, keep_notebooks)
    tests: TestRun | str = "not run (--no-tests)"
    if test_ids:
        write(results, "not run yet", "RESULT: INCOMPLETE (the tests were running)")
        left = start + deadline_s - time.monotonic()
        log(f"tests: {len(test_ids)} ids, timeout {left:.0f} s")
        tests = run_tests(test_ids, left, out / "tests.txt", root)
    failed = failures(results, missing, tests)
    verdict = (f"RESULT: {'FAIL (' + ', '.join(failed) + ')' if failed else 'PASS'} "
               f"in {time.monotonic() - start:.0f} s")
    print(write(results, tests, verdict))
    return 1 if failed else 0
