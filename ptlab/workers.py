"""Helpers that run inside DataLoader workers, for your own loaders: collate functions, worker seeding, unreadable
files.

They live in a module, not a notebook: a worker started with spawn (macOS, Windows) imports what it runs by module
name and cannot import a notebook's `__main__`. Introduced in chapter 3.
"""
from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch.utils.data import Dataset, default_collate, get_worker_info


def usable_cpus() -> int:
    """CPU cores this process may run on (its affinity where the OS reports it)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def seed_worker_numpy_rng(worker_id: int) -> None:
    """worker_init_fn: give the worker's copy of dataset.rng its own seed (differs per worker and per worker start).

    Workers start every epoch, or once with persistent_workers=True. A wrapper around the dataset must forward
    attribute reads and writes (check_loader's does); one that does not has no `rng` and gets an AttributeError.
    """
    info = get_worker_info()
    if info is None:
        raise RuntimeError("seed_worker_numpy_rng is a worker_init_fn: pass it to DataLoader(worker_init_fn=...)")
    if not hasattr(info.dataset, "rng"):
        raise AttributeError(f"seed_worker_numpy_rng expected the dataset to have an `rng` attribute; "
                             f"{type(info.dataset).__name__} has none")
    info.dataset.rng = np.random.default_rng(info.seed)  # info.seed = base_seed + worker_id, new at each start


def seed_numpy_from_torch(worker_id: int) -> None:
    """worker_init_fn: reseed numpy's global RNG and Python's random with torch.initial_seed() % 2**32.

    Rarely needed: DataLoader already seeds both in every worker it starts (random with base_seed + worker_id,
    numpy with a 128-bit seed hashed from base_seed and worker_id), and the base seed follows the loader's
    `generator`. This function replaces numpy's hashed seed by a 32-bit one: the pattern of PyTorch's
    reproducibility notes, needed before torch 1.9, which started seeding numpy in workers. What does need a
    worker_init_fn is randomness torch cannot see: a Generator stored on the dataset (seed_worker_numpy_rng)
    or another library's own RNG.
    """

    seed = torch.initial_seed() % 2**32
    np.random.seed(seed)
    random.seed(seed)


def pad_collate(batch: list[tuple[torch.Tensor, Any]],
                padding_value: float = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pad (L_i,) sequences with padding_value to (B, L_max); return (padded, lengths (B,), labels (B,)).

    To pass another padding_value as a collate_fn, use functools.partial(pad_collate, padding_value=-1): unlike a
    lambda, it can be pickled for workers started with spawn or forkserver."""
    if not batch:
        raise ValueError("pad_collate got an empty batch")
    sequences, labels = zip(*batch)
    lengths = torch.tensor([len(s) for s in sequences])
    padded = torch.nn.utils.rnn.pad_sequence(list(sequences), batch_first=True,
                                             padding_value=padding_value)                          # (B, L_max)
    return padded, lengths, default_collate(list(labels))


def skip_none_collate(batch: list[Any]) -> Any:
    """default_collate after dropping samples that are None (unreadable files); None if nothing is left."""
    kept = [sample for sample in batch if sample is not None]
    return default_collate(kept) if kept else None


def is_readable_image(path: str | Path) -> bool:
    """True when PIL can open and fully decode the file."""
    from PIL import Image

    try:
        with Image.open(path) as img:
            img.load()
        return True
    except (OSError, SyntaxError, ValueError):
        return False


class NoneOnUnreadable(Dataset):
    """An unreadable file becomes None, for skip_none_collate to drop; good samples are untouched."""

    def __init__(self, base: Dataset) -> None:
        self.base = base

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, index: int) -> Any:
        try:
            return self.base[index]
        except OSError:
            return None


def image_folder_skipping_unreadable(root: str | Path, transform: Callable | None = None,
                                     class_to_idx: dict[str, int] | None = None):
    """torchvision ImageFolder that drops unreadable files at index time; `.skipped` lists them relative to root."""
    from torchvision.datasets import ImageFolder

    root = Path(root)
    skipped: list[str] = []

    def keep(path: str) -> bool:
        ok = path.lower().endswith((".png", ".jpg", ".jpeg")) and is_readable_image(path)
        if not ok:
            skipped.append(str(Path(path).relative_to(root)))
        return ok

    folder = ImageFolder(str(root), transform=transform, is_valid_file=keep)
    if class_to_idx is not None:
        folder = relabel_image_folder(folder, class_to_idx)
    folder.skipped = sorted(skipped)
    return folder


def relabel_image_folder(folder, class_to_idx: dict[str, int]):
    """Give an ImageFolder the label order you intend instead of the sorted one it picked."""
    found = set(folder.class_to_idx)
    if set(class_to_idx) != found:
        raise ValueError(f"class_to_idx must name exactly the folder's classes {sorted(found)}, "
                         f"got {sorted(class_to_idx)}")
    by_old = {old: class_to_idx[name] for name, old in folder.class_to_idx.items()}
    folder.samples = [(path, by_old[label]) for path, label in folder.samples]
    folder.imgs = folder.samples
    folder.targets = [label for _, label in folder.samples]
    folder.class_to_idx = dict(class_to_idx)
    folder.classes = sorted(class_to_idx, key=class_to_idx.get)
    return folder
