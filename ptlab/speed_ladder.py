"""A speed ladder for a CNN training loop on the CPU: one change per rung, each measured side by side with the last."""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, replace
from typing import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Subset

from .amp import bf16_matmul_kind
from .claims import measured, measured_seconds
from .compiling import quiet_compile_logs
from .data import EmbeddedImages, make_transform, normalize_uint8, uint8_split
from .models import SmallCNN
from .timing import torch_threads


@dataclass(frozen=True)
class Setup:
    """What one rung trains with: everything a rung changes is one of these fields."""

    batch_size: int
    channels_last: bool = False     # model weights and each batch in NHWC memory (torch.channels_last)
    bf16: bool = False              # forward and loss under torch.autocast("cpu", torch.bfloat16)
    compiled: bool = False          # torch.compile(model, dynamic=False): forward and, via AOTAutograd, backward
    fused: bool = False             # AdamW(fused=True); else torch's default, on CPU the per-tensor for-loop
    preloaded: bool = False         # batches gathered from tensors normalised once; else a DataLoader (main
                                    # process) over a Dataset that transforms each image on every access


@dataclass(frozen=True)
class Rung:
    """One rung: its name, its setup, images per CPU-second (None when skipped) and why it was skipped."""

    name: str
    setup: Setup
    images_per_cpu_s: float | None = None
    skipped: str = ""               # the reason, when the rung was not measured
    compile_seconds: float | None = None   # wall time of its first step (compile + one step), compiled rungs only
    load_cpu_s_per_image: float | None = None   # its fastest batch loading alone, CPU-seconds per image


@dataclass(frozen=True)
class Ladder:
    """The rungs in order, with the ratio of each measured rung to the measured rung before it and to the first."""

    rungs: tuple[Rung, ...]
    threads: int
    steps: int
    warmup: int

    def __getitem__(self, name: str) -> Rung:
        for rung in self.rungs:
            if rung.name == name:
                return rung
        raise KeyError(f"no rung named {name!r}; the rungs are {', '.join(r.name for r in self.rungs)}")

    @property
    def measured_rungs(self) -> list[Rung]:
        """The rungs that were measured, in order."""
        return [r for r in self.rungs if r.images_per_cpu_s is not None]

    def ratio(self, name: str) -> float:
        """A measured rung's images per CPU-second over the previous measured rung's (1.0 for the first)."""
        rung, before = self[name], None
        if rung.images_per_cpu_s is None:
            raise ValueError(f"rung {name!r} was skipped ({rung.skipped}): it has no speed")
        for r in self.measured_rungs:
            if r.name == name:
                return 1.0 if before is None else r.images_per_cpu_s / before.images_per_cpu_s
            before = r
        raise AssertionError("unreachable")

    def load_ratio(self, name: str) -> float:
        """The rung before `name`'s CPU time per image to load a batch over `name`'s: how much faster it loads."""
        names = [r.name for r in self.measured_rungs]
        if name not in names or names.index(name) == 0:
            raise ValueError(f"load_ratio needs a measured rung after the first, got {name!r}")
        before, rung = self[names[names.index(name) - 1]], self[name]
        if not rung.load_cpu_s_per_image:                        # below the clock's resolution
            return float("inf")
        return before.load_cpu_s_per_image / rung.load_cpu_s_per_image

    def load_share(self, name: str) -> float:
        """The share of a measured rung's fastest step spent loading its batch (CPU time, 0 to 1)."""
        rung = self[name]
        if rung.images_per_cpu_s is None:
            raise ValueError(f"rung {name!r} was skipped ({rung.skipped}): it has no loading time")
        return rung.load_cpu_s_per_image * rung.images_per_cpu_s

    def to_naive(self, name: str) -> float:
        """A measured rung's images per CPU-second over the first rung's."""
        rung = self[name]
        if rung.images_per_cpu_s is None:
            raise ValueError(f"rung {name!r} was skipped ({rung.skipped}): it has no speed")
        return rung.images_per_cpu_s / self.rungs[0].images_per_cpu_s

    @property
    def compile_seconds(self) -> float:
        """Wall seconds of the compiled rungs' first steps together (not counted in any speed)."""
        return sum(r.compile_seconds or 0.0 for r in self.rungs)


