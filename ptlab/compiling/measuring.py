"""Compile against eager, measured side by side: compile time, speed-up, break-even, and training drift."""
from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass
from typing import Callable, Iterable

import torch
import torch.nn.functional as F
from torch import nn

from ..claims import measured, measured_seconds
from ..timing import compare
from .logs import quiet_compile_logs


@dataclass(frozen=True)
class CompileReport:
    """One model's compile cost and pay-off: first compiled call, then medians of eager and compiled calls."""

    name: str
    compile_seconds: float     # the first compiled call: tracing, code generation and the C++ build (or loading
                               # them from Inductor's cache), then one run
    eager_seconds: float       # median eager call after warm-up
    compiled_seconds: float    # median compiled call after warm-up

    @property
    def speedup(self) -> float:
        """eager / compiled time per call: above 1, compiling made each call faster."""
        return self.eager_seconds / self.compiled_seconds

    @property
    def break_even_calls(self) -> float:
        """Calls after which the compile time is paid back (inf when compiled calls are not faster)."""
        saved = self.eager_seconds - self.compiled_seconds
        return math.inf if saved <= 0 else math.ceil(self.compile_seconds / saved)


def inference_call(model: nn.Module, x: torch.Tensor) -> Callable[[], torch.Tensor]:
    """A no-argument callable: the model's forward on x without autograd."""
    def call() -> torch.Tensor:
        with torch.no_grad():
            return model(x)
    return call


def training_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, lr: float = 0.01) -> Callable[[], float]:
    """A no-argument callable: one SGD step of cross-entropy on (x, y); returns the loss."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)

    def step() -> float:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        return loss.item()
    return step


def measure_compile(name: str, eager: Callable[[], object], compiled: Callable[[], object], *,
                    repeats: int = 7, warmup: int = 2) -> CompileReport:
    """Time the first compiled call, then eager against compiled side by side (interleaved)."""
    if not (callable(eager) and callable(compiled)):
        raise TypeError("measure_compile needs two callables: the eager call and the compiled one")
    with quiet_compile_logs():
        start = time.perf_counter()
        compiled()
        first = time.perf_counter() - start
        comparison = compare(eager, compiled, warmup=warmup, repeats=repeats, names=("eager", "compiled"))
    return CompileReport(name, first, comparison.a.median, comparison.b.median)


def format_compile_table(reports: Iterable[CompileReport]) -> str:
    """A left-aligned table: compile time, eager and compiled per call, speed-up, break-even calls.

    A break-even of ≈inf means the compiled calls were not faster in this run: the compile never pays back.
    """
    head = f"{'model':<22}{'compile':<12}{'eager/call':<12}{'compiled/call':<15}{'speed-up':<10}break-even calls"
    lines = [head]
    for r in reports:
        lines.append(f"{r.name:<22}{measured_seconds(r.compile_seconds):<12}{measured_seconds(r.eager_seconds):<12}"
                     f"{measured_seconds(r.compiled_seconds):<15}{measured(r.speedup, 3):<10}"
                     f"{measured(float(r.break_even_calls), 3)}")
    return "\n".join(lines)


@dataclass(frozen=True)
class TrainingDrift:
    """How far a compiled copy of a model drifted from the eager one over the same SGD steps."""

    max_abs_diff: float                  # largest |compiled weight - eager weight| over every parameter
    max_abs_weight: float                # largest |eager weight|: the scale of the weights
    max_abs_update: float                # largest |eager weight after - before|: how far training moved them
    eager_losses: tuple[float, ...]
    compiled_losses: tuple[float, ...]

    @property
    def relative_diff(self) -> float:
        """max_abs_diff / max_abs_weight."""
        return self.max_abs_diff / self.max_abs_weight


def compiled_training_drift(model: nn.Module, batches: Iterable[tuple[torch.Tensor, torch.Tensor]], *,
                            lr: float = 0.01, seed: int = 0, **compile_kwargs: object) -> TrainingDrift:
    """Train two copies of model with SGD and cross-entropy on the same batches, one eager, one torch.compile'd.

    Both start from model's weights (model itself is left as it is) and from the same random state (`seed`, the
    caller's state restored after). Random ops such as Dropout still differ: Inductor draws its own random numbers
    unless torch._inductor.config.fallback_random is True. compile_kwargs go to torch.compile.
    """
    batches = list(batches)
    if not batches:
        raise ValueError("compiled_training_drift needs at least one (x, y) batch")
    eager, compiled = copy.deepcopy(model), copy.deepcopy(model)
    losses = []
    with quiet_compile_logs():
        for copy_, call in ((eager, eager), (compiled, torch.compile(compiled, **compile_kwargs))):
            optimizer = torch.optim.SGD(copy_.parameters(), lr=lr)
            losses.append([])
            with torch.random.fork_rng():
                torch.manual_seed(seed)                   # both copies start from the same random state
                for x, y in batches:
                    optimizer.zero_grad()
                    loss = F.cross_entropy(call(x), y)
                    loss.backward()
                    optimizer.step()
                    losses[-1].append(loss.item())
    return TrainingDrift(_largest_diff(eager, compiled), max(w.abs().max().item() for w in eager.parameters()),
                         _largest_diff(eager, model), tuple(losses[0]), tuple(losses[1]))


def _largest_diff(a: nn.Module, b: nn.Module) -> float:
    with torch.no_grad():
        return max((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters()))
