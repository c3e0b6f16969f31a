"""After training: predictions, a confusion matrix, per-class accuracy and the misclassified images."""
from __future__ import annotations

import math
from typing import Any, Iterable, Sequence

import torch
from torch import nn

from .loop import check_model, eval_mode, require_batches, resolve_device, unpack_batch


def predict(model: nn.Module, loader: Iterable,
            device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Predicted labels and true labels (both (N,) int64, on the cpu) in eval mode under no_grad; modes restored."""
    check_model(model)
    require_batches(loader, "loader")
    device = resolve_device(model, device)
    predicted, targets = [], []
    with eval_mode(model), torch.no_grad():
        for batch in loader:
            X, y = unpack_batch(batch, device)
            logits = model(X)                                   # (B, num_classes)
            if logits.ndim != 2:
                raise ValueError(f"the model must return logits of shape (batch, num_classes), "
                                 f"got {tuple(logits.shape)}")
            predicted.append(logits.argmax(dim=1).cpu())
            targets.append(y.cpu())
    if not predicted:
        raise ValueError("loader yielded no batches: check the dataset size, batch_size and drop_last")
    return torch.cat(predicted), torch.cat(targets)


def confusion_matrix(predicted: torch.Tensor, targets: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Counts (num_classes, num_classes), on the cpu: row = true class, column = predicted class.

    predicted and targets may be on any device, each on its own: both are counted on the cpu.
    """
    if predicted.shape != targets.shape or predicted.ndim != 1:
        raise ValueError(f"predicted and targets must be 1-D and the same shape, got {tuple(predicted.shape)} "
                         f"and {tuple(targets.shape)}")
    if not isinstance(num_classes, int) or num_classes < 1:
        raise ValueError(f"num_classes must be a positive int, got {num_classes!r}")
    predicted, targets = predicted.cpu(), targets.cpu()
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
    image = ax.imshow(matrix.cpu().numpy(), cmap="Blues")
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
    image = image.cpu()
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
