"""The overfit-one-batch ritual: a model that cannot memorise one batch has a bug, and which one."""
from __future__ import annotations

import copy
import math
import re
import textwrap
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn

from ptlab.diagnose import diagnose_gradients

from .claims import measured
from .loop import check_model, eval_mode, resolve_device, unpack_batch


class OverfitFailed(AssertionError):
    """overfit_one_batch could not drive the loss down; the message lists the likely causes it found."""

    def __init__(self, report: "OverfitReport") -> None:
        self.report = report
        super().__init__(str(report))


@dataclass
class OverfitReport:
    """What overfit_one_batch measured: the loss per step, and the likely causes when it failed."""

    losses: list[float]
    target_loss: float
    causes: dict[str, str] = field(default_factory=dict)
    steps: int | None = None  # the step budget it was given
    notes: dict[str, str] = field(default_factory=dict)  # what makes a pass weak evidence (one class)
    loss_floor: float = 0.0  # the lowest loss the loss function allows; target_loss = loss_floor + the margin
    floor_reason: str = ""   # where the floor comes from ("" when it is 0)

    @property
    def passed(self) -> bool:
        """True when the last loss is finite and at most target_loss."""
        return bool(self.losses) and math.isfinite(self.losses[-1]) and self.losses[-1] <= self.target_loss

    def __str__(self) -> str:
        first, last = (self.losses[0], self.losses[-1]) if self.losses else (float("nan"), float("nan"))
        # Losses are measured figures; so is the step count when the run stopped early (it depends on them).
        n = len(self.losses)
        count = str(n) if n == self.steps else measured(float(n))
        target = f"{self.target_loss:g}"
        if self.loss_floor:
            margin = self.target_loss - self.loss_floor
            target = (f"{measured(self.target_loss)} = the loss floor {measured(self.loss_floor)} + {margin:.3g}; "
                      f"floor: {self.floor_reason}")
        head = (f"overfit one batch: loss {measured(first)} -> {measured(last)} in {count} steps "
                f"({'reached' if self.passed else 'did not reach'} {target})")
        notes = [f"note: {name}: {detail}" for name, detail in self.notes.items()]
        if self.passed:
            return "\n".join([head, *notes])
        lines = [head, "likely causes:"] + [_wrap(f"{name}: {detail}") for name, detail in self.causes.items()]
        return "\n".join(lines + notes)


def _wrap(text: str, width: int = 110) -> str:
    """A cause as lines of about `width` characters, indented; breaks fall where they would with any digits in the
    measured figures (each counts as 10 characters), so the masked text is the same on every machine."""
    figures = re.findall(r"\u2248\S+", text)
    stand_ins = iter(figures)
    fixed = re.sub(r"\u2248\S+", lambda m: "\x00" * 10, text)
    wrapped = textwrap.fill(fixed, width=width, initial_indent="  ", subsequent_indent="    ",
                            break_long_words=False, break_on_hyphens=False)
    return re.sub("\x00{10}", lambda m: next(stand_ins), wrapped)


def label_smoothing_floor(num_classes: int, smoothing: float) -> float:
    """The lowest CrossEntropyLoss(label_smoothing=smoothing) over num_classes classes, for class-index targets
    and no class weights."""
    if not (isinstance(num_classes, int) and num_classes >= 2):
        raise ValueError(f"num_classes must be an int >= 2, got {num_classes!r}")
    if not (isinstance(smoothing, (int, float)) and 0 <= smoothing <= 1):
        raise ValueError(f"smoothing must be a number in [0, 1], got {smoothing!r}")
    # The smoothed target puts 1 - s + s/K on the true class and s/K on each other one; the loss is the
    # cross-entropy against it, lowest when the prediction equals it, where it is that target's entropy.
    true_p, other_p = 1 - smoothing + smoothing / num_classes, smoothing / num_classes
    floor = -true_p * math.log(true_p) if true_p > 0 else 0.0
    if other_p > 0:
        floor -= (num_classes - 1) * other_p * math.log(other_p)
    return floor


