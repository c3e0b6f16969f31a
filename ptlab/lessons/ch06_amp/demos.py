"""Chapter 6's demonstrations: GradScaler's scale over steps, gradient accumulation with a
GradScaler, a low-precision running sum, the two-class loaders the accuracy comparison trains
on, and float16 autocast with a GradScaler against float32 on a GPU."""
from __future__ import annotations

import math
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from ptlab.data import CLASSES, to_float_tensors, train_val_split
from ptlab.models import SmallCNN


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


def accumulated_amp_step(model: nn.Module, opt: torch.optim.Optimizer, scaler: torch.amp.GradScaler,
                         micro_batches: list[tuple[torch.Tensor, torch.Tensor]], max_norm: float = 1.0) -> float:
    """One optimizer step from k micro-batches (X_i, y_i) under float16 autocast on the CPU, mean squared error,
    gradients clipped at max_norm; returns the gradient norm clipping saw (unscaled)."""
    if not micro_batches:
        raise ValueError("micro_batches must hold at least one (X, y) pair, got none")
    opt.zero_grad()
    for X_i, y_i in micro_batches:
        with torch.autocast("cpu", dtype=torch.float16):
            out = model(X_i)                                        # (B/k, 1) float16
        loss = nn.functional.mse_loss(out.float(), y_i) / len(micro_batches)   # 1/k of the whole batch's mean
        scaler.scale(loss).backward()                               # .grad sums the k scaled gradients
    scaler.unscale_(opt)                                            # once, after the last micro-batch
    norm = nn.utils.clip_grad_norm_(model.parameters(), max_norm)  # the true (unscaled) norm
    scaler.step(opt)                                                # checks the whole batch's grads for inf/NaN
    scaler.update()                                                 # once per optimizer step
    return norm.item()


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


def _wait_for(device: str) -> None:
    """Wait until the device has run everything queued (CUDA runs asynchronously; the CPU does not)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def fp16_against_fp32(device: str = "cuda", steps: int = 20, batch_size: int = 256, width: int = 64,
                      warmup: int = 3) -> dict[str, dict[str, float]]:
    """Train a SmallCNN twice on `device` from the same weights and batches: in float32, and with float16 autocast
    and a GradScaler(device). Per run: images per second (wall clock, synchronised, after `warmup` untimed steps),
    the first and last training loss, how many steps the scaler skipped, and whether the parameters stayed float32.

    Written for a GPU (chapter 6's CUDA cell); it runs on any device where float16 autocast does.
    """
    if steps <= warmup:
        raise ValueError(f"steps ({steps}) must be more than warmup ({warmup})")
    X, y = to_float_tensors(train=True)                     # (N, 3, 32, 32), (N,)
    g = torch.Generator().manual_seed(0)
    order = torch.randint(0, len(y), (steps, batch_size), generator=g)
    results = {}
    for name, fp16 in (("float32", False), ("float16 autocast + GradScaler", True)):
        torch.manual_seed(0)
        model = SmallCNN(width=width).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        scaler = torch.amp.GradScaler(device, enabled=fp16)
        losses = []                                         # tensors: no .item() (a sync) inside the timed steps
        for i, idx in enumerate(order):
            if i == warmup:
                _wait_for(device)
                start = time.perf_counter()
            images, labels = X[idx].to(device), y[idx].to(device)
            opt.zero_grad()
            with torch.autocast(device, dtype=torch.float16, enabled=fp16):
                loss = nn.functional.cross_entropy(model(images), labels)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            losses.append(loss.detach())
        _wait_for(device)
        seconds = time.perf_counter() - start
        # The scale only halves (a skipped step) within growth_interval=2000 steps: count the halvings.
        skipped = math.log2(65536.0 / scaler.get_scale()) if fp16 else 0.0
        results[name] = {"images per second": (steps - warmup) * batch_size / seconds,
                         "first loss": losses[0].item(), "last loss": losses[-1].item(), "skipped steps": skipped,
                         "parameters float32": all(p.dtype == torch.float32 for p in model.parameters())}
    return results
