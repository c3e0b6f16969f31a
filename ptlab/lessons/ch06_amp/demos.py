"""Chapter 6's demonstrations: GradScaler's scale over steps, a float16 running
sum, and the two-class loaders the accuracy comparison trains on."""
from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from ptlab.data import CLASSES, to_float_tensors, train_val_split


def scale_history(inf_at: tuple[int, ...] = (3,), steps: int = 10, growth_interval: int = 2,
                  init_scale: float = 1024.0) -> list[tuple[int, float, bool]]:
    """Drive a GradScaler("cpu") through `steps` steps, with an inf gradient at the steps in `inf_at`.

    Returns (step, scale after update, whether optimizer.step() was skipped) per step. The scale halves
    after an inf (and the step is skipped), and doubles after `growth_interval` clean steps in a row.
    """
    w = nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([w], lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=growth_interval)
    history = []
    for step in range(1, steps + 1):
        opt.zero_grad()
        loss = (w * torch.tensor([float("inf") if step in inf_at else 1.0, 1.0])).sum()
        scaler.scale(loss).backward()
        before = w.detach().clone()
        scaler.step(opt)
        scaler.update()
        history.append((step, scaler.get_scale(), bool(torch.equal(before, w.detach()))))
    return history


def running_sum(values: torch.Tensor, dtype: torch.dtype, accumulator: torch.dtype | None = None) -> float:
    """Add values one by one, as a loop or a naive kernel does, keeping the total in `accumulator`
    (default: `dtype`); each value is first rounded to `dtype`."""
    acc_dtype = accumulator or dtype
    total = torch.zeros((), dtype=acc_dtype)
    for v in values.to(dtype):
        total = total + v.to(acc_dtype)
    return float(total)


def class_subset_loaders(classes: tuple[str, ...] = ("circle", "stripes"), n_train: int = 256,
                         batch_size: int = 16, seed: int = 0) -> tuple[DataLoader, DataLoader]:
    """Train and validation loaders over a few classes of the embedded training split, labels 0..k-1.

    The validation loader holds every validation image of those classes (ptlab.data.train_val_split,
    10%); the training loader `n_train` of the rest, shuffled by a generator seeded with `seed`, so
    two calls give the same batches in the same order.
    """

    unknown = [c for c in classes if c not in CLASSES]
    if len(classes) < 2 or unknown:
        raise ValueError(f"classes must name at least 2 of {', '.join(CLASSES)}; got {classes!r}")
    if not isinstance(n_train, int) or n_train < batch_size:
        raise ValueError(f"n_train must be an int >= batch_size ({batch_size}), got {n_train!r}")
    X, y = to_float_tensors(train=True)                     # (N, 3, 32, 32), (N,)
    ids = torch.tensor([CLASSES.index(c) for c in classes])
    keep = torch.isin(y, ids)
    X, y = X[keep], (y[keep].unsqueeze(1) == ids).int().argmax(1)   # labels 0..k-1 in the order of `classes`
    train_idx, val_idx = train_val_split(y, val_fraction=0.1, seed=seed)
    if n_train > len(train_idx):
        raise ValueError(f"n_train={n_train} is more than the {len(train_idx)} training images of {classes}")
    g = torch.Generator().manual_seed(seed)
    chosen = torch.tensor(train_idx)[torch.randperm(len(train_idx), generator=g)[:n_train]]
    train = DataLoader(TensorDataset(X[chosen], y[chosen]), batch_size=batch_size, shuffle=True, generator=g)
    val = DataLoader(TensorDataset(X[val_idx], y[val_idx]), batch_size=256)
    return train, val
