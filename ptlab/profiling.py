"""torch.profiler made quick to read: the top operators, named ranges, memory, a trace file, and a verdict.

`profile_training(model, loader, optimizer, steps=10)` profiles a few training steps, each split into
two `record_function` ranges, "data" (waiting for the next batch) and "compute" (forward, backward,
optimizer step), and says whether the step is input-bound or compute-bound from their totals.
`profiled()` is the same profiler around any block of code. Both can write a Chrome trace that
opens in https://ui.perfetto.dev or chrome://tracing.

The printed tables are narrow (operator, self time, share, calls; device time when a GPU was
profiled); torch's own tables with every column are `report.full_table` and `report.full_memory_table`.
One known message is held back: torch's CPU allocator warns (on the first such free, then on every
thousandth) that "Memory block of
unknown size was allocated before the profiling started". It means that a tensor made before the
profile (a weight, a gradient of the step before) was freed inside it, so that free has no matching
allocation in the memory table; it is harmless. Everything else written to stderr during the
profiled block is passed on when the block ends.
"""
from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function

from ptlab.claims import measured
from ptlab.loader_check import INPUT_BOUND_WAIT_SHARE, KEEPS_UP_WAIT_SHARE

DATA, COMPUTE = "data", "compute"
# The one line of native stderr the profiler's block holds back (see the module docstring).
ALLOCATED_BEFORE_PROFILING = "was allocated before the profiling started"
_NAME_WIDTH = 44
# The same bounds as ptlab.loader_check, so the two tools give one label to one share of waiting.
LOADER_KEEPS_UP_SHARE = KEEPS_UP_WAIT_SHARE   # waiting for data less than this share of the step: the loader keeps up
INPUT_BOUND_SHARE = INPUT_BOUND_WAIT_SHARE    # this share or more: the step is input-bound


@dataclass
class ProfileReport:
    """What one profile found; print it for the tables and the verdict."""

    table: str = ""
    ranges_ms: dict[str, float] = field(default_factory=dict)
    peak_memory_table: str = ""
    trace: Path | None = None
    full_table: str = ""         # torch's key_averages().table(...) with every column, by self CPU time
    full_memory_table: str = ""  # the same, by the CPU memory each operator allocated

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
        if share >= INPUT_BOUND_SHARE:
            return (f"input-bound: {percent}% of the step waits for data. Faster loading would {most}: try more "
                    "DataLoader workers, cheaper transforms, or data prepared once and cached")
        if share >= LOADER_KEEPS_UP_SHARE:
            return (f"partly input-bound: data loading costs {percent}% of the step: faster loading (more DataLoader "
                    f"workers, cheaper transforms, cached data) would {most}; the other "
                    f"{measured(100 - share * 100, 3)}% is compute")
        return (f"compute-bound: {percent}% of the step waits for data: the loader keeps up, and faster loading would "
                f"save at most {percent}%. A smaller model, mixed precision or torch.compile may speed up the rest")

    def __str__(self) -> str:
        ranges = "\n".join(f"  {name:<10}{measured(ms)} ms" for name, ms in self.ranges_ms.items())
        parts = ["top operators by self CPU time (every column: report.full_table):", self.table,
                 "named ranges (total):", ranges]
        if self.peak_memory_table:
            parts += ["operators by memory they allocated (every column: report.full_memory_table):",
                      self.peak_memory_table]
        if self.trace is not None:
            parts.append(f"trace written to {_shown(self.trace)}: "
                         "open it in https://ui.perfetto.dev or chrome://tracing")
        parts.append(self.verdict)
        return "\n".join(parts)

    def __repr__(self) -> str:
        return str(self)


def _activities() -> list[ProfilerActivity]:
    return [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])


def _shown(path: Path) -> str:
    """A path as the learner finds it: as given when relative, relative to the working folder when inside it."""
    if not path.is_absolute():
        return str(path)
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _ms(microseconds: float) -> str:
    return f"{microseconds / 1000:.2f} ms"


def _mib(n_bytes: float) -> str:
    return f"{n_bytes / 2**20:.2f} MiB"