def _positive_int(name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def ladder_rungs(batch_size: int = 32, large_batch_size: int = 128) -> list[tuple[str, Setup]]:
    """The rungs in order, each adding one change to the one before: (name, setup)."""
    _positive_int("batch_size", batch_size)
    _positive_int("large_batch_size", large_batch_size)
    if large_batch_size <= batch_size:
        raise ValueError(f"large_batch_size must be larger than batch_size={batch_size}, got {large_batch_size}")
    naive = Setup(batch_size=batch_size)
    changes = [("+ channels_last", {"channels_last": True}), ("+ bf16 autocast", {"bf16": True}),
               ("+ torch.compile(model)", {"compiled": True}), ("+ fused AdamW", {"fused": True}),
               (f"+ batch {large_batch_size}", {"batch_size": large_batch_size}),
               ("+ preloaded batches", {"preloaded": True})]
    rungs, setup = [(f"naive: float32, batch {batch_size}", naive)], naive
    for name, change in changes:
        setup = replace(setup, **change)
        rungs.append((name, setup))
    return rungs


def _batches(setup: Setup, images: torch.Tensor, labels: torch.Tensor, seed: int) -> Iterator[tuple]:
    """Endless shuffled batches (X (B, 3, 32, 32) float32, y (B,)) the way the setup loads them."""
    generator = torch.Generator().manual_seed(seed)
    if setup.preloaded:
        X = normalize_uint8(images)                              # every image normalised once, up front

        def gathered():
            while True:
                order = torch.randperm(len(labels), generator=generator)
                for start in range(0, len(order) - setup.batch_size + 1, setup.batch_size):
                    index = order[start:start + setup.batch_size]
                    yield X[index], labels[index]                # one gather per batch
        return gathered()
    dataset = Subset(EmbeddedImages(train=True, transform=make_transform()), range(len(labels)))
    loader = DataLoader(dataset, batch_size=setup.batch_size, shuffle=True, drop_last=True, generator=generator)
    return itertools.chain.from_iterable(itertools.repeat(loader))   # epoch after epoch, in this process


def _training_step(setup: Setup, make_model: Callable[[], nn.Module], batches: Iterator[tuple],
                   lr: float) -> Callable[[], tuple[int, float]]:
    """One training step of a fresh model set up as `setup` says; returns the number of images it trained on and
    the CPU seconds it took to load them."""
    model = make_model()
    if setup.channels_last:
        model = model.to(memory_format=torch.channels_last)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, fused=True if setup.fused else None)
    forward = torch.compile(model, dynamic=False) if setup.compiled else model

    def step() -> tuple[int, float]:
        start = time.process_time()
        X, y = next(batches)                                     # (B, 3, 32, 32), (B,)
        load_cpu = time.process_time() - start
        if setup.channels_last:
            X = X.contiguous(memory_format=torch.channels_last)
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=setup.bf16):
            loss = F.cross_entropy(forward(X), y)
        loss.backward()
        optimizer.step()
        return len(y), load_cpu
    return step


