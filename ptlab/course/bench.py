"""`make bench`: run every notebook once and report time, memory and the checked share against the budgets
(ptlab.course.nbrun.BUDGETS), then the tools' speed tables; `make bench-busy`: every notebook quiet and beside
one busy process, with the busy/quiet ratios."""
from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import nn

from ptlab.amp import bf16_matmul_kind, format_speed_table, peak_fractions, speed_comparison, training_step_flops
from ptlab.compiling import use_inductor_cache_per_cpu_capability
from ptlab.course.nbrun import BUDGETS, NotebookRun, budget_problems, kernel_env, notebook_paths, run_notebook
from ptlab.data import to_float_tensors
from ptlab.models import SmallCNN
from ptlab.speed_ladder import format_ladder, speed_ladder
from ptlab.thread_pool import start_busy_process, stop_busy_process, thread_report
from ptlab.timing import compare, matmul_flops
from ptlab.watch import watch

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
    policy = kernel_env().get("OMP_WAIT_POLICY") or "unset"          # what the kernels ran with, not this process
    return (f"torch {torch.__version__}, {torch.get_num_threads()} threads, CPU capability "
            f"{torch.backends.cpu.get_cpu_capability()}, {os.cpu_count()} CPUs, the kernels' OMP_WAIT_POLICY="
            f"{policy}; busy: one process spinning in pure Python")


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


# ---------------------------------------------------------------- the tools' speed tables, for make bench
def speed_report(width: int = 24) -> str:
    """The speed table `make bench` prints for the chapter-4 SmallCNN: images per CPU-second in each of VARIANTS,
    the ratio to float32 and the fraction of each dtype's measured matmul peak, all on one thread (see
    ptlab.amp.speed_comparison), under a line that says which bf16 kernels ran (bf16_matmul_kind).

    A few seconds (fewer batches where torch falls back to its own bf16 kernels). Any failure gives one
    'skipped' line instead: the notebooks' verdicts above stand either way.
    """
    try:
        peaks = matmul_flops((torch.float32, torch.bfloat16), threads=1)   # speed_comparison's thread count
        bf16 = bf16_matmul_kind(peaks)
        n_batches, batch_size = (3, 32) if bf16.kind == "fallback" else (5, 64)  # the first batch warms up, untimed
        X, y = to_float_tensors(train=True)                      # (N, 3, 32, 32), (N,)
        batches = [(X[i * batch_size:(i + 1) * batch_size], y[i * batch_size:(i + 1) * batch_size])
                   for i in range(n_batches)]

        def make_model() -> torch.nn.Module:
            torch.manual_seed(0)
            return SmallCNN(width=width)

        speeds = speed_comparison(make_model, batches)
        fractions = peak_fractions(speeds, training_step_flops(make_model()), peaks)
    except Exception as err:  # the table is information, not a verdict: say why it is missing
        return f"mixed-precision speed table skipped: {type(err).__name__}: {err}"
    peak_text = ", ".join(f"{name} {flops / 1e9:.3g}" for name, flops in peaks.items())
    return "\n".join([
        f"Mixed precision (chapter 6): SmallCNN(width={width}) training steps, batch {batch_size}, one thread; "
        f"{bf16.kind} bf16 kernels: {bf16.reason}",
        f"matmul peak, GFLOP per CPU-second: {peak_text}",
        format_speed_table(speeds, fractions=fractions)])


def ladder_report(width: int = 16) -> str:
    """The speed ladder `make bench` prints: SmallCNN(width) training steps on one thread, rung by rung.
    Information, never a verdict: any failure gives one 'skipped' line instead. It gives Inductor's disk cache a
    directory per CPU capability (ptlab.compiling.use_inductor_cache_per_cpu_capability) unless one is set."""
    try:
        use_inductor_cache_per_cpu_capability()
        ladder = speed_ladder(width=width)
    except Exception as err:  # the table is information: say why it is missing
        return f"speed ladder skipped: {type(err).__name__}: {err}"
    setup = ladder.rungs[0].setup
    return "\n".join([f"Speed ladder (chapter 8): SmallCNN(width={width}) training steps with AdamW, batch "
                      f"{setup.batch_size}, {ladder.threads} thread(s), images per CPU-second of this process, "
                      f"fastest of {ladder.steps} steps per rung", format_ladder(ladder)])


def measure_overhead(steps: int = 20, batch_size: int = 64, repeats: int = 5) -> dict[str, float]:
    """Chapter 4's SmallCNN training step with and without the watch, side by side: seconds per step (the fastest
    of `repeats` interleaved runs of `steps` steps each) and the overhead."""
    generator = torch.Generator().manual_seed(0)
    X = torch.randn(batch_size, 3, 32, 32, generator=generator)
    y = torch.randint(0, 10, (batch_size,), generator=generator)
    model = SmallCNN(width=16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def train_steps() -> None:
        for _ in range(steps):
            loss = nn.functional.cross_entropy(model(X), y)
            opt.zero_grad()
            loss.backward()
            opt.step()

    def watched() -> None:
        with watch(steps=10 * steps):
            train_steps()

    result = compare(train_steps, watched, warmup=1, repeats=repeats, names=("plain", "watched"))
    # the fastest repeat of each, timed interleaved: another process on a busy machine only ever adds time
    plain, with_watch = min(result.a.seconds) / steps, min(result.b.seconds) / steps
    return {"plain s/step": plain, "watched s/step": with_watch, "overhead": with_watch / plain - 1}


OVERHEAD_BUDGET = 0.25


def overhead_line() -> tuple[str, bool]:
    """make bench's line: the watch's overhead on chapter 4's SmallCNN step, and whether it is within budget."""
    figures = measure_overhead()
    within = figures["overhead"] <= OVERHEAD_BUDGET
    return (f"ptlab watch on a SmallCNN training step (batch 64): {figures['plain s/step'] * 1e3:.1f} ms plain, "
            f"{figures['watched s/step'] * 1e3:.1f} ms watched, overhead {figures['overhead']:+.0%} "
            f"(budget {OVERHEAD_BUDGET:.0%})"), within
