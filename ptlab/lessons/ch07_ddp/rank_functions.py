"""Chapter 7's rank functions: what each of the chapter's gloo processes runs (started by ptlab.distributed.run_ranks).

They live in a module because every rank is a new process that imports the function it runs by name.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DistributedSampler

from ptlab.checkpoint import atomic_save


def rank_mlp(batchnorm: bool = False, hidden: int = 32, activation: type[nn.Module] = nn.Tanh) -> nn.Sequential:
    """(B, 8) -> (B, 3), the same initial weights on every rank (seeded here)."""
    torch.manual_seed(0)
    middle = [nn.BatchNorm1d(hidden)] if batchnorm else []
    return nn.Sequential(nn.Linear(8, hidden), *middle, activation(), nn.Linear(hidden, 3))


class WithAuxHead(nn.Module):
    """An MLP with a second head, `aux`, that forward calls only while `use_aux` is True (False by default)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = rank_mlp(hidden=16, activation=nn.ReLU)   # (B, 8) -> (B, 3), the same weights on every rank
        self.aux = nn.Linear(3, 1)                         # a parameter no forward uses unless use_aux is set
        self.use_aux = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.body(x)                                 # (B, 3)
        return out + self.aux(out) if self.use_aux else out   # (B, 1) broadcast over the 3 logits


def _data(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 8, generator=g), torch.randint(0, 3, (n,), generator=g)


def checksum(model: nn.Module) -> tuple[float, str]:
    """Sum of every parameter (float64) and a sha256 of their bytes: equal hashes mean identical bits."""
    tensors = [p.detach().cpu().contiguous() for p in model.parameters()]
    digest = hashlib.sha256(b"".join(t.numpy().tobytes() for t in tensors)).hexdigest()
    return float(sum(t.double().sum() for t in tensors)), digest[:16]


def describe_rank() -> dict[str, Any]:
    """Who this rank is: rank, world size, backend, LOCAL_RANK and its thread count."""
    return {"rank": dist.get_rank(), "world_size": dist.get_world_size(), "backend": dist.get_backend(),
            "local_rank": int(os.environ["LOCAL_RANK"]), "threads": torch.get_num_threads()}


def train_and_gather_checksums(steps: int = 5, wrap: bool = True) -> list[tuple[float, str]]:
    """Train the same MLP on this rank's own data for `steps`; return every rank's checksum (all_gather_object).

    wrap=True trains it inside DistributedDataParallel (gradients all-reduced); wrap=False trains it alone.
    """
    model = DDP(rank_mlp()) if wrap else rank_mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    X, y = _data(64, seed=100 + dist.get_rank())           # each rank its own batches
    for i in range(steps):
        loss = nn.functional.cross_entropy(model(X[i * 8:(i + 1) * 8]), y[i * 8:(i + 1) * 8])
        optimizer.zero_grad()
        loss.backward()                                    # DDP: gradients averaged over the ranks here
        optimizer.step()
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, checksum(model))
    return gathered


def sampler_shards(n: int = 11, shuffle: bool = False, epochs: int = 1) -> dict[str, list]:
    """This rank's DistributedSampler indices for a dataset of n items, padded (default) and with drop_last."""

    shards = {}
    for drop_last in (False, True):
        sampler = DistributedSampler(range(n), shuffle=shuffle, drop_last=drop_last, seed=0)
        orders = []
        for epoch in range(epochs):
            sampler.set_epoch(epoch)
            orders.append(list(sampler))
        shards["drop_last" if drop_last else "padded"] = orders
    return shards


