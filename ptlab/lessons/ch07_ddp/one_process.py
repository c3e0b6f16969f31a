"""Chapter 7's demonstrations that need no process group: what a rank's DataLoader workers are seeded with, and
what a halved gradient does to Adam and AdamW. They run in the notebook's own process.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from ptlab.lessons.ch07_ddp.rank_functions import _data, rank_mlp


class WorkerSeeds(Dataset):
    """n items; item i is the torch seed of the process that loads it (a DataLoader worker: base seed + worker id).

    A module-level class, so that workers started with spawn or forkserver can import it."""

    def __init__(self, n: int = 2) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return torch.initial_seed()


def rank_worker_seeds(seed: int, rank: int, loader_generator: bool, workers: int = 2) -> list[int]:
    """The seeds the `workers` DataLoader workers of rank `rank` get, after the rank seeded itself with seed + rank.

    loader_generator=True passes DataLoader(generator=torch.Generator().manual_seed(seed)), as chapters 3 and 5
    do for a reproducible order; False passes none, so the workers' base seed comes from the rank's global RNG.
    """
    torch.manual_seed(seed + rank)                         # what the reference script does on every rank
    generator = torch.Generator().manual_seed(seed) if loader_generator else None
    loader = DataLoader(WorkerSeeds(workers), batch_size=1, num_workers=workers, generator=generator)
    return [int(s) for s in loader]                        # one item per worker, in worker order


def halved_gradient_drift(optimizer: str, weight_decay: float = 0.0, steps: int = 5, lr: float = 1e-3
                          ) -> tuple[float, float]:
    """Train two copies of the same MLP, one on the loss and one on half of it (what a summed loss under DDP
    does to the gradient), with torch.optim.<optimizer>. Returns (largest |weight difference| between the two,
    largest change training made to a weight)."""
    X, y = _data(8 * steps, seed=3)
    first = rank_mlp()                                     # seeded: both copies start equal
    copies = [first, rank_mlp()]
    optimizers = [getattr(torch.optim, optimizer)(m.parameters(), lr=lr, weight_decay=weight_decay) for m in copies]
    start = torch.cat([p.detach().flatten() for p in first.parameters()])
    for step in range(steps):
        for scale, model, opt in zip((1.0, 0.5), copies, optimizers):
            opt.zero_grad()
            batch = slice(step * 8, (step + 1) * 8)
            (scale * nn.functional.cross_entropy(model(X[batch]), y[batch])).backward()
            opt.step()
    a, b = (torch.cat([p.detach().flatten() for p in m.parameters()]) for m in copies)
    return (a - b).abs().max().item(), (a - start).abs().max().item()
