"""The troubleshooting clinic's tools: where a NaN first appears, and which learning rates train at all.

`first_nonfinite(model, X)` runs one forward pass with hooks on every module and names where NaN or
inf first appears: the input itself (a poisoned sample, not the model), a module's output, or a
module's own forward code (a `torch.log` or `torch.exp` between or after its submodules, seen as a
non-finite input to a submodule or output that no submodule produced). It leaves the model's buffers
(BatchNorm statistics) and torch's random generators as they were. An inf made on purpose and passed
to a submodule (a -inf attention mask) is reported too.
`lr_range_test(model, loader, ...)` trains a copy with an exponentially growing learning rate and
records the loss, to pick a range before a long run. Its limits: one short run on a few batches,
the suggestion is a starting point for a schedule's peak, not a tuned value.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch
from torch import nn
from torch.nn.parameter import is_lazy

from ptlab.claims import measured

from .core import kept_random_state
from .loop import model_device, to_device
from .plots import notebook_figure


@dataclass(frozen=True)
class NonFinite:
    """Where non-finite values first appeared in a forward pass (where: 'input' for the data, '' for the model)."""

    where: str
    module_type: str
    nan: int
    inf: int
    # Set when where's own forward code made them, not a submodule's: (the submodule that returned last
    # before, the submodule they were passed to); None at either end means the start, or where's output.
    between: tuple[str | None, str | None] | None = None

    def __str__(self) -> str:
        if self.where == "input":
            return f"the input batch holds {self.nan} NaN and {self.inf} inf values: the data, not the model"
        counts = f"{self.nan} NaN and {self.inf} inf values"
        name = f"{self.where} ({self.module_type})" if self.where else f"the model ({self.module_type})"
        if self.between is None:
            return f"first non-finite output: {name}, {counts}"
        last, passed_to = self.between
        span = (f" between {last} and {passed_to}" if last and passed_to else f" before {passed_to}" if passed_to
                else f" after {last}" if last else "")
        what = (f"{passed_to} received {counts} that no submodule produced" if passed_to
                else f"its output holds {counts} that none of its submodules produced")
        return f"made inside the forward of {'module ' * bool(self.where)}{name}{span}: {what}"


def _count(value: Any) -> tuple[int, int]:
    """NaN and inf counts over the floating-point tensors in value (a tensor, or tuples, lists, dicts of them)."""
    if isinstance(value, torch.Tensor):
        return (int(torch.isnan(value).sum()), int(torch.isinf(value).sum())) if value.is_floating_point() else (0, 0)
    parts = value.values() if isinstance(value, dict) else value if isinstance(value, (tuple, list)) else ()
    counts = [_count(v) for v in parts]
    return sum(c[0] for c in counts), sum(c[1] for c in counts)


def first_nonfinite(model: nn.Module, X: torch.Tensor) -> NonFinite | None:
    """One forward pass under no_grad with hooks on every module; None when nothing non-finite appeared.

    X is moved to the device of the model's parameters (a model without any takes X where it is).
    """
    if not isinstance(model, nn.Module) or not isinstance(X, torch.Tensor):
        raise TypeError("first_nonfinite(model, X) needs an nn.Module and an input tensor")
    if X.is_floating_point() and not torch.isfinite(X).all():
        return NonFinite("input", type(X).__name__, *_count(X))
    device = model_device(model)
    X = to_device(X, device) if device is not None else X
    found: list[NonFinite] = []
    running: list[list] = []  # [name, module, the submodule that returned last] per forward running, outermost first

    def entering(name: str):
        def check(module, inputs):
            counts = _count(inputs) if not found and running else (0, 0)
            if any(counts):  # no submodule's output was non-finite: the calling forward's own code made it
                caller, caller_module, last = running[-1]
                found.append(NonFinite(caller, type(caller_module).__name__, *counts, between=(last, name)))
            running.append([name, module, None])
        return check

    def leaving(name: str):
        def check(module, inputs, output):
            last = running.pop()[2]
            counts = _count(output) if not found else (0, 0)
            if any(counts):  # made by this module: a leaf, or the forward code of one with submodules
                has_children = next(module.children(), None) is not None
                found.append(NonFinite(name, type(module).__name__, *counts,
                                       between=(last, None) if has_children else None))
            if running:
                running[-1][2] = name
        return check

    modules = list(model.named_modules())
    handles = [m.register_forward_pre_hook(entering(n)) for n, m in modules]
    handles += [m.register_forward_hook(leaving(n)) for n, m in modules]
    buffers = [(b, b.clone()) for b in model.buffers() if not is_lazy(b)]  # a train-mode pass updates BatchNorm's
    try:
        with torch.no_grad(), kept_random_state(t.device for t in [X, *model.parameters()]):
            model(X)
    finally:
        for h in handles:
            h.remove()
        with torch.no_grad():
            for buffer, saved in buffers:
                buffer.copy_(saved)
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
        # Where the loss takes off depends on float rounding, so the number of steps before it is measured.
        steps = measured(float(len(self.lrs))) if self.diverged_at else str(len(self.lrs))
        return (f"lr range test over {steps} steps: lowest smoothed loss at lr {measured(self.best_lr, 2)}; "
                f"{end}; try a peak lr between {measured(low, 2)} and {measured(high, 2)}")

    def plot(self):
        """Smoothed loss against learning rate on a log axis, with the suggested range shaded."""
        fig = notebook_figure(figsize=(6, 3.4), layout="constrained")
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


def _loader_generators(loader: Iterable) -> list[torch.Generator]:
    """The generators a DataLoader draws its order and worker seeds from: its own, its samplers'."""
    batch_sampler = getattr(loader, "batch_sampler", None)
    holders = (loader, getattr(loader, "sampler", None), getattr(batch_sampler, "sampler", None))
    found = (getattr(holder, "generator", None) for holder in holders)
    return list({id(g): g for g in found if isinstance(g, torch.Generator)}.values())


