"""What a training step gains from each speed lever on a GPU, measured side by side: mixed precision (float16 autocast
with a GradScaler, bfloat16 autocast), TF32 and channels_last (cudnn.benchmark is not one of them: see
`speed_levers`).

`speed_levers(make_model, batch_size, image_size)` trains a fresh copy of the model (same weights, and one batch per
batch size, drawn once and moved to the device in each lever's layout) with each lever, the levers taking turns, and
keeps each one's fastest round: images per second and the ratio to float32 with TF32 off. A lever that needs more
than the GPU has (float16 tensor cores need compute capability 7.0; bfloat16 and TF32, 8.0) is skipped, with the
reason. `step_seconds` is the same measurement for any list of (lever, batch size) pairs; `fixed_share` reads two
batch sizes for the share of a step that does not grow with the batch (launches, Python, kernels too small to fill
the GPU): what no faster arithmetic can remove. `backend_settings` sets torch's TF32 and cudnn.benchmark flags for a
block and restores them (and torch.backends.cuda.matmul.fp32_precision, which the first writes). Everything also
runs on the CPU (slowly, and the flags do nothing there).
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

import torch
from torch import nn

from .claims import measured

BF16_TF32_CAPABILITY = (8, 0)     # Ampere and later: bfloat16 and TF32 tensor cores
FP16_CAPABILITY = (7, 0)          # Volta and later: float16 tensor cores


@dataclass(frozen=True)
class Lever:
    """One way to run a training step: autocast dtype (None: float32), memory layout, TF32."""

    name: str
    autocast_dtype: torch.dtype | None = None
    channels_last: bool = False
    tf32: bool = False

    def __post_init__(self) -> None:
        if self.autocast_dtype not in (None, torch.float16, torch.bfloat16):
            raise ValueError(f"Lever({self.name!r}): autocast_dtype must be None, torch.float16 or torch.bfloat16, "
                             f"got {self.autocast_dtype!r}")

    @property
    def scaler(self) -> bool:
        """float16 needs a GradScaler; bfloat16 and float32 do not."""
        return self.autocast_dtype == torch.float16

    @property
    def min_capability(self) -> tuple[int, int]:
        """The CUDA compute capability whose tensor cores this lever is for."""
        if self.tf32 or self.autocast_dtype == torch.bfloat16:
            return BF16_TF32_CAPABILITY
        return FP16_CAPABILITY if self.autocast_dtype == torch.float16 else (0, 0)


FLOAT32 = Lever("float32, TF32 off")
FLOAT16 = Lever("float16 autocast + GradScaler", torch.float16)
LEVERS = (
    FLOAT32,
    Lever("TF32", tf32=True),
    Lever("float32 + channels_last", channels_last=True),
    FLOAT16,
    Lever("bfloat16 autocast", torch.bfloat16),
    Lever("bfloat16 + channels_last", torch.bfloat16, channels_last=True),
)


@contextlib.contextmanager
def backend_settings(tf32: bool | None = None, cudnn_benchmark: bool | None = None) -> Iterator[None]:
    """Set TF32 (`torch.set_float32_matmul_precision("high")` for matmuls and `torch.backends.cudnn.allow_tf32` for
    convolutions; False: "highest" and no TF32) and `torch.backends.cudnn.benchmark` for the block; None leaves a
    flag alone. On exit, even on an error, the float32 matmul precision (with the new-API flag
    `torch.backends.cuda.matmul.fp32_precision`, which set_float32_matmul_precision also writes) and both cudnn
    flags are as they were."""
    for name, value in (("tf32", tf32), ("cudnn_benchmark", cudnn_benchmark)):
        if value is not None and not isinstance(value, bool):
            raise TypeError(f"{name} must be True, False or None, got {value!r}")
    before = (torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark,
              torch.backends.cuda.matmul.fp32_precision)
    try:
        if tf32 is not None:
            torch.set_float32_matmul_precision("high" if tf32 else "highest")
            torch.backends.cudnn.allow_tf32 = tf32
        if cudnn_benchmark is not None:
            torch.backends.cudnn.benchmark = cudnn_benchmark
        yield
    finally:
        torch.set_float32_matmul_precision(before[0])
        torch.backends.cuda.matmul.fp32_precision = before[3]     # after the line above, which writes it
        torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark = before[1], before[2]


def make_step(model: nn.Module, optimizer: torch.optim.Optimizer, images: torch.Tensor, labels: torch.Tensor, *,
              autocast_dtype: torch.dtype | None = None,
              scaler: torch.amp.GradScaler | None = None) -> Callable[[], torch.Tensor]:
    """A function that runs one training step on this batch (cross-entropy; autocast to `autocast_dtype` when
    given; `scaler` when given) and returns the loss tensor. The step does not read the loss (no .item()), but
    with an enabled GradScaler, `scaler.step` still reads its inf check (`.item()`, a sync on a GPU)."""
    if images.device != labels.device:
        raise ValueError(f"images are on {images.device} and labels on {labels.device}: put both on one device")
    device_type = images.device.type
    scaler = scaler or torch.amp.GradScaler(device_type, enabled=False)

    def step() -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device_type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
            loss = nn.functional.cross_entropy(model(images), labels)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        return loss.detach()

    return step


def device_capability(device: torch.device | str) -> tuple[int, int] | None:
    """The CUDA compute capability of `device`; None for a device that is not CUDA."""
    device = torch.device(device)
    return torch.cuda.get_device_capability(device) if device.type == "cuda" else None


def why_skipped(lever: Lever, capability: tuple[int, int] | None) -> str | None:
    """Why `lever` cannot run on a GPU of this compute capability (None where it can; None on a CPU)."""
    if capability is None or capability >= lever.min_capability:
        return None
    need = ".".join(map(str, lever.min_capability))
    return f"needs compute capability {need} or more (its tensor cores); this GPU has {capability[0]}.{capability[1]}"


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _check_counts(**counts: int) -> None:
    for name, value in counts.items():
        minimum = 0 if name == "warmup" else 1
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")


@dataclass(frozen=True)
class StepTimes:
    """Fastest seconds per training step of each (lever name, batch size) that ran, and why the others did not."""

    seconds: dict[tuple[str, int], float]
    skipped: dict[tuple[str, int], str] = field(default_factory=dict)

    def images_per_second(self, name: str, batch_size: int) -> float:
        """Images per second of one (lever, batch size)."""
        return batch_size / self.seconds[name, batch_size]


def step_seconds(make_model: Callable[[], nn.Module], runs: Sequence[tuple[Lever, int]], *, image_size: int = 32,
                 device: torch.device | str = "cuda", steps: int = 5, rounds: int = 2, warmup: int = 2,
                 num_classes: int = 10, capability: tuple[int, int] | None = None) -> StepTimes:
    """Seconds per training step of each (lever, batch size) in `runs`, measured side by side.

    Each run gets a fresh model from `make_model()` after torch.manual_seed(0) (the same weights), SGD with
    momentum, and the random batch of its batch size: one per batch size, drawn once on the CPU, so every lever at
    that size trains on the same images and labels, moved to `device` in the lever's memory layout. After `warmup`
    untimed steps each, the runs take turns for `rounds` rounds of `steps` synchronised steps; each keeps its
    fastest round. `capability` (default: the device's) decides which levers can run.
    """
    _check_counts(image_size=image_size, steps=steps, rounds=rounds, warmup=warmup, num_classes=num_classes)
    if not runs or not all(isinstance(lever, Lever) and isinstance(b, int) and b >= 1 for lever, b in runs):
        raise ValueError("runs must be a non-empty list of (Lever, batch size >= 1) pairs")
    device = torch.device(device)
    capability = capability if capability is not None else device_capability(device)
    g = torch.Generator().manual_seed(0)
    batches: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    prepared, skipped = {}, {}
    for lever, batch_size in runs:
        reason = why_skipped(lever, capability)
        if reason:
            skipped[lever.name, batch_size] = reason
            continue
        layout = torch.channels_last if lever.channels_last else torch.contiguous_format
        if batch_size not in batches:                                                     # drawn once per size
            batches[batch_size] = (torch.randn(batch_size, 3, image_size, image_size, generator=g),   # (B, 3, H, W)
                                   torch.randint(0, num_classes, (batch_size,), generator=g))          # (B,)
        images = batches[batch_size][0].to(device, memory_format=layout)
        labels = batches[batch_size][1].to(device)
        torch.manual_seed(0)
        model = make_model().to(device, memory_format=layout)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        scaler = torch.amp.GradScaler(device.type, enabled=lever.scaler)
        prepared[lever.name, batch_size] = (lever, make_step(model, optimizer, images, labels,
                                                             autocast_dtype=lever.autocast_dtype, scaler=scaler))
    best = {key: float("inf") for key in prepared}
    for round_ in range(rounds):
        order = list(prepared.items()) if round_ % 2 == 0 else list(prepared.items())[::-1]
        for key, (lever, step) in order:
            with backend_settings(tf32=lever.tf32):
                for _ in range(warmup if round_ == 0 else 0):
                    step()
                _synchronize(device)
                start = time.perf_counter()
                for _ in range(steps):
                    step()
                _synchronize(device)
                best[key] = min(best[key], (time.perf_counter() - start) / steps)
    return StepTimes(best, skipped)


@dataclass(frozen=True)
class LeverSpeeds:
    """Images per second of each lever at one batch size, side by side, and the levers that were skipped."""

    images_per_second: dict[str, float]
    skipped: dict[str, str]
    baseline: str = FLOAT32.name

    def ratio(self, name: str) -> float:
        """A lever's speed over the baseline's (float32 with TF32 off)."""
        if name not in self.images_per_second:
            known = ", ".join(self.images_per_second)
            raise KeyError(f"{name!r} did not run ({self.skipped.get(name, 'not measured')}); measured: {known}")
        return self.images_per_second[name] / self.images_per_second[self.baseline]

    def __str__(self) -> str:
        width = max(len(n) for n in [*self.images_per_second, *self.skipped, "lever"]) + 2
        lines = [f"{'lever':<{width}}{'images/s':<12}x {self.baseline}"]
        for name, speed in self.images_per_second.items():
            lines.append(f"{name:<{width}}{measured(speed, 3):<12}{measured(self.ratio(name), 3)}")
        lines += [f"{name:<{width}}skipped: {reason}" for name, reason in self.skipped.items()]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return str(self)


def speed_levers(make_model: Callable[[], nn.Module], *, batch_size: int = 64, image_size: int = 224,
                 levers: Sequence[Lever] = LEVERS, device: torch.device | str = "cuda", steps: int = 5,
                 rounds: int = 2, warmup: int = 2, num_classes: int = 10,
                 capability: tuple[int, int] | None = None) -> LeverSpeeds:
    """Images per second of a training step with each lever, side by side (see step_seconds); the first lever
    is the baseline of the ratios and must be able to run.

    There is no cudnn.benchmark lever: within one process it would measure nothing. ATen's cuDNN convolutions
    look a plan up in one cache before they look at `torch.backends.cudnn.benchmark`; the cache's key (shapes,
    strides, dtype, layout, deterministic, allow_tf32) does not include the flag, and the heuristic plans go into
    the same cache (aten/src/ATen/native/cudnn/Conv_v8.cpp, run_single_conv). A benchmark lever after a lever
    with the same shapes would run the cached heuristic plans. Measure cudnn.benchmark in a fresh process.
    """
    if not levers or levers[0].min_capability != (0, 0):
        raise ValueError("levers must start with a baseline that runs on any GPU (FLOAT32, say)")
    times = step_seconds(make_model, [(lever, batch_size) for lever in levers], image_size=image_size,
                         device=device, steps=steps, rounds=rounds, warmup=warmup, num_classes=num_classes,
                         capability=capability)
    speeds = {name: times.images_per_second(name, b) for name, b in times.seconds}
    return LeverSpeeds(speeds, {name: why for (name, _), why in times.skipped.items()}, levers[0].name)


def fixed_share(seconds_small: float, seconds_large: float, factor: float) -> float:
    """The share of a step at the small batch that does not grow with the batch, from step times at batch B and
    factor x B: with t(B) = fixed + B x per_image, fixed / t(B), kept within [0, 1].

    Amdahl: whatever only speeds up the part that grows (faster arithmetic) can make the step at most
    1 / fixed_share times faster.
    """
    for name, value in (("seconds_small", seconds_small), ("seconds_large", seconds_large)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not factor > 1:
        raise ValueError(f"factor must be a number above 1 (the large batch over the small one), got {factor!r}")
    fixed = (factor * seconds_small - seconds_large) / (factor - 1)
    return min(max(fixed / seconds_small, 0.0), 1.0)


def tf32_matmul_error(device: torch.device | str = "cuda", size: int = 512) -> dict[str, float]:
    """Largest error of a float32 (size, size) @ (size, size) product against float64, relative to the largest
    entry, with TF32 off ("highest") and on ("high"); the settings are restored after."""
    _check_counts(size=size)
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(size, size, generator=g).to(device) for _ in range(2))
    exact = a.double() @ b.double()
    errors = {}
    for name, tf32 in (("highest", False), ("high", True)):
        with backend_settings(tf32=tf32):
            product = a @ b
        errors[name] = ((product.double() - exact).abs().max() / exact.abs().max()).item()
    return errors


def format_levers(levers: Sequence[Lever] = LEVERS) -> str:
    """What each lever sets, and the compute capability it needs, as a table."""
    width = max(len(lever.name) for lever in levers) + 2
    lines = [f"{'lever':<{width}}{'autocast':<10}{'layout':<15}{'TF32':<7}needs"]
    for lever in levers:
        dtype = str(lever.autocast_dtype).replace("torch.", "") if lever.autocast_dtype else "-"
        layout = "channels_last" if lever.channels_last else "NCHW"
        need = ".".join(map(str, lever.min_capability)) if lever.min_capability != (0, 0) else "any GPU"
        lines.append(f"{lever.name:<{width}}{dtype:<10}{layout:<15}{str(lever.tf32):<7}{need}")
    return "\n".join(lines)