def speed_ladder(width: int = 16, batch_size: int = 32, large_batch_size: int = 128, steps: int = 10,
                 warmup: int = 2, threads: int | None = 1, bf16: bool | None = None, seed: int = 0,
                 lr: float = 1e-3) -> Ladder:
    """Climb the ladder of ladder_rungs() for SmallCNN(width) with AdamW on the embedded dataset: each rung's images
    per CPU-second, measured side by side (the rungs take turns step by step, so load hits all alike; each rung's
    speed is its fastest step after `warmup` untimed ones, in CPU time of this process, batch loading included).

    bf16: None measures the bf16 rung only where bf16_matmul_kind() says the kernels are native (else it is skipped,
    with the reason); True measures it anyway, False skips it. Compiled rungs compile on their first step: its wall
    time is reported as compile_seconds and is not counted in any speed. Workers are not used: the loading rung
    compares two ways of loading in this process, whose CPU time is all that is counted.
    """
    _positive_int("width", width)
    _positive_int("steps", steps)
    if not isinstance(warmup, int) or isinstance(warmup, bool) or warmup < 1:
        raise ValueError(f"warmup must be an int >= 1 (the first step compiles, untimed), got {warmup!r}")
    if bf16 not in (None, True, False):
        raise ValueError(f"bf16 must be None (measure where native), True or False, got {bf16!r}")
    if not (isinstance(lr, (int, float)) and not isinstance(lr, bool) and lr > 0):
        raise ValueError(f"lr must be a positive number, got {lr!r}")
    rungs = ladder_rungs(batch_size, large_batch_size)
    skip = ""
    if bf16 is None:
        kind = bf16_matmul_kind(measure=False)
        skip = "" if kind.kind == "native" else f"{kind.kind} bf16 kernels here: {kind.reason}"
    elif bf16 is False:
        skip = "bf16=False"
    if skip:                                                     # later rungs stay in float32
        rungs = [(name, replace(setup, bf16=False)) for name, setup in rungs]

    def make_model() -> nn.Module:
        torch.manual_seed(seed)
        return SmallCNN(width=width)

    images, labels = uint8_split(train=True)
    n_images = (steps + warmup) * large_batch_size               # one epoch covers every step of every rung
    images, labels = images[:n_images], labels[:n_images]
    with torch_threads(threads), quiet_compile_logs():
        used_threads = torch.get_num_threads()
        measured_setups = [(name, s) for name, s in rungs if not (skip and name == "+ bf16 autocast")]
        train = {name: _training_step(s, make_model, _batches(s, images, labels, seed), lr)
                 for name, s in measured_setups}
        best = {name: float("inf") for name in train}
        best_load = dict(best)
        first = {}
        for i in range(warmup + steps):
            for name, step in train.items():
                wall, cpu = time.perf_counter(), time.process_time()
                n, load_cpu = step()
                cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
                if i == 0:
                    first[name] = wall
                if i >= warmup:
                    best[name] = min(best[name], cpu / n)
                    best_load[name] = min(best_load[name], load_cpu / n)
    out = []
    for name, s in rungs:
        if name not in train:
            out.append(Rung(name, s, skipped=skip))
        else:
            out.append(Rung(name, s, 1.0 / best[name], compile_seconds=first[name] if s.compiled else None,
                            load_cpu_s_per_image=best_load[name]))
    return Ladder(tuple(out), used_threads, steps, warmup)


def format_ladder(ladder: Ladder) -> str:
    """The ladder as a table: images per CPU-second, ratio to the previous measured rung and to the naive one;
    measured figures left-aligned, skipped rungs with their reason below the table."""
    if not isinstance(ladder, Ladder):
        raise TypeError(f"format_ladder takes a Ladder (ptlab.speed_ladder.speed_ladder's result), "
                        f"got {type(ladder).__name__}")
    width = max(26, max(len(r.name) for r in ladder.rungs) + 2)
    lines = [f"{'rung':<{width}}{'images/CPU-s':<14}{'x previous':<12}x naive"]
    notes = []
    for r in ladder.rungs:
        if r.images_per_cpu_s is None:
            lines.append(f"{r.name:<{width}}skipped (below)")
            notes.append(f"{r.name} skipped: {r.skipped}")
            continue
        lines.append(f"{r.name:<{width}}{measured(r.images_per_cpu_s, 3):<14}{measured(ladder.ratio(r.name), 3):<12}"
                     f"{measured(ladder.to_naive(r.name), 3)}")
    compiled = [r for r in ladder.rungs if r.compile_seconds is not None]
    if compiled:
        notes.append(f"first step of the {len(compiled)} compiled rungs (compile + one step, wall time, not in the "
                     f"speeds): {measured_seconds(ladder.compile_seconds)}")
    return "\n".join([line.rstrip() for line in lines] + notes)
