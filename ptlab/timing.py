"""Honest timing: warm-up, repeats, medians, and ratios measured side by side in one run."""
from __future__ import annotations

import contextlib
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch

from .claims import format_seconds, measured, measured_seconds  # noqa: F401  (format_seconds: its old path)


def _synchronize(device: torch.device | str | None) -> None:
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def _check_args(warmup: int, repeats: int) -> None:
    if not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be an int >= 0, got {warmup!r}")
    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be an int >= 1, got {repeats!r}")


CLOCKS = {"wall": time.perf_counter, "process": time.process_time}


def _once(fn: Callable[[], object], device, clock: str = "wall") -> float:
    now = CLOCKS[clock]
    _synchronize(device)
    start = now()
    fn()
    _synchronize(device)
    return now() - start


@dataclass(frozen=True)
class Timing:
    """Seconds per call of one callable: median and every repeat."""

    name: str
    seconds: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    def __str__(self) -> str:
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
        return f"{self.a}\n{self.b}\n{self.a.name} / {self.b.name} = {measured(self.ratio, 3)}x"


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


@contextlib.contextmanager
def torch_threads(threads: int | None):
    """Run the block with torch.set_num_threads(threads) and restore the count after (None: leave it)."""
    if threads is not None and (not isinstance(threads, int) or isinstance(threads, bool) or threads < 1):
        raise ValueError(f"threads must be a positive int or None, got {threads!r}")
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def matmul_flops(dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16), *, min_seconds: float = 0.05,
                 max_size: int = 2048, repeats: int = 3, device: torch.device | str = "cpu",
                 clock: str | None = None, threads: int | None = None) -> dict[str, float]:
    """Measured matmul peak per dtype: FLOP per second of the fastest square (n, n) @ (n, n) product.

    For each dtype, n doubles from 256 until one product takes `min_seconds` (big enough to be
    compute-bound, not so big that an emulated dtype takes minutes) or reaches `max_size`; those
    calls are the warm-up. Then the dtypes take turns for `repeats` rounds and each keeps its fastest.
    An n x n product is 2 n**3 FLOP. The clock is "process" (CPU time of this process, all its
    threads: what other processes do to the cores does not count) on the CPU and "wall" on CUDA, so
    on the CPU the figure is FLOP per CPU-second, the unit of ptlab.amp.speed_comparison. `threads`
    sets torch's thread count for the measurement (None: as it is); with threads=1 no thread spins
    waiting for a sibling that lost its core, so load moves the CPU time less than the wall time (caches and
    memory are still shared: compare figures of one run).
    Returns {"float32": flop_per_s, "bfloat16": ...}.
    """
    if not isinstance(dtypes, (tuple, list)) or not dtypes or not all(isinstance(d, torch.dtype) for d in dtypes):
        raise TypeError(f"dtypes must be a non-empty tuple of torch.dtype, got {dtypes!r}")
    if not all(d.is_floating_point for d in dtypes):
        raise ValueError(f"dtypes must be floating point dtypes, got {[_dtype_name(d) for d in dtypes]}")
    if not (isinstance(min_seconds, (int, float)) and min_seconds > 0):
        raise ValueError(f"min_seconds must be a positive number, got {min_seconds!r}")
    if not isinstance(max_size, int) or max_size < 256:
        raise ValueError(f"max_size must be an int >= 256, got {max_size!r}")
    _check_args(0, repeats)
    device = torch.device(device)
    clock = clock or ("wall" if device.type == "cuda" else "process")
    if clock not in CLOCKS:
        raise ValueError(f"clock must be one of {sorted(CLOCKS)}, got {clock!r}")
    with torch_threads(threads):
        return _matmul_flops(dtypes, min_seconds, max_size, repeats, device, clock)


def _matmul_flops(dtypes, min_seconds: float, max_size: int, repeats: int, device: torch.device,
                  clock: str) -> dict[str, float]:
    g = torch.Generator().manual_seed(0)
    products = {}
    for dtype in dtypes:
        size = 256
        while True:
            a, b = (torch.randn(size, size, generator=g).to(device=device, dtype=dtype) for _ in range(2))
            if _once(lambda: a @ b, device, clock) >= min_seconds or size * 2 > max_size:
                break
            size *= 2
        products[_dtype_name(dtype)] = (lambda a=a, b=b: a @ b, 2.0 * size ** 3)
    best = {name: float("inf") for name in products}
    for _ in range(repeats):
        for name, (product, _) in products.items():
            best[name] = min(best[name], _once(product, device, clock))
    return {name: flop / max(best[name], 1e-9) for name, (_, flop) in products.items()}