def _narrow(averages, skip: set[str], row_limit: int, memory: bool) -> str:
    """A table of the top operators with few columns: by self CPU time, or by the CPU memory they allocated."""
    events = [e for e in averages if e.key not in skip]
    device = any(e.self_device_time_total for e in events)
    if memory:
        device_memory = any(e.self_device_memory_usage for e in events)
        events.sort(key=lambda e: e.self_cpu_memory_usage, reverse=True)
        columns = [("self CPU memory", lambda e: _mib(e.self_cpu_memory_usage))]
        if device_memory:
            columns.append(("self device memory", lambda e: _mib(e.self_device_memory_usage)))
    else:
        total = sum(e.self_cpu_time_total for e in events) or 1.0
        events.sort(key=lambda e: e.self_cpu_time_total, reverse=True)
        columns = [("self CPU", lambda e: _ms(e.self_cpu_time_total)),
                   ("share", lambda e: f"{100 * e.self_cpu_time_total / total:.1f}%")]
        if device:
            columns.append(("self device", lambda e: _ms(e.self_device_time_total)))
    columns.append(("calls", lambda e: str(e.count)))
    rows = [[e.key if len(e.key) <= _NAME_WIDTH else e.key[:_NAME_WIDTH - 3] + "..."] + [f(e) for _, f in columns]
            for e in events[:row_limit]]
    header = ["operator"] + [name for name, _ in columns]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in [header, *rows])


def _report(prof, ranges: Iterable[str], row_limit: int, trace: str | Path | None) -> ProfileReport:
    averages = prof.key_averages()
    names = set(ranges)
    report = ProfileReport(
        table=_narrow(averages, names, row_limit, memory=False),
        ranges_ms={e.key: e.cpu_time_total / 1000 for e in averages if e.key in names},
        peak_memory_table=_narrow(averages, names, min(row_limit, 5), memory=True),
        full_table=averages.table(sort_by="self_cpu_time_total", row_limit=row_limit),
        full_memory_table=averages.table(sort_by="self_cpu_memory_usage", row_limit=min(row_limit, 5)),
    )
    if trace is not None:
        report.trace = Path(trace)
        report.trace.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(report.trace))
    return report


