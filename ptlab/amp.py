"""Mixed precision helpers for chapter 6: what autocast does per op, the GradScaler's scale, bf16 sums,
a side-by-side speed comparison of float32, bf16 autocast and bf16 + channels_last training, the FLOP
a training step needs (for the fraction of the measured matmul peak it reaches), and the small
two-class task on which the three variants' accuracies are compared."""
from __future__ import annotations

import copy
import time
from typing import Callable, Iterable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from .claims import measured
from .timing import torch_threads


def op_dtypes(device_type: str = "cpu", dtype: torch.dtype = torch.bfloat16) -> list[tuple[str, str, str]]:
    """Run common ops under autocast and return (op, input dtype, output dtype) for each.

    Matmul-like ops get float32 inputs (autocast casts them down); the others get a low-precision
    input, as they do in a network, where they follow a matmul or a convolution.
    """
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 16, generator=g)                    # (8, 16) float32
    w = torch.randn(16, 16, generator=g)                   # (16, 16)
    images = torch.randn(2, 3, 8, 8, generator=g)          # (2, 3, 8, 8)
    conv = nn.Conv2d(3, 4, 3)
    low = x.to(dtype)                                      # as the output of a matmul under autocast
    target = torch.randint(0, 16, (8,), generator=g)
    ops = [
        ("x @ w (matmul)", x, lambda: x @ w),
        ("F.linear", x, lambda: F.linear(x, w)),
        ("nn.Conv2d", images, lambda: conv(images)),
        ("F.cross_entropy", low, lambda: F.cross_entropy(low, target)),
        ("F.mse_loss", low, lambda: F.mse_loss(low, low)),
        ("torch.prod", low, lambda: low.prod()),
        ("torch.softmax", low, lambda: torch.softmax(low, -1)),
        ("tensor.sum", low, lambda: low.sum()),
        ("tensor.mean", low, lambda: low.mean()),
        ("torch.relu", low, lambda: torch.relu(low)),
        ("low + float32", low, lambda: low + x),
    ]
    rows = []
    with torch.autocast(device_type, dtype=dtype):
        for name, inp, fn in ops:
            rows.append((name, str(inp.dtype).replace("torch.", ""), str(fn().dtype).replace("torch.", "")))
    return rows


def format_op_table(rows: list[tuple[str, str, str]]) -> str:
    """The op table as fixed-width text."""
    lines = [f"{'op':<18}{'input':<10}output"]
    lines += [f"{op:<18}{inp:<10}{out}" for op, inp, out in rows]
    return "\n".join(lines)


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


def _step_fn(model: nn.Module, dtype: torch.dtype | None, channels_last: bool):
    """One training step of `model` on a batch, in float32 (dtype None) or under autocast to `dtype`."""
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model.train()

    def step(X: torch.Tensor, y: torch.Tensor) -> None:
        if channels_last:
            X = X.contiguous(memory_format=torch.channels_last)
        opt.zero_grad()
        with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            loss = F.cross_entropy(model(X), y)
        loss.backward()
        opt.step()

    return step


# name: (autocast dtype or None for plain float32, whether the model and inputs are channels_last)
VARIANTS = {"float32": (None, False), "bf16 autocast": (torch.bfloat16, False),
            "bf16 + channels_last": (torch.bfloat16, True)}


def variant_dtype(name: str) -> str:
    """The dtype a variant's matmuls and convolutions run in: 'float32' or 'bfloat16'."""
    if name not in VARIANTS:
        raise ValueError(f"unknown variant {name!r}; the variants are {', '.join(VARIANTS)}")
    dtype = VARIANTS[name][0]
    return "float32" if dtype is None else str(dtype).replace("torch.", "")


def speed_comparison(make_model: Callable[[], nn.Module], batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
                     warmup: int = 1, threads: int | None = 1) -> dict[str, float]:
    """Training speed of one model as float32, bf16 autocast and bf16 + channels_last, in images per CPU-second.

    Each variant trains its own copy (`make_model()`) on the same batches. The variants take turns
    step by step (so load on the machine hits all alike), the first `warmup` steps are not timed, and
    each variant's speed is its fastest timed step in CPU time of this process: on a loaded machine,
    wall time also counts the time other processes hold the cores, CPU time does not. It runs on
    `threads` torch threads (1 by default; None: as set): with several, a thread waiting for a sibling
    that lost its core spins and burns CPU time, so on a shared machine even CPU time gets noisy.
    """
    with torch_threads(threads):
        return _speed_comparison(make_model, batches, warmup)


