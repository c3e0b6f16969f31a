"""`make bench`: run every notebook once and report time, memory and the checked share against the budgets
(ptlab.course.nbrun.BUDGETS), then the tools' speed tables; `make bench-busy`: every notebook quiet and beside
one busy process, with the busy/quiet ratios."""
from __future__ import annotations

import os
from pathlib import Path

from ptlab.amp import speed_report
from ptlab.course.nbrun import BUDGETS, NotebookRun, budget_problems, notebook_paths, run_notebook
from ptlab.speed_ladder import ladder_report
from ptlab.thread_pool import start_busy_process, stop_busy_process, thread_report
from ptlab.watch import overhead_line

# The busy mode's goal (issue 40): beside one busy process the whole course at most 1.5x as long as quiet,
# and no cell over the cell budget.
BUSY_GOAL = 1.5


def bench(paths: list[Path], markdown: bool = False, speed: bool = True) -> int:
    """Run every notebook once, even after one fails; print wall time, slowest cell, peak RSS,
    checked share and pass/fail for each, then (with `speed`) chapter 6's mixed-precision speed
    table, chapter 8's speed ladder, the watch's overhead on chapter 4's step and the thread pool's step times
    quiet, beside a busy process and pinned to one core (ptlab.thread_pool.thread_report), then every budget
    that was broken."""
    from tqdm.auto import tqdm

    runs, problems = [], []
    for path in tqdm(notebook_paths(paths), desc="notebooks", unit="nb"):
        run = run_notebook(path)
        runs.append(run)
        problems += [f"{path}: {p}" for p in budget_problems(run)]
    total = sum(r.wall_s for r in runs)
    if total > BUDGETS["total_s"]:
        problems.append(f"the whole course ran {total:.0f} s > {BUDGETS['total_s']:.0f} s")
    print(bench_table(runs))
    if markdown:
        print("\n" + bench_markdown(runs))
    if speed:
        print("\n" + speed_report())
        print("\n" + ladder_report())
        line, within = overhead_line()
        print(line)
        if not within:
            problems.append(line)
        print("\n" + "\n".join(thread_report()))
    for p in problems:
        print(f"OVER BUDGET OR FAILED: {p}")
    return 1 if problems else 0


def run_verdict(run: NotebookRun) -> str:
    """'pass', 'FAIL' (a cell raised) or 'over budget'."""
    return "FAIL" if run.error else "over budget" if budget_problems(run) else "pass"


def bench_table(runs: list[NotebookRun]) -> str:
    """The bench results as a fixed-width table, with the machine it ran on."""
    import torch

    width = max([len(str(r.path)) for r in runs] + [8])
    lines = [f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
             f"CPU capability {torch.backends.cpu.get_cpu_capability()}",
             f"{'notebook':<{width}}  wall s  slowest cell s  peak RSS MiB  checked  result"]
    for r in runs:
        lines.append(f"{str(r.path):<{width}}  {r.wall_s:6.1f}  {r.slowest_cell_s:8.1f} (#{r.slowest_cell:<2})"
                     f"  {r.peak_rss_mib:12.0f}  {r.checked:6.0%}  {run_verdict(r)}")
    lines.append(f"{'total':<{width}}  {sum(r.wall_s for r in runs):6.1f}")
    return "\n".join(lines)


def bench_markdown(runs: list[NotebookRun]) -> str:
    """The bench results as the README's Markdown table."""
    import platform

    import torch

    rows = [f"Measured by `make bench` on {platform.machine()}, {os.cpu_count()} CPUs, "
            f"{torch.backends.cpu.get_cpu_capability()} kernels, {torch.get_num_threads()} torch threads:", "",
            "| Notebook | wall s | slowest cell s | peak memory MiB | compared cells | result |",
            "|---|---|---|---|---|---|"]
    for r in runs:
        rows.append(f"| {r.path.as_posix()} | {r.wall_s:.1f} | {r.slowest_cell_s:.1f} | {r.peak_rss_mib:.0f} "
                    f"| {r.checked:.0%} | {run_verdict(r)} |")
    rows.append(f"| **all** | **{sum(r.wall_s for r in runs):.1f}** | | | | |")
    return "\n".join(rows)