@contextlib.contextmanager
def _native_stderr_without(message: str) -> Iterator[None]:
    """Hold what is written to file descriptor 2 during the block; pass it on afterwards, less lines with `message`
    ("" drops them all)."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no real fd 2 (some embedded interpreters): leave it as it is
        yield
        return
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            try:
                sys.stderr.flush()
            except (OSError, ValueError):
                pass
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            kept = [line for line in held.read().decode(errors="replace").splitlines(keepends=True)
                    if message not in line]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()


def _quiet_native_stderr():
    """Silence what C++ writes to file descriptor 2 (Kineto's 'profiler_start' lines with a timestamp)."""
    return _native_stderr_without("")          # every line contains "": none is passed on


@contextlib.contextmanager
def profiled(trace: str | Path | None = None, ranges: Iterable[str] = (DATA, COMPUTE),
             row_limit: int = 10) -> Iterator[ProfileReport]:
    """Profile the block (CPU, and CUDA when present, with memory); the yielded report fills in on exit.

    Name parts of the block with torch.profiler.record_function("data") / ("compute") to get a verdict.
    What the block writes to stderr reaches it when the block ends, less the allocator's one known
    warning (see the module docstring).
    """
    report = ProfileReport()
    prof = profile(activities=_activities(), profile_memory=True)
    with _quiet_native_stderr():  # only the profiler's own start-up log
        prof.__enter__()
    try:
        with _native_stderr_without(ALLOCATED_BEFORE_PROFILING):
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


# ---------------------------------------------------------------- a GPU step read in the profiler

LAUNCH_PREFIXES = ("cudaLaunch", "cuLaunch")   # cudaLaunchKernel, cudaLaunchKernelExC, cuLaunchKernel, ...
SYNC_WORD = "Synchronize"                      # cudaDeviceSynchronize, cudaStreamSynchronize, cudaEventSynchronize


@dataclass(frozen=True)
class StepProfile:
    """What torch.profiler saw over `steps` calls of a training step (totals; the properties are per step)."""

    steps: int
    wall_s: float          # wall time of the steps, the GPU waited for at the end
    device_s: float        # time the GPU spent running kernels, copies and memsets
    launches: int          # kernel launch calls (rows named cudaLaunch... or cuLaunch...)
    launch_s: float        # CPU time spent inside those calls
    syncs: int             # synchronising runtime calls (rows whose name contains "Synchronize")
    sync_s: float          # CPU time spent inside them, mostly waiting for the GPU
    aten_ops: int          # ATen operator calls, nested ones included (rows named aten::...)

    @property
    def device_share(self) -> float:
        """Share of the wall time the GPU was busy (one stream runs one kernel at a time)."""
        return self.device_s / self.wall_s if self.wall_s > 0 else 0.0

    def __str__(self) -> str:
        s = self.steps
        return "\n".join([
            f"per step: wall {measured(self.wall_s / s * 1e3, 3)} ms, GPU busy "
            f"{measured(self.device_s / s * 1e3, 3)} ms (share {measured(self.device_share, 3)})",
            f"kernel launches per step: {measured(self.launches / s, 3)}, CPU time in them "
            f"{measured(self.launch_s / s * 1e3, 3)} ms",
            f"synchronising calls per step: {measured(self.syncs / s, 3)}, CPU time waiting in them "
            f"{measured(self.sync_s / s * 1e3, 3)} ms",
            f"ATen operator calls per step: {measured(self.aten_ops / s, 3)}",
        ])

    def __repr__(self) -> str:
        return str(self)


def summarize_rows(averages: Iterable, steps: int, wall_s: float) -> StepProfile:
    """A StepProfile from a profile's key_averages() rows (anything with key, count, device_type,
    self_device_time_total and cpu_time_total, in microseconds). Device rows of user annotations
    (record_function's spans on the GPU, such as "Optimizer.step#SGD.step") are not kernels and are left out of
    the device time, as torch's own table leaves them out (profiler_util.py, `not evt.is_user_annotation`)."""
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an int >= 1, got {steps!r}")
    device = launch = sync = 0.0
    launches = syncs = aten = 0
    for row in averages:
        if getattr(row, "is_user_annotation", False):          # a span around kernels, already counted
            continue
        if getattr(row.device_type, "name", str(row.device_type)).endswith("CUDA"):
            device += row.self_device_time_total
        elif row.key.startswith(LAUNCH_PREFIXES):
            launches, launch = launches + row.count, launch + row.cpu_time_total
        elif SYNC_WORD in row.key and row.key.startswith("cu"):
            syncs, sync = syncs + row.count, sync + row.cpu_time_total
        elif row.key.startswith("aten::"):
            aten += row.count
    return StepProfile(steps, wall_s, device / 1e6, launches, launch / 1e6, syncs, sync / 1e6, aten)


def profile_steps(step: Callable[[], object], *, steps: int = 10, warmup: int = 2,
                  device: torch.device | str | None = None) -> StepProfile:
    """Run `step` `warmup` times, then `steps` times under torch.profiler; what the profile shows per step.

    `device` is where the step runs (default: CUDA where available, else the CPU). On CUDA the profile
    records CUDA activity too and waits for the GPU at the end; on the CPU it has no device rows at all.
    """
    if not callable(step):
        raise TypeError(f"profile_steps needs a callable, got {type(step).__name__}")
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an int >= 1, got {steps!r}")
    if not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be an int >= 0, got {warmup!r}")
    device = torch.device(device if device is not None else "cuda" if torch.cuda.is_available() else "cpu")
    cuda = device.type == "cuda"
    for _ in range(warmup):
        step()
    if cuda:
        torch.cuda.synchronize(device)
    prof = profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else []))
    with _quiet_native_stderr():
        prof.__enter__()
    try:
        start = time.perf_counter()
        for _ in range(steps):
            step()
        if cuda:
            torch.cuda.synchronize(device)
        wall = time.perf_counter() - start
    finally:
        with _quiet_native_stderr():
            prof.__exit__(None, None, None)
    return summarize_rows(prof.key_averages(), steps, wall)


def op_counts(fn: Callable[[], object], ops: Iterable[str], *, calls: int = 1) -> dict[str, float]:
    """How many times each named operator (e.g. "aten::item") runs per call of fn, counted by torch.profiler
    over `calls` calls (CPU activity only: these are operator calls, wherever their kernels run)."""
    if not callable(fn):
        raise TypeError(f"op_counts needs a callable, got {type(fn).__name__}")
    if not isinstance(calls, int) or calls < 1:
        raise ValueError(f"calls must be an int >= 1, got {calls!r}")
    names = list(ops)
    if not names or not all(isinstance(n, str) for n in names):
        raise ValueError(f"ops must name at least one operator, got {names!r}")
    prof = profile(activities=[ProfilerActivity.CPU])
    with _quiet_native_stderr():
        prof.__enter__()
    try:
        for _ in range(calls):
            fn()
    finally:
        with _quiet_native_stderr():
            prof.__exit__(None, None, None)
    counted = {e.key: e.count for e in prof.key_averages()}
    return {name: counted.get(name, 0) / calls for name in names}