def split_batch_vs_one_process(global_batch: int = 16, steps: int = 3, batchnorm: bool = False,
                               reduction: str = "mean", ddp_lr_scale: float = 1.0) -> float | None:
    """DDP with each rank on its slice of the batch, against one model on the whole batch (computed on rank 0).

    Returns, on rank 0, the largest |difference| between the two models' weights after `steps` SGD steps.
    `reduction` is the loss's reduction over the batch ("mean" or "sum"); the DDP model's learning rate is
    `ddp_lr_scale` times the single model's.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    if global_batch % world:
        raise ValueError(f"global_batch {global_batch} must divide by the world size {world}")
    per_rank = global_batch // world
    ddp = DDP(rank_mlp(batchnorm))
    single = rank_mlp(batchnorm)                               # what one process with the whole batch trains
    lr = 0.5 if reduction == "mean" else 0.5 / global_batch   # a sum is global_batch times a mean: same steps
    opt_ddp = torch.optim.SGD(ddp.parameters(), lr=lr * ddp_lr_scale)
    opt_single = torch.optim.SGD(single.parameters(), lr=lr)
    X, y = _data(global_batch * steps, seed=7)             # the same data on every rank
    for step in range(steps):
        Xb, yb = X[step * global_batch:(step + 1) * global_batch], y[step * global_batch:(step + 1) * global_batch]
        mine = slice(rank * per_rank, (rank + 1) * per_rank)  # (B/world,) rows of this rank
        opt_ddp.zero_grad()
        nn.functional.cross_entropy(ddp(Xb[mine]), yb[mine], reduction=reduction).backward()
        opt_ddp.step()
        opt_single.zero_grad()
        nn.functional.cross_entropy(single(Xb), yb, reduction=reduction).backward()
        opt_single.step()
    if rank != 0:
        return None
    return max((a - b).abs().max().item() for a, b in zip(ddp.module.parameters(), single.parameters()))


def mean_over_ranks(n: int = 11) -> dict[str, float]:
    """The mean of n per-example values (0, 1, ..., n-1: stand-ins for losses) computed across the ranks.

    Each rank sums the values of its examples and counts them; one all_reduce adds the sums and the counts
    of every rank. "padded" uses DistributedSampler's shards (the default, padded to equal counts), "exact"
    plain slices rank, rank + world, ... in which every example appears exactly once.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    values = torch.arange(n, dtype=torch.float64)          # (n,) one value per example
    shards = {"padded": list(DistributedSampler(range(n), shuffle=False)), "exact": list(range(rank, n, world))}
    means = {}
    for name, shard in shards.items():
        totals = torch.tensor([values[shard].sum().item(), float(len(shard))], dtype=torch.float64)
        dist.all_reduce(totals)                            # (sum, count) over every rank
        means[name] = (totals[0] / totals[1]).item()
    return means


def save_on_rank_zero(folder: str) -> dict[str, Any]:
    """Train a step, save model.module.state_dict() on rank 0 only, barrier, then every rank loads it and compares."""

    rank = dist.get_rank()
    model = DDP(rank_mlp())
    X, y = _data(16, seed=rank)
    nn.functional.cross_entropy(model(X), y).backward()
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    path = Path(folder, "model.pt")
    if rank == 0:                                          # one writer
        atomic_save(model.module.state_dict(), path)      # plain keys: no 'module.' prefix
        with open(Path(folder, "train.log"), "a") as log:
            log.write(f"saved {path.name}\n")
    dist.barrier()                                         # nobody reads before rank 0 has written
    plain = rank_mlp()
    plain.load_state_dict(torch.load(path, weights_only=True))   # strict=True
    same = all(torch.equal(a, b) for a, b in zip(plain.parameters(), model.module.parameters()))
    return {"rank": rank, "first key": next(iter(plain.state_dict())), "loaded equals my weights": same}


def fail_on_rank(fail_rank: int = 1, fail_at_step: int = 2, steps: int = 5) -> int:
    """DDP training in which `fail_rank` raises at `fail_at_step`; returns the steps this rank completed."""
    model = DDP(rank_mlp())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    X, y = _data(8 * steps, seed=dist.get_rank())
    for step in range(steps):
        if dist.get_rank() == fail_rank and step == fail_at_step:
            raise ValueError(f"rank {fail_rank}: corrupt batch at step {step}")
        loss = nn.functional.cross_entropy(model(X[step * 8:(step + 1) * 8]), y[step * 8:(step + 1) * 8])
        optimizer.zero_grad()
        loss.backward()                                    # the other rank waits here for the failed one
        optimizer.step()
    return steps


