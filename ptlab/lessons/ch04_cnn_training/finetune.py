"""Fine-tuning offline: a few labelled images of classes a pretrained backbone never saw, and a guard on downloads.

The backbone is `ptlab.reference.pretrained_backbone()`, trained on PRETRAIN_CLASSES only; the new task is
FINETUNE_CLASSES with a handful of labelled training images per class (`few_shot_batches`), scored on all of
their test images (`new_class_accuracy`). `no_downloads()` blocks the two functions torch.hub and torchvision
fetch weights through, so a cell can show that torchvision's weight enums describe weights without downloading them.
`batch_stepper` takes AdamW steps of any model on one fixed batch, so a cell can time a step and watch the loss fall.
"""
from __future__ import annotations

import contextlib
import urllib.request
from typing import Callable, Iterator

import torch
from torch import nn

from ptlab.data import uint8_split
from ptlab.reference import FINETUNE_CLASSES, PRETRAIN_CLASSES, accuracy_on, batch_stream, class_indices, relabel


class DownloadBlocked(RuntimeError):
    """Raised inside no_downloads() when code tries to open a URL."""


@contextlib.contextmanager
def no_downloads() -> Iterator[list[str]]:
    """Inside the block, torch.hub.urlopen and urllib.request.urlopen raise DownloadBlocked and record the URL.

    That is the path torch.hub and torchvision download weights through. It is not a network sandbox: a urlopen
    imported before the block, or http.client, socket and other libraries, are not blocked or recorded.
    Yields the list of URLs that something tried to open, so a cell can check it stayed empty.
    """
    import torch.hub

    attempts: list[str] = []

    def refuse(url, *args, **kwargs):
        attempts.append(url if isinstance(url, str) else getattr(url, "full_url", repr(url)))
        raise DownloadBlocked(f"a download was attempted inside no_downloads(): {attempts[-1]}")

    saved = (torch.hub.urlopen, urllib.request.urlopen)
    torch.hub.urlopen = urllib.request.urlopen = refuse
    try:
        yield attempts
    finally:
        torch.hub.urlopen, urllib.request.urlopen = saved


def few_shot_indices(per_class: int, seed: int = 0) -> torch.Tensor:
    """Train-split indices of `per_class` random images of each of FINETUNE_CLASSES (a seeded draw)."""
    if not isinstance(per_class, int) or isinstance(per_class, bool) or not 1 <= per_class <= 800:
        raise ValueError(f"per_class must be an int between 1 and 800, got {per_class!r}")
    g = torch.Generator().manual_seed(seed)
    picks = []
    for name in FINETUNE_CLASSES:
        members = class_indices([name])
        picks.append(members[torch.randperm(len(members), generator=g)[:per_class]])
    return torch.cat(picks)


def few_shot_batches(per_class: int, batch_size: int = 32,
                     seed: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Endless augmented batches (X (B, 3, 32, 32), y (B,) in 0..3) of the few labelled FINETUNE_CLASSES images."""
    for X, y in batch_stream(seed=seed, augment=True, indices=few_shot_indices(per_class, seed), batch_size=batch_size):
        yield X, relabel(y, FINETUNE_CLASSES)


def new_class_accuracy(model: nn.Module) -> float:
    """Accuracy on every test image of FINETUNE_CLASSES (800), labels 0..3, in eval mode (modes restored)."""
    images, labels = uint8_split(False)
    idx = class_indices(FINETUNE_CLASSES, train=False)
    return accuracy_on(model, images[idx], relabel(labels[idx], FINETUNE_CLASSES))


def pretrained_class_accuracy(model: nn.Module) -> float:
    """Accuracy on every test image of PRETRAIN_CLASSES (1,200), labels 0..5: what the backbone was trained for."""
    images, labels = uint8_split(False)
    idx = class_indices(PRETRAIN_CLASSES, train=False)
    return accuracy_on(model, images[idx], relabel(labels[idx], PRETRAIN_CLASSES))


def running_stats(model: nn.Module) -> list[torch.Tensor]:
    """Copies of every BatchNorm running_mean and running_var in model (to compare before and after)."""
    return [b.detach().clone() for name, b in model.named_buffers() if name.endswith(("running_mean", "running_var"))]


def largest_change(before: list[torch.Tensor], after: list[torch.Tensor]) -> float:
    """The largest absolute elementwise difference between two lists of same-shaped tensors."""
    if len(before) != len(after):
        raise ValueError(f"before and after must hold the same tensors, got {len(before)} and {len(after)}")
    return max(((a - b).abs().max().item() for a, b in zip(after, before)), default=0.0)


def batch_stepper(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor],
                  lr: float = 1e-3) -> tuple[Callable[[], None], list[float]]:
    """A callable that takes one AdamW step of model (train mode) on one fixed batch, and the list of losses it
    appends to."""
    X, y = batch
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    losses: list[float] = []

    def step() -> None:
        model.train()
        loss = nn.functional.cross_entropy(model(X), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())

    return step, losses
