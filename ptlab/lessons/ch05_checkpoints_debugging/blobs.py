"""Chapter 5's small task: three Gaussian blobs in 2-D that a small MLP learns in a fraction of a second.

The chapter's CNN barely leaves chance in the few epochs a notebook cell can afford, so the
demonstrations that need runs which really differ (early stopping, the run log, the learning-rate
range test) and the chapter's pitfalls use this task instead: 3 classes (chance is 1/3), 2 features.
"""
from __future__ import annotations

import torch
from torch import nn


def blobs(seed: int = 0, n: int = 600) -> tuple[torch.Tensor, torch.Tensor]:
    """Three Gaussian blobs: X (n, 2) float32, y (n,) int64 in {0, 1, 2}, classes in turn."""
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % 3
    centres = torch.tensor([[0.0, 2.0], [2.0, -1.0], [-2.0, -1.0]])
    return torch.randn(n, 2, generator=g) * 0.7 + centres[y], y


def blob_mlp(hidden: int = 64) -> nn.Sequential:
    """An MLP for the blobs: 2 -> hidden -> hidden -> 3, with ReLU."""
    return nn.Sequential(nn.Linear(2, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 3))


def noisy_blobs(n_train: int = 40, n_wrong: int = 12, n: int = 640) -> tuple[torch.Tensor, torch.Tensor]:
    """blobs(n=n) with `n_wrong` of the first `n_train` labels (the training points) moved to the next class.

    The points after the first n_train keep their true labels: split them into validation and held-out data.
    """
    X, y = blobs(n=n)
    y = y.clone()
    wrong = torch.randperm(n_train, generator=torch.Generator().manual_seed(3))[:n_wrong]
    y[wrong] = (y[wrong] + 1) % 3
    return X, y
