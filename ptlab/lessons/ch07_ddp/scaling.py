"""Chapter 7's scaling measurement: one process against several on the same global batch, measured in turns."""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from ptlab.distributed import run_ranks
from ptlab.models import SmallCNN


def time_training(global_batch: int = 64, steps: int = 4, width: int = 16) -> dict[str, float]:
    """In each rank: wall and CPU seconds per DDP step, seconds per compute-only step and per all-reduce.

    A compute-only step runs under model.no_sync(): no gradient all-reduce, but its forward still broadcasts
    the BatchNorm buffers of SmallCNN, as the first forward and every forward after one run with gradients
    outside no_sync() do.
    """
    world = dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(SmallCNN(width=width))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(dist.get_rank())
    X = torch.randn(global_batch // world, 3, 32, 32, generator=g)     # (B/world, 3, 32, 32)
    y = torch.randint(0, 10, (global_batch // world,), generator=g)

    def step(sync: bool) -> None:
        with contextlib.nullcontext() if sync else model.no_sync():
            loss = nn.functional.cross_entropy(model(X), y)
            optimizer.zero_grad()
            loss.backward()                                # with sync: the gradients are all-reduced here
        optimizer.step()

    grads = torch.zeros(sum(p.numel() for p in model.parameters()))   # (P,) all gradients in one buffer
    timings: dict[str, list[float]] = {"step": [], "step cpu": [], "compute": [], "allreduce": []}
    for i in range(steps + 1):                             # the first round warms up, untimed
        for name, run in (("step", lambda: step(True)), ("compute", lambda: step(False)),
                          ("allreduce", lambda: dist.all_reduce(grads))):
            dist.barrier()
            start, cpu = time.perf_counter(), time.process_time()
            run()
            if i:
                timings[name].append(time.perf_counter() - start)
                if name == "step":
                    timings["step cpu"].append(time.process_time() - cpu)
    result = {name: sorted(values)[len(values) // 2] for name, values in timings.items()}
    result["gradient MB"] = grads.numel() * 4 / 1e6
    return result


@dataclass
class ScalingResult:
    """1 process against `world_size` processes on the same global batch, 1 thread each, measured in turns."""

    one: dict[str, float]
    many: dict[str, float]
    world_size: int
    global_batch: int

    @property
    def speedup(self) -> float:
        """Wall time per step of 1 process over that of the multi-process run (> 1: the ranks were faster)."""
        return self.one["step"] / self.many["step"]

    @property
    def cpu_ratio(self) -> float:
        """CPU seconds per global batch, all ranks together, over those of 1 process (>= 1: no work saved)."""
        return self.many["step cpu all"] / self.one["step cpu all"]

    def estimate(self, devices: int) -> float:
        """ESTIMATED speed-up on `devices` devices each as fast as one rank here: compute / devices + all-reduce.

        Compute per image comes from the measured no_sync steps; the all-reduce time is scaled from the
        measured one by the ring's 2(k-1)/k of the gradient bytes; no overlap of the two is assumed.
        """
        if not isinstance(devices, int) or devices < 1:
            raise ValueError(f"devices must be a positive int, got {devices!r}")
        per_image = self.many["compute"] / (self.global_batch / self.world_size)
        ring = lambda k: 2 * (k - 1) / k                   # noqa: E731 - bytes each device sends per gradient byte
        allreduce = self.many["allreduce"] / ring(self.world_size) * ring(devices) if devices > 1 else 0.0
        single = per_image * self.global_batch
        return single / (single / devices + allreduce)


def measure_scaling(world_size: int = 2, global_batch: int = 64, steps: int = 4, rounds: int = 2,
                    timeout_s: float = 120.0) -> ScalingResult:
    """Time 1 process on the whole batch against `world_size` processes on a slice each, in alternating turns."""
    runs: dict[int, list[dict[str, float]]] = {1: [], world_size: []}
    for _ in range(rounds):
        for size in (1, world_size):
            run = run_ranks(time_training, size, timeout_s=timeout_s, global_batch=global_batch, steps=steps)
            if not run.ok:
                raise RuntimeError(f"timing run with {size} processes failed: {run.error}")
            timings = dict(run.results[0])              # rank 0's times, and the CPU time of every rank
            timings["step cpu all"] = sum(r["step cpu"] for r in run.results)
            runs[size].append(timings)
    best = {size: {k: min(r[k] for r in rs) for k in rs[0]} for size, rs in runs.items()}
    return ScalingResult(best[1], best[world_size], world_size, global_batch)