def extra_forward_on_rank_zero(batchnorm: bool, grad: bool = True, steps: int = 4,
                               after: tuple[int, ...] | None = None) -> int:
    """DDP training in which rank 0 alone runs one more forward through the DDP model after some steps.

    `after` lists the steps (0-based) after which it does; None means after every step. Returns the steps
    completed. Whether the job survives depends on the collectives DDP issues in forward: a broadcast of
    rank 0's buffers (BatchNorm's statistics) after a forward with gradients, and once per run the order of
    the gradient buckets, in the first forward with gradients after the first backward.
    """
    model = DDP(rank_mlp(batchnorm))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    X, y = _data(8 * steps, seed=dist.get_rank())
    for step in range(steps):
        loss = nn.functional.cross_entropy(model(X[step * 8:(step + 1) * 8]), y[step * 8:(step + 1) * 8])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if dist.get_rank() == 0 and (after is None or step in after):
            with contextlib.nullcontext() if grad else torch.no_grad():
                model(X[:2])                               # rank 0 only: an extra forward through DDP
    dist.barrier()
    return steps


def paired_validation_set(pairs: int = 32, noise: float = 4.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(2 * pairs, 8) inputs and their labels in 0..2: each clean example is followed by a noisy copy of it.

    A clean example is 3 times its class's one-hot vector plus a little noise; its copy adds Gaussian noise of
    standard deviation `noise`. With shuffle=False, DistributedSampler deals the clean ones (even indices) to
    rank 0 and the noisy copies to rank 1.
    """
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 3, (pairs,), generator=g)                              # (pairs,)
    clean = 3 * nn.functional.one_hot(y, 8).float() + 0.3 * torch.randn(pairs, 8, generator=g)   # (pairs, 8)
    noisy = clean + noise * torch.randn(pairs, 8, generator=g)
    return torch.stack([clean, noisy], dim=1).reshape(-1, 8), y.repeat_interleave(2)   # clean 0, noisy 0, clean 1, ...


def prototype_classifier() -> nn.Linear:
    """(B, 8) -> (B, 3) logits: class c scores feature c (weights set by hand; no random number is drawn)."""
    model = nn.utils.skip_init(nn.Linear, 8, 3)           # no random initialisation to overwrite
    with torch.no_grad():
        model.weight.copy_(torch.eye(3, 8))
        model.bias.zero_()
    return model


def counted_allreduce(calls: list, bucket):
    """A DDP communication hook: record (bucket index, floats in it), then all-reduce it as DDP does by default.

    `bucket` is a dist.GradBucket and the result a torch.futures.Future[torch.Tensor], left unannotated:
    register_comm_hook refuses annotations other than those very objects, and this module's are strings.
    """
    calls.append((bucket.index(), bucket.buffer().numel()))
    return allreduce_hook(None, bucket)                    # the mean over the ranks, as without a hook


def seeded_ranks(seed: int = 0) -> dict[str, Any]:
    """Each rank builds the MLP from its own seed, wraps it in DDP, then draws dropout masks from two seedings."""
    rank = dist.get_rank()
    torch.manual_seed(seed + rank)                     # a different init on each rank, on purpose
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 3))
    before = checksum(model)
    ddp = DDP(model)                                   # broadcasts rank 0's parameters to every rank
    after = checksum(ddp.module)
    masks = {}
    for name, rank_seed in (("seed", seed), ("seed + rank", seed + rank)):
        torch.manual_seed(rank_seed)
        masks[name] = (nn.functional.dropout(torch.ones(16), p=0.5) > 0).int().tolist()   # which units survive
    return {"before DDP": before, "after DDP": after, "masks": masks}


def late_rank(late_rank: int = 1, barrier_timeout_s: float = 1.0) -> tuple[str, float]:
    """Every rank but `late_rank` enters monitored_barrier with `barrier_timeout_s`; `late_rank` sleeps twice
    that and never enters the barrier. Returns (the first line of the barrier's error, or a note; the seconds
    this rank waited)."""
    import datetime
    import time

    start = time.perf_counter()
    if dist.get_rank() != late_rank:
        try:
            dist.monitored_barrier(timeout=datetime.timedelta(seconds=barrier_timeout_s))
        except RuntimeError as err:
            return str(err).splitlines()[0], time.perf_counter() - start
        return "no error", time.perf_counter() - start
    time.sleep(2 * barrier_timeout_s)                    # late: the barrier gives up first
    return "arrived late", time.perf_counter() - start


def train_with_unused_head(static_graph: bool = True, steps: int = 3,
                           aux_steps: tuple[int, ...] = ()) -> dict[str, Any]:
    """Train WithAuxHead under DDP(static_graph=True), or DDP(find_unused_parameters=True) if static_graph is False.

    Forward uses the aux head at the steps (1-based) listed in `aux_steps` only. Returns the step at which the
    first RuntimeError was raised (0: none), in "forward" or "backward", its first line, the weights then, and
    for each step that completed the (bucket index, floats) of every bucket all-reduce (counted_allreduce).
    """
    options = {"static_graph": True} if static_graph else {"find_unused_parameters": True}
    model = DDP(WithAuxHead(), **options)
    calls: list = []                                       # (bucket index, floats) of every all-reduce, by step
    model.register_comm_hook(calls, counted_allreduce)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    per_step = []
    X, y = _data(8 * steps, seed=dist.get_rank())          # each rank its own batches
    step, phase, error = 0, "", "none"
    for i in range(steps):
        model.module.use_aux = i + 1 in aux_steps
        try:
            phase = "forward"
            loss = nn.functional.cross_entropy(model(X[i * 8:(i + 1) * 8]), y[i * 8:(i + 1) * 8])
            optimizer.zero_grad()
            phase = "backward"
            loss.backward()
        except RuntimeError as err:
            step, error = i + 1, str(err).splitlines()[0]
            break
        optimizer.step()
        per_step.append(calls[:])
        calls.clear()
    return {"step": step, "phase": phase if step else "", "error": error, "allreduces": per_step,
            "weights": torch.cat([p.detach().flatten() for p in model.parameters()])}


def stop_together(stop_rank: int = 1, stop_after: int = 2, steps: int = 4) -> dict[str, Any]:
    """DDP training in which rank `stop_rank` alone decides to stop after `stop_after` steps (an early-stopping rule
    on its own numbers, say). Before each step the ranks all_reduce that decision (MAX: if any rank stops, all do).
    Returns the steps this rank ran and its weights."""
    model = DDP(rank_mlp())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    X, y = _data(8 * steps, seed=dist.get_rank())
    done = 0
    for step in range(steps):
        stop = torch.tensor([float(dist.get_rank() == stop_rank and step == stop_after)])   # this rank's own call
        dist.all_reduce(stop, op=dist.ReduceOp.MAX)        # one decision for every rank
        if stop.item():
            break
        loss = nn.functional.cross_entropy(model(X[step * 8:(step + 1) * 8]), y[step * 8:(step + 1) * 8])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        done += 1
    return {"steps": done, "weights": torch.cat([p.detach().flatten() for p in model.parameters()])}


def sync_batchnorm_on_cpu() -> dict[str, str]:
    """Convert a small BatchNorm model to SyncBatchNorm on the CPU, then wrap it in DDP and run it in training
    mode; returns the first line of each error ("none" where nothing was raised)."""
    model = nn.SyncBatchNorm.convert_sync_batchnorm(
        nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Linear(16, 3)))
    errors = {}
    for name, attempt in (("DDP(model)", lambda: DDP(model)), ("forward", lambda: model.train()(torch.randn(4, 8)))):
        try:
            attempt()
            errors[name] = "none"
        except ValueError as err:
            errors[name] = f"ValueError: {str(err).splitlines()[0]}"
    return errors
