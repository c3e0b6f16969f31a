"""Class imbalance, two remedies: CrossEntropyLoss's `weight=` and a WeightedRandomSampler.

The task is the fine-tuning section's: the four FINETUNE_CLASSES, on the features of the shipped pretrained backbone
(frozen, so
each image's 64 features are computed once), with one class cut down to a few training images (`imbalanced_indices`).
`train_head` trains a linear head on those features for a fixed number of batches, with no remedy, with class weights
in the loss, or with batches drawn by a WeightedRandomSampler; `head_batches` is the loader it draws from.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, RandomSampler, TensorDataset, WeightedRandomSampler

from ptlab.data import normalize_uint8, uint8_split
from ptlab.loop import eval_mode
from ptlab.models import SmallCNN
from ptlab.reference import FINETUNE_CLASSES, class_indices

REMEDIES = ("none", "weight", "sampler")


def imbalanced_indices(minority: str, keep: int) -> torch.Tensor:
    """Train-split indices of every FINETUNE_CLASSES image, except that only the first `keep` of `minority` stay."""
    if minority not in FINETUNE_CLASSES:
        raise ValueError(f"minority must be one of {FINETUNE_CLASSES}, got {minority!r}")
    if not isinstance(keep, int) or isinstance(keep, bool) or not 1 <= keep <= 800:
        raise ValueError(f"keep must be an int between 1 and 800, got {keep!r}")
    return torch.cat([class_indices([name])[:keep] if name == minority else class_indices([name])
                      for name in FINETUNE_CLASSES])


@torch.no_grad()
def backbone_features(backbone: SmallCNN, indices: torch.Tensor, train: bool = True,
                      batch_size: int = 500) -> torch.Tensor:
    """The pooled features (N, 4 * width) of the images at `indices` of one split, in eval mode (modes restored)."""
    images, _ = uint8_split(train)
    with eval_mode(backbone):
        return torch.cat([backbone.pool(backbone.features(normalize_uint8(images[indices[i:i + batch_size]])))
                          .flatten(1)
                          for i in range(0, len(indices), batch_size)])


def class_weights(labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """N / (num_classes * count of each class): 1 for every class when balanced, large for a rare class.

    Shape (num_classes,)."""
    counts = torch.bincount(labels, minlength=num_classes).float()
    if (counts == 0).any():
        raise ValueError(f"every class needs at least one label, got counts {counts.long().tolist()}")
    return len(labels) / (num_classes * counts)


def head_batches(features: torch.Tensor, labels: torch.Tensor, sampler: str, steps: int, batch_size: int = 64,
                 seed: int = 0) -> DataLoader:
    """`steps` batches drawn with replacement: uniformly over the images ("uniform") or each class equally often
    ("balanced")."""
    dataset = TensorDataset(features, labels)
    g = torch.Generator().manual_seed(seed)
    if sampler == "uniform":
        chosen = RandomSampler(dataset, replacement=True, num_samples=steps * batch_size, generator=g)
    elif sampler == "balanced":                         # weight of an image: 1 / (images of its class)
        per_image = (1.0 / torch.bincount(labels).float())[labels]
        chosen = WeightedRandomSampler(per_image, num_samples=steps * batch_size, replacement=True, generator=g)
    else:
        raise ValueError(f"sampler must be 'uniform' or 'balanced', got {sampler!r}")
    return DataLoader(dataset, batch_size=batch_size, sampler=chosen)


def train_head(features: torch.Tensor, labels: torch.Tensor, num_classes: int, remedy: str = "none", steps: int = 300,
               lr: float = 3e-3, seed: int = 0) -> nn.Linear:
    """A linear head trained with AdamW on (features, labels) for `steps` batches of 64, with one remedy of REMEDIES."""
    if remedy not in REMEDIES:
        raise ValueError(f"remedy must be one of {REMEDIES}, got {remedy!r}")
    torch.manual_seed(seed)
    head = nn.Linear(features.shape[1], num_classes)
    optimizer = torch.optim.AdamW(head.parameters(), lr=lr)
    weight = class_weights(labels, num_classes) if remedy == "weight" else None      # rescales each sample's loss
    batches = head_batches(features, labels, "balanced" if remedy == "sampler" else "uniform", steps, seed=seed)
    for X, y in batches:
        loss = F.cross_entropy(head(X), y, weight=weight)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return head