def _to(batch: Any, device: torch.device | None) -> Any:
    """A tensor moved to device (None: left where it is); anything else as it is."""
    return to_device(batch, device) if isinstance(batch, torch.Tensor) and device is not None else batch


def lr_range_test(model: nn.Module, loader: Iterable, make_optimizer: Callable[..., torch.optim.Optimizer], *,
                  start_lr: float = 1e-6, end_lr: float = 10.0, steps: int = 100, loss_fn: Callable | None = None,
                  smoothing: float = 0.9, stop_factor: float = 4.0) -> LRRangeResult:
    """Train a copy of model for `steps` batches, the lr growing from start_lr to end_lr; stop on divergence.

    make_optimizer(params) builds the optimizer (its lr is overridden each step). Each batch is moved to
    the device of the model's parameters. The model passed in is not changed, nor are torch's global
    random generators or the loader's (its own, its sampler's): they are restored afterwards.
    The run stops when the smoothed loss exceeds stop_factor times the best one.
    """
    if not 0 < start_lr < end_lr:
        raise ValueError(f"need 0 < start_lr < end_lr, got start_lr={start_lr} end_lr={end_lr}")
    if not isinstance(steps, int) or steps < 2:
        raise ValueError(f"steps must be an int >= 2, got {steps!r}")
    loss_fn = loss_fn or nn.functional.cross_entropy
    twin = copy.deepcopy(model).train()
    optimizer = make_optimizer(twin.parameters())
    device = model_device(twin)
    growth = (end_lr / start_lr) ** (1 / (steps - 1))
    result, average = LRRangeResult(), 0.0
    with kept_random_state((p.device for p in twin.parameters()), _loader_generators(loader)):
        batches = iter(loader)
        for step in range(steps):
            try:
                X, y = next(batches)
            except StopIteration:
                batches = iter(loader)
                X, y = next(batches)
            X, y = _to(X, device), _to(y, device)
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