def _smoothing_floor(loss_fn: Callable, logits: torch.Tensor, y: torch.Tensor) -> tuple[float, str]:
    """The floor of an nn.CrossEntropyLoss with label_smoothing > 0 on (B, K) logits, and why; (0.0, "") otherwise.

    Each sample's loss is a weighted cross-entropy sum_k c_k * -log p_k, lowest at p proportional to c; the
    floor is the loss function itself evaluated at logits log(c), so reduction, class weights and
    ignore_index are handled by the loss function as it is.
    """
    smoothing = getattr(loss_fn, "label_smoothing", 0.0)
    if not isinstance(loss_fn, nn.CrossEntropyLoss) or smoothing <= 0 or logits.ndim != 2:
        return 0.0, ""
    k = logits.shape[1]
    weight = loss_fn.weight if loss_fn.weight is not None else torch.ones(k, device=logits.device)
    if (weight <= 0).any():
        return 0.0, ""
    if y.is_floating_point():                                  # class probabilities, (B, K)
        c = weight * ((1 - smoothing) * y + smoothing / k)
    else:                                                      # class indices, (B,)
        index = torch.where(y == loss_fn.ignore_index, torch.zeros_like(y), y)
        c = smoothing * weight / k + (1 - smoothing) * weight[index, None] * nn.functional.one_hot(index, k)
    with torch.no_grad():
        floor = float(loss_fn(c.clamp_min(1e-30).log().to(logits.dtype), y))
    return floor, f"label_smoothing={smoothing:g} over {k} classes"


def _check_batch(model: nn.Module, X: torch.Tensor, y: torch.Tensor) -> dict[str, str]:
    """Refuse a batch no model can fit (ValueError naming the problem); return notes on a weak one."""
    problems = []
    if X.is_floating_point() and not torch.isfinite(X).all():
        bad = int((~torch.isfinite(X)).sum())
        problems.append(f"the inputs hold {bad} non-finite value(s) (NaN or inf): every loss will be NaN")
    classification = y.ndim == 1 and not y.is_floating_point() and y.dtype != torch.bool
    if classification and len(y):
        with eval_mode(model), torch.no_grad():  # eval: BatchNorm accepts one sample, statistics stay put
            width = model(X[:1]).shape[-1]          # (1, num_classes)
        low, high = int(y.min()), int(y.max())
        if low < 0 or high >= width:
            problems.append(f"labels run from {low} to {high} but the model has {width} outputs: "
                            f"valid labels are 0..{width - 1}")
    if problems:
        raise ValueError("overfit_one_batch: the batch itself is broken, so no model can fit it:\n  "
                         + "\n  ".join(problems))
    if classification and len(y) > 1 and int(y.unique().numel()) == 1:
        return {"one class": f"every label in the batch is {int(y[0])}: a constant output fits it, "
                             f"so reaching the target proves little; use a batch with several classes"}
    return {}


def _input_label_conflicts(X: torch.Tensor, y: torch.Tensor) -> tuple[int, int]:
    """How many distinct inputs in the batch appear with more than one label, and how many examples hold them."""
    if y.dtype not in (torch.int64, torch.int32) or y.ndim != 1:
        return 0, 0
    flat = X.reshape(len(X), -1)
    _, groups = torch.unique(flat, dim=0, return_inverse=True)
    clashing = [g for g in groups.unique() if y[groups == g].unique().numel() > 1]
    return len(clashing), sum(int((groups == g).sum()) for g in clashing)


