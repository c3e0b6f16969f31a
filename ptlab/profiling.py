"""torch.profiler made quick to read: the top operators, named ranges, memory, a trace file, and a verdict.

`profile_training(model, loader, optimizer, steps=10)` profiles a few training steps, each split into
two `record_function` ranges, "data" (waiting for the next batch) and "compute" (forward, backward,
optimizer step), and says whether the step is input-bound or compute-bound from their totals.
`profiled()` is the same profiler around any block of code. Both can write a Chrome trace that
opens in https://ui.perfetto.dev or chrome://tracing.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function

from ptlab.claims import measured

DATA, COMPUTE = "data", "compute"
LOADER_KEEPS_UP_SHARE = 0.10   # waiting for data less than this share of the step: the loader keeps up
INPUT_BOUND_SHARE = 0.5        # more than this: the step is input-bound


@dataclass
class ProfileReport:
    """What one profile found; print it for the tables and the verdict."""

    table: str = ""
    ranges_ms: dict[str, float] = field(default_factory=dict)
    peak_memory_table: str = ""
    trace: Path | None = None

    @property
    def data_share(self) -> float | None:
        """Share of data + compute time spent waiting for data (None without both ranges)."""
        data, compute = self.ranges_ms.get(DATA), self.ranges_ms.get(COMPUTE)
        if data is None or compute is None or data + compute == 0:
            return None
        return data / (data + compute)

    @property
    def verdict(self) -> str:
        """Where the step's time goes and what faster data loading could save at most; or why there is no verdict."""
        share = self.data_share
        if share is None:
            return "no verdict: profile a step with both a 'data' and a 'compute' range (profile_training does)"

        percent = measured(share * 100, 3)
        # Amdahl: loading in no time at all removes the waiting and nothing else, so it saves at most `share`.
        speedup = f" (at most {measured(1 / (1 - share), 3)}x faster)" if share < 1 else ""
        most = f"save up to {percent}% of the time{speedup}"
        if share > INPUT_BOUND_SHARE:
            return (f"input-bound: {percent}% of the step waits for data. Faster loading would {most}: try more "
                    "DataLoader workers, cheaper transforms, or data prepared once and cached")
        if share >= LOADER_KEEPS_UP_SHARE:
            return (f"compute-bound, but data loading costs {percent}% of the step: faster loading (more DataLoader "
                    f"workers, cheaper transforms, cached data) would {most}; the other "
                    f"{measured(100 - share * 100, 3)}% is compute")
        return (f"compute-bound: {percent}% of the step waits for data: the loader keeps up, and faster loading would "
                f"save at most {percent}%. A smaller model, mixed precision or torch.compile may speed up the rest")

    def __str__(self) -> str:
        ranges = "\n".join(f"  {name:<10}{measured(ms)} ms" for name, ms in self.ranges_ms.items())
        parts = ["top operators by self CPU time:", self.table, "named ranges (total):", ranges]
        if self.peak_memory_table:
            parts += ["operators by memory they allocated:", self.peak_memory_table]
        if self.trace is not None:
            parts.append(f"trace written to {self.trace.name}: open it in https://ui.perfetto.dev or chrome://tracing")
        parts.append(self.verdict)
        return "\n".join(parts)

    def __repr__(self) -> str:
        return str(self)


def _activities() -> list[ProfilerActivity]:
    return [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])


def _report(prof, ranges: Iterable[str], row_limit: int, trace: str | Path | None) -> ProfileReport:
    averages = prof.key_averages()
    names = set(ranges)
    report = ProfileReport(
        table=averages.table(sort_by="self_cpu_time_total", row_limit=row_limit),
        ranges_ms={e.key: e.cpu_time_total / 1000 for e in averages if e.key in names},
        peak_memory_table=averages.table(sort_by="self_cpu_memory_usage", row_limit=min(row_limit, 5)),
    )
    if trace is not None:
        report.trace = Path(trace)
        report.trace.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(report.trace))
    return report


@contextlib.contextmanager
def _quiet_native_stderr() -> Iterator[None]:
    """Silence what C++ writes to file descriptor 2 (Kineto's 'profiler_start' lines with a timestamp)."""
    import os
    import sys

    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no real fd 2 (some embedded interpreters): leave it as it is
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


@contextlib.contextmanager
def profiled(trace: str | Path | None = None, ranges: Iterable[str] = (DATA, COMPUTE),
             row_limit: int = 10) -> Iterator[ProfileReport]:
    """Profile the block (CPU, and CUDA when present, with memory); the yielded report fills in on exit.

    Name parts of the block with torch.profiler.record_function("data") / ("compute") to get a verdict.
    """
    report = ProfileReport()
    prof = profile(activities=_activities(), profile_memory=True)
    with _quiet_native_stderr():  # only the profiler's own start-up log; the block's stderr is untouched
        prof.__enter__()
    try:
        yield report
    finally:
        with _quiet_native_stderr():
            prof.__exit__(None, None, None)
    filled = _report(prof, ranges, row_limit, trace)
    report.__dict__.update(filled.__dict__)


def profile_training(model: nn.Module, loader: Iterable, optimizer: torch.optim.Optimizer, *, steps: int = 10,
                     warmup: int = 1, loss_fn: Callable | None = None, trace: str | Path | None = None,
                     row_limit: int = 10) -> ProfileReport:
    """Profile `steps` training steps after `warmup` unprofiled ones, each split into 'data' and 'compute'.

    The warm-up steps take the one-off costs (the first autograd pass, the optimizer's state) out of
    the picture. The model is trained by these steps: profile a copy if that matters.
    """
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an int >= 1, got {steps!r}")
    if not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be an int >= 0, got {warmup!r}")
    loss_fn = loss_fn or nn.functional.cross_entropy
    device = next(model.parameters()).device
    batches = iter(loader)
    model.train()

    def step() -> bool:
        with record_function(DATA):
            try:
                X, y = next(batches)
            except StopIteration:
                return False
            X, y = X.to(device), y.to(device)
        with record_function(COMPUTE):
            loss = loss_fn(model(X), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if device.type == "cuda":
                torch.cuda.synchronize()
        return True

    for _ in range(warmup):
        step()
    with profiled(trace=trace, row_limit=row_limit) as report:
        for _ in range(steps):
            if not step():
                break
    return report