def _busy_run(path: Path) -> NotebookRun:
    busy = start_busy_process(seconds=3600.0)
    try:
        return run_notebook(path)
    finally:
        stop_busy_process(busy)


def busy_bench(paths: list[Path], markdown: bool = False) -> int:
    """Run every notebook twice, one run after the other: quiet, then beside one busy process (pure Python
    spinning on one core, ptlab.thread_pool.start_busy_process). Print each notebook's busy/quiet ratio and the
    whole course's; exit 1 when a run fails, a cell of a busy run takes over BUDGETS['cell_s'], or the whole
    course is over BUSY_GOAL times as slow as quiet."""
    from tqdm.auto import tqdm

    pairs, problems = [], []
    for path in tqdm(notebook_paths(paths), desc="notebooks, quiet then busy", unit="nb"):
        quiet, busy = run_notebook(path), _busy_run(path)
        pairs.append((quiet, busy))
        for label, run in (("quiet", quiet), ("busy", busy)):
            if run.error:
                problems.append(f"{path} ({label}): failed at {run.error}")
        if busy.slowest_cell_s > BUDGETS["cell_s"]:
            problems.append(f"{path} (busy): cell {busy.slowest_cell} took {busy.slowest_cell_s:.0f} s "
                            f"> {BUDGETS['cell_s']:.0f} s")
    ratio = busy_over_quiet(pairs)
    if pairs and ratio > BUSY_GOAL:
        problems.append(f"the whole course ran {ratio:.2f}x as long beside one busy process > {BUSY_GOAL}x")
    print(busy_table(pairs))
    if markdown:
        print("\n" + busy_markdown(pairs))
    for p in problems:
        print(f"OVER BUDGET OR FAILED: {p}")
    return 1 if problems else 0


def busy_over_quiet(pairs: list[tuple[NotebookRun, NotebookRun]]) -> float:
    """Total busy wall time / total quiet wall time."""
    return sum(b.wall_s for _, b in pairs) / max(sum(q.wall_s for q, _ in pairs), 1e-9)


def _machine_line() -> str:
    import torch

    return (f"torch {torch.__version__}, {torch.get_num_threads()} threads, CPU capability "
            f"{torch.backends.cpu.get_cpu_capability()}, {os.cpu_count()} CPUs, OMP_WAIT_POLICY="
            f"{os.environ.get('OMP_WAIT_POLICY', 'unset')}; busy: one process spinning in pure Python")


def busy_table(pairs: list[tuple[NotebookRun, NotebookRun]]) -> str:
    """Quiet and busy wall times per notebook, the ratio and the busy run's slowest cell."""
    width = max([len(str(q.path)) for q, _ in pairs] + [8])
    lines = [_machine_line(), f"{'notebook':<{width}}  quiet s  busy s  busy/quiet  slowest busy cell s"]
    for q, b in pairs:
        lines.append(f"{str(q.path):<{width}}  {q.wall_s:7.1f}  {b.wall_s:6.1f}  {b.wall_s / q.wall_s:9.2f}x"
                     f"  {b.slowest_cell_s:8.1f} (#{b.slowest_cell})")
    lines.append(f"{'total':<{width}}  {sum(q.wall_s for q, _ in pairs):7.1f}  {sum(b.wall_s for _, b in pairs):6.1f}"
                 f"  {busy_over_quiet(pairs):9.2f}x")
    return "\n".join(lines)


def busy_markdown(pairs: list[tuple[NotebookRun, NotebookRun]]) -> str:
    """The busy table as the README's Markdown table."""
    rows = [f"Measured by `make bench-busy`: {_machine_line()}.", "",
            "| Notebook | quiet s | busy s | busy/quiet | slowest busy cell s |", "|---|---|---|---|---|"]
    for q, b in pairs:
        rows.append(f"| {q.path.as_posix()} | {q.wall_s:.1f} | {b.wall_s:.1f} | {b.wall_s / q.wall_s:.2f}x "
                    f"| {b.slowest_cell_s:.1f} (cell {b.slowest_cell}) |")
    rows.append(f"| **all** | **{sum(q.wall_s for q, _ in pairs):.1f}** | **{sum(b.wall_s for _, b in pairs):.1f}** "
                f"| **{busy_over_quiet(pairs):.2f}x** | |")
    return "\n".join(rows)