def _diagnose(model: nn.Module, X: torch.Tensor, y: torch.Tensor, loss_fn: Callable, losses: list[float],
              lr: float) -> dict[str, str]:
    """Likely causes of a failed overfit, each backed by something measured."""
    causes: dict[str, str] = {}
    frozen = [n for n, p in model.named_parameters() if not p.requires_grad]
    if frozen:
        causes["frozen parameters"] = (f"{len(frozen)} of {len(list(model.parameters()))} parameter tensors have "
                                       f"requires_grad=False: {', '.join(frozen[:4])}"
                                       f"{' ...' if len(frozen) > 4 else ''}")
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    no_grad = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    if trainable and no_grad:
        found = diagnose_gradients(model, batch=(X, y), loss_fn=loss_fn).causes
        named = ", ".join(f"{n} ({found.get(n, 'no gradient')})" for n in no_grad[:4])
        causes["detached graph"] = (f"{len(no_grad)} of {len(trainable)} trainable tensors never got a gradient: "
                                    f"{named}{' ...' if len(no_grad) > 4 else ''}")
    conflicts, examples = _input_label_conflicts(X, y)
    if conflicts:
        inputs = "one input" if conflicts == 1 else f"{conflicts} inputs"
        causes["labels do not match inputs"] = (f"{examples} of the batch's {len(X)} examples are copies of {inputs} "
                                                "with different labels: no model can fit that (inputs overwritten "
                                                "or broadcast?)")
    finite = [v for v in losses if math.isfinite(v)]
    if len(finite) < len(losses):
        causes["learning rate too high"] = (f"the loss became non-finite at step {measured(float(len(finite) + 1))} "
                                            f"(lr={lr:g})")
    elif finite and finite[-1] > finite[0]:
        causes["learning rate too high"] = (f"the loss rose from {measured(finite[0])} to {measured(finite[-1])} "
                                            f"(lr={lr:g})")
    elif finite and min(finite) < 0.5 * finite[-1]:
        causes["learning rate too high"] = (f"the loss went down to {measured(min(finite))}, then back up to "
                                            f"{measured(finite[-1])} (lr={lr:g})")
    elif finite and not (no_grad or frozen or conflicts) and finite[-1] > 0.5 * finite[0]:
        causes["learning rate too low"] = (f"the loss only fell from {measured(finite[0])} to {measured(finite[-1])} "
                                           f"(lr={lr:g})")
    if not causes:
        causes["too few steps or too small a model"] = "the loss falls steadily: raise steps, or check capacity"
    return causes


def overfit_one_batch(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor], loss_fn: Callable | None = None,
                      steps: int = 100, lr: float = 1e-2, target_loss: float = 0.05,
                      raise_on_failure: bool = True, device: torch.device | str | None = None,
                      loss_floor: float | None = None) -> OverfitReport:
    """Train a copy of model with Adam on one fixed batch until the loss <= loss floor + target_loss; raise
    OverfitFailed with causes if not.

    The batch is checked first: non-finite inputs or labels outside the model's outputs are a
    ValueError (no model can fit them); a batch of one class passes too easily, which the report notes.
    The model you pass is left unchanged (a deep copy is trained). The loss floor is the lowest loss
    the loss function allows: 0 unless given as `loss_floor`, or worked out for an nn.CrossEntropyLoss
    with label_smoothing > 0 on (B, K) logits (other logit shapes, and a hand-written or functional loss with
    smoothing, need `loss_floor`).
    """
    check_model(model)
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive int, got {steps!r}")
    if not (isinstance(lr, (int, float)) and lr > 0):
        raise ValueError(f"lr must be a positive number, got {lr!r}")
    if loss_floor is not None and not (isinstance(loss_floor, (int, float)) and math.isfinite(loss_floor)):
        raise ValueError(f"loss_floor must be a finite number or None, got {loss_floor!r}")
    device = resolve_device(model, device)
    X, y = unpack_batch(batch, device)
    loss_fn = loss_fn if loss_fn is not None else nn.CrossEntropyLoss()
    copy_ = copy.deepcopy(model).train()
    notes = _check_batch(copy_, X, y)
    params = [p for p in copy_.parameters() if p.requires_grad]
    losses: list[float] = []
    report = OverfitReport(losses, target_loss, steps=steps, notes=notes)
    if params:
        optimizer = torch.optim.Adam(params, lr=lr)
        for step in range(steps):
            logits = copy_(X)
            if step == 0:
                report.loss_floor, report.floor_reason = ((float(loss_floor), "given as loss_floor")
                                                          if loss_floor is not None else
                                                          _smoothing_floor(loss_fn, logits.detach(), y))
                report.target_loss = report.loss_floor + target_loss
            loss = loss_fn(logits, y)
            losses.append(loss.item())
            if report.passed or not math.isfinite(losses[-1]):
                break
            optimizer.zero_grad()
            if loss.requires_grad:
                loss.backward()
            optimizer.step()
    if not report.passed:
        report.causes = _diagnose(copy_, X, y, loss_fn, losses, lr)
        if not params:
            report.causes = {"frozen parameters": "no parameter requires a gradient: nothing can train",
                             **{k: v for k, v in report.causes.items() if k != "frozen parameters"}}
        if raise_on_failure:
            raise OverfitFailed(report)
    return report
