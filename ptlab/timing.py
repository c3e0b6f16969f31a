"""Honest timing: warm-up, repeats, medians, and ratios measured side by side in one run."""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch


def _synchronize(device: torch.device | str | None) -> None:
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def _check_args(warmup: int, repeats: int) -> None:
    if not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be an int >= 0, got {warmup!r}")
    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be an int >= 1, got {repeats!r}")


def _once(fn: Callable[[], object], device) -> float:
    _synchronize(device)
    start = time.perf_counter()
    fn()
    _synchronize(device)
    return time.perf_counter() - start


@dataclass(frozen=True)
class Timing:
    """Seconds per call of one callable: median and every repeat."""

    name: str
    seconds: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    def __str__(self) -> str:
        from .claims import measured_seconds

        return f"{self.name}: median {measured_seconds(self.median)} over {len(self.seconds)} runs"


@dataclass(frozen=True)
class Comparison:
    """Two callables timed interleaved; ratio = median(a) / median(b), >1 means b is faster."""

    a: Timing
    b: Timing

    @property
    def ratio(self) -> float:
        return self.a.median / self.b.median

    def __str__(self) -> str:
        from .claims import measured

        return f"{self.a}\n{self.b}\n{self.a.name} / {self.b.name} = {measured(self.ratio, 3)}x"


def format_seconds(seconds: float) -> str:
    """A duration in the unit that reads best: ns, µs, ms or s."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def time_callable(fn: Callable[[], object], *, warmup: int = 2, repeats: int = 7,
                  name: str = "fn", device: torch.device | str | None = None) -> Timing:
    """Median wall time of fn() after warm-up calls (CUDA is synchronised when device is cuda)."""
    if not callable(fn):
        raise TypeError(f"time_callable needs a callable, got {type(fn).__name__}")
    _check_args(warmup, repeats)
    for _ in range(warmup):
        fn()
    return Timing(name, [_once(fn, device) for _ in range(repeats)])


def compare(fn_a: Callable[[], object], fn_b: Callable[[], object], *, warmup: int = 2, repeats: int = 7,
            names: tuple[str, str] = ("a", "b"), device: torch.device | str | None = None) -> Comparison:
    """Time two callables interleaved (a b b a ...) so drift and noise hit both alike."""
    if not (callable(fn_a) and callable(fn_b)):
        raise TypeError("compare needs two callables")
    _check_args(warmup, repeats)
    for _ in range(warmup):
        fn_a()
        fn_b()
    times_a, times_b = [], []
    for i in range(repeats):
        order = ((fn_a, times_a), (fn_b, times_b))
        for fn, sink in (order if i % 2 == 0 else order[::-1]):
            sink.append(_once(fn, device))
    return Comparison(Timing(names[0], times_a), Timing(names[1], times_b))
