"""Mixed precision helpers for chapter 6: what autocast does per op, the GradScaler's scale, bf16 sums,
and a side-by-side speed comparison of float32, bf16 autocast and bf16 + channels_last training."""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .claims import measured


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


@dataclass(frozen=True)
class SpeedRow:
    name: str
    images_per_second: float
    ratio: float
    accuracy: float


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


VARIANTS = {"float32": (None, False), "bf16 autocast": (torch.bfloat16, False),
            "bf16 + channels_last": (torch.bfloat16, True)}


def speed_comparison(make_model, batches, warmup: int = 1) -> dict[str, float]:
    """Training speed of one model as float32, bf16 autocast and bf16 + channels_last, in images per CPU-second.

    Each variant trains its own copy (`make_model()`) on the same batches. The variants take turns
    step by step (so load on the machine hits all alike), the first `warmup` steps are not timed, and
    each variant's speed is its fastest timed step in CPU time of this process (all its threads): on a
    loaded machine, wall time also counts the time other processes hold the cores, CPU time does not.
    """
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


def format_speed_table(speeds: dict[str, float], accuracies: dict[str, float] | None = None) -> str:
    """images per CPU-second, ratio to float32 (and accuracy) per variant; measured figures left-aligned."""
    base = speeds["float32"]
    lines = [f"{'variant':<22}{'images/CPU-s':<14}{'x float32':<14}" + ("accuracy" if accuracies else "")]
    lines[0] = lines[0].rstrip()
    for name, ips in speeds.items():
        row = f"{name:<22}{measured(ips, 3):<14}{measured(ips / base, 3):<14}"
        if accuracies and name in accuracies:
            row += measured(accuracies[name], 3)
        lines.append(row.rstrip())
    return "\n".join(lines)
