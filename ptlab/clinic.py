"""The troubleshooting clinic's tools: where a NaN first appears, and which learning rates train at all.

`first_nonfinite(model, X)` runs one forward pass with hooks and names the first module whose
output holds NaN or inf, or says the input itself does (a poisoned sample, not the model).
`lr_range_test(model, loader, ...)` trains a copy with an exponentially growing learning rate and
records the loss, to pick a range before a long run. Its limits: one short run on a few batches,
the suggestion is a starting point for a schedule's peak, not a tuned value.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Callable, Iterable

import torch
from torch import nn

from ptlab.claims import measured

from ._legacy import moved


@dataclass(frozen=True)
class NonFinite:
    """Where non-finite values first appeared in a forward pass (where == 'input' for the data)."""

    where: str
    module_type: str
    nan: int
    inf: int

    def __str__(self) -> str:
        if self.where == "input":
            return f"the input batch holds {self.nan} NaN and {self.inf} inf values: the data, not the model"
        return (f"first non-finite output: {self.where} ({self.module_type}), "
                f"{self.nan} NaN and {self.inf} inf values")


def _count(t: torch.Tensor) -> tuple[int, int]:
    return int(torch.isnan(t).sum()), int(torch.isinf(t).sum())


def first_nonfinite(model: nn.Module, X: torch.Tensor) -> NonFinite | None:
    """One forward pass under no_grad with hooks on every module; None when every output is finite."""
    if not isinstance(model, nn.Module) or not isinstance(X, torch.Tensor):
        raise TypeError("first_nonfinite(model, X) needs an nn.Module and an input tensor")
    if X.is_floating_point() and not torch.isfinite(X).all():
        return NonFinite("input", type(X).__name__, *_count(X))
    found: list[NonFinite] = []

    def hook(name: str):
        def check(module, inputs, output):
            outputs = output if isinstance(output, (tuple, list)) else (output,)
            for out in outputs:
                if not found and isinstance(out, torch.Tensor) and out.is_floating_point() \
                        and not torch.isfinite(out).all():
                    found.append(NonFinite(name, type(module).__name__, *_count(out)))
        return check

    leaves = [(n, m) for n, m in model.named_modules() if n and not any(True for _ in m.children())]
    handles = [m.register_forward_hook(hook(n)) for n, m in leaves]
    try:
        with torch.no_grad():
            model(X)
    finally:
        for h in handles:
            h.remove()
    return found[0] if found else None


@dataclass
class LRRangeResult:
    """Loss against learning rate from one growing-lr run, and the range it suggests."""

    lrs: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    smoothed: list[float] = field(default_factory=list)
    diverged_at: float | None = None

    @property
    def best_lr(self) -> float:
        """The learning rate with the lowest smoothed loss."""
        return self.lrs[min(range(len(self.smoothed)), key=self.smoothed.__getitem__)]

    @property
    def suggested(self) -> tuple[float, float]:
        """A range to try for a schedule's peak: a tenth of best_lr up to best_lr / 3 (a rule of thumb)."""
        return self.best_lr / 10, self.best_lr / 3

    def __str__(self) -> str:

        low, high = self.suggested
        end = (f"diverged at lr {measured(self.diverged_at, 2)}" if self.diverged_at
               else "did not diverge: extend end_lr to see where it does")
        return (f"lr range test over {len(self.lrs)} steps: lowest smoothed loss at lr {measured(self.best_lr, 2)}; "
                f"{end}; try a peak lr between {measured(low, 2)} and {measured(high, 2)}")

    def plot(self):
        """Smoothed loss against learning rate on a log axis, with the suggested range shaded."""
        from matplotlib.figure import Figure

        fig = Figure(figsize=(6, 3.4), layout="constrained")
        ax = fig.subplots()
        ax.plot(self.lrs, self.losses, alpha=0.3, label="loss")
        ax.plot(self.lrs, self.smoothed, label="smoothed")
        ax.axvspan(*self.suggested, alpha=0.15, color="green", label="suggested peak lr")
        ax.set_xscale("log")
        ax.set_xlabel("learning rate")
        ax.set_ylabel("training loss")
        ax.grid(alpha=0.3)
        ax.legend()
        return fig


def lr_range_test(model: nn.Module, loader: Iterable, make_optimizer: Callable[..., torch.optim.Optimizer], *,
                  start_lr: float = 1e-6, end_lr: float = 10.0, steps: int = 100, loss_fn: Callable | None = None,
                  smoothing: float = 0.9, stop_factor: float = 4.0) -> LRRangeResult:
    """Train a copy of model for `steps` batches, the lr growing from start_lr to end_lr; stop on divergence.

    make_optimizer(params) builds the optimizer (its lr is overridden each step). The model passed in is
    not changed. The run stops when the smoothed loss exceeds stop_factor times the best one.
    """
    if not 0 < start_lr < end_lr:
        raise ValueError(f"need 0 < start_lr < end_lr, got start_lr={start_lr} end_lr={end_lr}")
    if not isinstance(steps, int) or steps < 2:
        raise ValueError(f"steps must be an int >= 2, got {steps!r}")
    loss_fn = loss_fn or nn.functional.cross_entropy
    twin = copy.deepcopy(model).train()
    optimizer = make_optimizer(twin.parameters())
    growth = (end_lr / start_lr) ** (1 / (steps - 1))
    result, average, batches = LRRangeResult(), 0.0, iter(loader)
    for step in range(steps):
        try:
            X, y = next(batches)
        except StopIteration:
            batches = iter(loader)
            X, y = next(batches)
        lr = start_lr * growth ** step
        for group in optimizer.param_groups:
            group["lr"] = lr
        loss = loss_fn(twin(X), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        value = loss.item()
        average = smoothing * average + (1 - smoothing) * value
        smoothed = average / (1 - smoothing ** (step + 1))  # bias-corrected, as Adam does
        if not math.isfinite(smoothed) or (result.smoothed and smoothed > stop_factor * min(result.smoothed)):
            result.diverged_at = lr
            break
        result.lrs.append(lr)
        result.losses.append(value)
        result.smoothed.append(smoothed)
    if not result.lrs:
        raise RuntimeError("the loss was not finite even at start_lr: check the data and the model first "
                           "(first_nonfinite names where a NaN comes from)")
    return result


# ---------------------------------------------------------------- the troubleshooting table


# Names that moved to the chapter that teaches them, still importable from here (see ptlab._legacy).
__getattr__ = moved(__name__, {
    "ClinicRow": "ptlab.lessons.ch05_checkpoints_debugging.clinic_table",
    "CLINIC": "ptlab.lessons.ch05_checkpoints_debugging.clinic_table",
    "ClinicTable": "ptlab.lessons.ch05_checkpoints_debugging.clinic_table",
    "clinic_table": "ptlab.lessons.ch05_checkpoints_debugging.clinic_table",
})