def _speed_comparison(make_model, batches, warmup: int) -> dict[str, float]:
    steps = {name: _step_fn(make_model(), dtype, cl) for name, (dtype, cl) in VARIANTS.items()}
    best = {name: float("inf") for name in VARIANTS}
    for i, (X, y) in enumerate(batches):
        for name, step in steps.items():
            start = time.process_time()
            step(X, y)
            elapsed = time.process_time() - start
            if i >= warmup:
                best[name] = min(best[name], elapsed / len(y))
    if any(t == float("inf") for t in best.values()):
        raise ValueError(f"speed_comparison needs more than warmup={warmup} batches")
    return {name: 1.0 / t for name, t in best.items()}


def _counted_flops(model: nn.Module, input_shape: tuple[int, ...], backward: bool) -> float:
    """FLOP per image that FlopCounterMode counts for a forward (and backward) pass of a copy of model."""
    from torch.utils.flop_counter import FlopCounterMode

    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not (isinstance(input_shape, tuple) and all(isinstance(d, int) and d > 0 for d in input_shape)):
        raise ValueError(f"input_shape must be a tuple of positive ints (one image, no batch), got {input_shape!r}")
    probe = copy.deepcopy(model).train()                    # the caller's model, BN stats and grads untouched
    batch = 2                                               # BatchNorm needs more than one value per channel
    images = torch.zeros(batch, *input_shape)               # (2, C, H, W)
    with FlopCounterMode(display=False) as counter:
        loss = F.cross_entropy(probe(images), torch.zeros(batch, dtype=torch.long))
        if backward:
            loss.backward()
    return counter.get_total_flops() / batch


def forward_flops(model: nn.Module, input_shape: tuple[int, ...] = (3, 32, 32)) -> float:
    """FLOP per image of model's forward pass: its convolutions and matmuls, 2 FLOP per multiply-add."""
    return _counted_flops(model, input_shape, backward=False)


def training_step_flops(model: nn.Module, input_shape: tuple[int, ...] = (3, 32, 32)) -> float:
    """FLOP per image of one training step (forward, loss, backward) of `model`, counted by
    torch.utils.flop_counter.FlopCounterMode on a copy of it (the model itself is not touched).

    The counter counts matmuls and convolutions (2 FLOP per multiply-add), not elementwise ops,
    BatchNorm or pooling. Backward costs about 2x forward (the gradient of each layer's input and of
    its weight), except that the first layer needs no input gradient: a bit under 3x forward in all.
    """
    return _counted_flops(model, input_shape, backward=True)


def peak_fractions(speeds: dict[str, float], flop_per_image: float, peaks: dict[str, float]) -> dict[str, float]:
    """Per variant: the FLOP/s its training step reaches (images/s x FLOP per image) over the measured
    matmul peak of the dtype it computes in (ptlab.timing.matmul_flops, in the same clock as `speeds`)."""
    if not (isinstance(flop_per_image, (int, float)) and flop_per_image > 0):
        raise ValueError(f"flop_per_image must be a positive number, got {flop_per_image!r}")
    missing = {variant_dtype(name) for name in speeds} - set(peaks)
    if missing:
        raise ValueError(f"peaks has no matmul peak for {sorted(missing)}: measure them with "
                         f"ptlab.timing.matmul_flops((torch.float32, torch.bfloat16))")
    return {name: ips * flop_per_image / peaks[variant_dtype(name)] for name, ips in speeds.items()}


def format_speed_table(speeds: dict[str, float], accuracies: dict[str, float] | None = None,
                       fractions: dict[str, float] | None = None) -> str:
    """images per CPU-second, ratio to float32, fraction of the dtype's matmul peak and accuracy per
    variant (the last two when given); measured figures left-aligned."""
    if "float32" not in speeds:
        raise ValueError(f"speeds needs a 'float32' entry to compare with, got {list(speeds)}")
    base = speeds["float32"]
    header = f"{'variant':<22}{'images/CPU-s':<14}{'x float32':<12}"
    if fractions:
        header += f"{'of its matmul peak':<20}"
    if accuracies:
        header += "accuracy"
    lines = [header.rstrip()]
    for name, ips in speeds.items():
        row = f"{name:<22}{measured(ips, 3):<14}{measured(ips / base, 3):<12}"
        if fractions:
            row += f"{measured(fractions[name], 2) if name in fractions else '':<20}"
        if accuracies and name in accuracies:
            row += measured(accuracies[name], 3)
        lines.append(row.rstrip())
    return "\n".join(lines)


def class_subset_loaders(classes: tuple[str, ...] = ("circle", "stripes"), n_train: int = 256,
                         batch_size: int = 16, seed: int = 0) -> tuple[DataLoader, DataLoader]:
    """Train and validation loaders over a few classes of the embedded training split, labels 0..k-1.

    The validation loader holds every validation image of those classes (ptlab.data.train_val_split,
    10%); the training loader `n_train` of the rest, shuffled by a generator seeded with `seed`, so
    two calls give the same batches in the same order.
    """
    from .data import CLASSES, to_float_tensors, train_val_split

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
