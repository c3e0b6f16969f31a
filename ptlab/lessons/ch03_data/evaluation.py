"""Chapter 3: what shuffling an evaluation loader does to predictions matched back to files by position."""
from __future__ import annotations

from typing import Callable

import torch
from torch.utils.data import DataLoader, Dataset


def lookup_predictor(dataset: Dataset) -> Callable[[torch.Tensor], torch.Tensor]:
    """A stand-in model right on every image of `dataset`: it looks each image up among the dataset's own images."""
    images, labels = zip(*(dataset[i] for i in range(len(dataset))))
    memory = torch.stack(images).flatten(1).float()                      # (N, C*H*W)
    targets = torch.as_tensor(labels)                                    # (N,)

    def predict(batch: torch.Tensor) -> torch.Tensor:                    # (B, C, H, W) -> (B,) labels
        return targets[torch.cdist(batch.flatten(1).float(), memory).argmin(dim=1)]

    return predict


def score_in_loader_order(dataset: Dataset, predict: Callable[[torch.Tensor], torch.Tensor], shuffle: bool,
                          seed: int = 0, batch_size: int = 50) -> tuple[int, int]:
    """(predictions that match the labels the loader yields, files whose prediction in loader order belongs to
    another class), when the predictions are zipped with the dataset's own order as an evaluation script would."""
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, generator=torch.Generator().manual_seed(seed))
    predicted, labels = zip(*((predict(images), y) for images, y in loader))
    predicted, labels = torch.cat(predicted), torch.cat(labels)         # (N,), (N,) in loader order
    file_labels = torch.as_tensor([dataset[i][1] for i in range(len(dataset))])   # (N,) in the files' order
    return int((predicted == labels).sum()), int((predicted != file_labels).sum())
