"""After training: predictions, a confusion matrix, misclassified images, and the overfit-one-batch ritual."""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import torch
from torch import nn

from .claims import measured
from .loop import check_loader, check_model, eval_mode, resolve_device, unpack_batch


def predict(model: nn.Module, loader: Iterable, device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Predicted labels and true labels (both (N,) int64, on the cpu) in eval mode under no_grad; modes restored."""
    check_model(model)
    check_loader(loader, "loader")
    device = resolve_device(model, device)
    predicted, targets = [], []
    with eval_mode(model), torch.no_grad():
        for batch in loader:
            X, y = unpack_batch(batch, device)
            logits = model(X)                                   # (B, num_classes)
            if logits.ndim != 2:
                raise ValueError(f"the model must return logits of shape (batch, num_classes), got {tuple(logits.shape)}")
            predicted.append(logits.argmax(dim=1).cpu())
            targets.append(y.cpu())
    if not predicted:
        raise ValueError("loader yielded no batches: check the dataset size, batch_size and drop_last")
    return torch.cat(predicted), torch.cat(targets)


def confusion_matrix(predicted: torch.Tensor, targets: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Counts (num_classes, num_classes): row = true class, column = predicted class."""
    if predicted.shape != targets.shape or predicted.ndim != 1:
        raise ValueError(f"predicted and targets must be 1-D and the same shape, got {tuple(predicted.shape)} "
                         f"and {tuple(targets.shape)}")
    if not isinstance(num_classes, int) or num_classes < 1:
        raise ValueError(f"num_classes must be a positive int, got {num_classes!r}")
    for name, t in (("predicted", predicted), ("targets", targets)):
        if t.numel() and (t.min() < 0 or t.max() >= num_classes):
            raise ValueError(f"{name} holds labels outside 0..{num_classes - 1}")
    flat = targets.long() * num_classes + predicted.long()
    return torch.bincount(flat, minlength=num_classes**2).reshape(num_classes, num_classes)


def per_class_accuracy(matrix: torch.Tensor) -> torch.Tensor:
    """Recall of each class from a confusion matrix: the diagonal over the row sums, (C,) float."""
    return matrix.diag().float() / matrix.sum(dim=1).clamp(min=1).float()


def plot_confusion_matrix(matrix: torch.Tensor, class_names: Sequence[str], title: str | None = None):
    """The confusion matrix as a heat map with counts, true classes down, predictions across; returns the Figure."""
    import matplotlib.pyplot as plt

    n = len(class_names)
    if tuple(matrix.shape) != (n, n):
        raise ValueError(f"matrix has shape {tuple(matrix.shape)} but there are {n} class names")
    fig, ax = plt.subplots(figsize=(6.4, 5.6), layout="constrained")
    plt.close(fig)  # shown once, by the notebook's display of the returned Figure
    image = ax.imshow(matrix.numpy(), cmap="Blues")
    ax.set_xticks(range(n), class_names, rotation=45, ha="right")
    ax.set_yticks(range(n), class_names)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    threshold = matrix.max().item() / 2
    for i in range(n):
        for j in range(n):
            value = int(matrix[i, j])
            ax.text(j, i, str(value), ha="center", va="center", fontsize=7,
                    color="white" if value > threshold else "black")
    fig.colorbar(image, ax=ax, shrink=0.8)
    if title:
        ax.set_title(title)
    return fig


def _as_display_image(image: Any) -> torch.Tensor:
    """A (C, H, W) uint8 or [0, 1] float tensor as an (H, W, C) float array in [0, 1]."""
    if not isinstance(image, torch.Tensor) or image.ndim != 3:
        raise TypeError(f"images must be (C, H, W) tensors, got {type(image).__name__}"
                        + (f" of shape {tuple(image.shape)}" if isinstance(image, torch.Tensor) else ""))
    image = image.float() / 255 if image.dtype == torch.uint8 else image.float().clamp(0, 1)
    return image.permute(1, 2, 0)


def plot_misclassified(images: Sequence[torch.Tensor], indices: Sequence[int], targets: torch.Tensor,
                       predicted: torch.Tensor, class_names: Sequence[str], columns: int = 8):
    """A grid of images[i] for i in indices, titled true -> predicted; images are (C, H, W) uint8 or [0, 1] float."""
    import matplotlib.pyplot as plt

    indices = list(indices)
    if not indices:
        raise ValueError("no indices to show")
    rows = math.ceil(len(indices) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(1.35 * columns, 1.6 * rows), squeeze=False, layout="constrained")
    plt.close(fig)
    for ax in axes.flat:
        ax.axis("off")
    for ax, i in zip(axes.flat, indices):
        ax.imshow(_as_display_image(images[i]).numpy())
        ax.set_title(f"{class_names[int(targets[i])]}\n-> {class_names[int(predicted[i])]}", fontsize=7)
    return fig


# ---------------------------------------------------------------- the debugging ritual
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

    @property
    def passed(self) -> bool:
        """True when the last loss is finite and at most target_loss."""
        return bool(self.losses) and math.isfinite(self.losses[-1]) and self.losses[-1] <= self.target_loss

    def __str__(self) -> str:
        first, last = (self.losses[0], self.losses[-1]) if self.losses else (float("nan"), float("nan"))
        # Losses are measured figures; so is the step count when the run stopped early (it depends on them).
        n = len(self.losses)
        count = str(n) if n == self.steps else measured(float(n))
        head = (f"overfit one batch: loss {measured(first)} -> {measured(last)} in {count} steps "
                f"({'reached' if self.passed else 'did not reach'} {self.target_loss:g})")
        notes = [f"note: {name}: {detail}" for name, detail in self.notes.items()]
        if self.passed:
            return "\n".join([head, *notes])
        lines = [head, "likely causes:"] + [f"  {name}: {detail}" for name, detail in self.causes.items()]
        return "\n".join(lines + notes)


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


def _input_label_conflicts(X: torch.Tensor, y: torch.Tensor) -> int:
    """How many distinct inputs in the batch appear with more than one label."""
    if y.dtype not in (torch.int64, torch.int32) or y.ndim != 1:
        return 0
    flat = X.reshape(len(X), -1)
    _, groups = torch.unique(flat, dim=0, return_inverse=True)
    return sum(int(y[groups == g].unique().numel() > 1) for g in groups.unique())


def _diagnose(model: nn.Module, X: torch.Tensor, y: torch.Tensor, loss_fn: Callable, losses: list[float],
              lr: float) -> dict[str, str]:
    """Likely causes of a failed overfit, each backed by something measured."""
    causes: dict[str, str] = {}
    frozen = [n for n, p in model.named_parameters() if not p.requires_grad]
    if frozen:
        causes["frozen parameters"] = (f"{len(frozen)} of {len(list(model.parameters()))} parameter tensors have "
                                       f"requires_grad=False: {', '.join(frozen[:4])}{' ...' if len(frozen) > 4 else ''}")
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    no_grad = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    if trainable and no_grad:
        from .diagnose import diagnose_gradients

        found = diagnose_gradients(model, batch=(X, y), loss_fn=loss_fn).causes
        named = ", ".join(f"{n} ({found.get(n, 'no gradient')})" for n in no_grad[:4])
        causes["detached graph"] = (f"{len(no_grad)} of {len(trainable)} trainable tensors never got a gradient: "
                                    f"{named}{' ...' if len(no_grad) > 4 else ''}")
    conflicts = _input_label_conflicts(X, y)
    if conflicts:
        causes["labels do not match inputs"] = (f"{conflicts} identical input(s) in the batch carry different "
                                                f"labels: no model can fit that (inputs overwritten or broadcast?)")
    finite = [v for v in losses if math.isfinite(v)]
    if len(finite) < len(losses):
        causes["learning rate too high"] = f"the loss became non-finite at step {measured(float(len(finite) + 1))} (lr={lr:g})"
    elif finite and finite[-1] > finite[0]:
        causes["learning rate too high"] = f"the loss rose from {measured(finite[0])} to {measured(finite[-1])} (lr={lr:g})"
    elif finite and min(finite) < 0.5 * finite[-1]:
        causes["learning rate too high"] = (f"the loss went down to {measured(min(finite))}, then back up to "
                                            f"{measured(finite[-1])} (lr={lr:g})")
    elif finite and not (no_grad or frozen or conflicts) and finite[-1] > 0.5 * finite[0]:
        causes["learning rate too low"] = f"the loss only fell from {measured(finite[0])} to {measured(finite[-1])} (lr={lr:g})"
    if not causes:
        causes["too few steps or too small a model"] = "the loss falls steadily: raise steps, or check capacity"
    return causes


def overfit_one_batch(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor], loss_fn: Callable | None = None,
                      steps: int = 100, lr: float = 1e-2, target_loss: float = 0.05,
                      raise_on_failure: bool = True, device: torch.device | str | None = None) -> OverfitReport:
    """Train a copy of model with Adam on one fixed batch until the loss <= target_loss; raise OverfitFailed with causes if not.

    The batch is checked first: non-finite inputs or labels outside the model's outputs are a
    ValueError (no model can fit them); a batch of one class passes too easily, which the report notes.
    The model you pass is left unchanged (a deep copy is trained).
    """
    check_model(model)
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive int, got {steps!r}")
    if not (isinstance(lr, (int, float)) and lr > 0):
        raise ValueError(f"lr must be a positive number, got {lr!r}")
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
        for _ in range(steps):
            loss = loss_fn(copy_(X), y)
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
