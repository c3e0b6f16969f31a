"""Datasets, collate functions and worker helpers for chapter 3, in a module so DataLoader workers can import them.

A class defined in a notebook lives in `__main__`; a worker started with the spawn method
(the default on macOS and Windows) cannot import it. Everything a worker needs lives here.
"""
from __future__ import annotations

import contextlib
import multiprocessing
import os
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, default_collate, get_worker_info

from .data import normalize_uint8


# ---------------------------------------------------------------- CPU cost and CPU limits
def burn_cpu(units: int) -> int:
    """A fixed amount of pure-Python CPU work (about 1 µs per unit); stands in for decoding a file."""
    if not isinstance(units, int) or units < 0:
        raise ValueError(f"units must be an int >= 0, got {units!r}")
    total = 0
    for i in range(units * 12):
        total = (total + i * i) % 1_000_003
    return total


def usable_cpus() -> int:
    """CPU cores this process may run on (its affinity where the OS reports it)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


@contextlib.contextmanager
def limited_cpus(count: int) -> Iterator[int]:
    """Run the block (and workers forked in it) on at most `count` cores where the OS allows; yields the count."""
    if not isinstance(count, int) or count < 1:
        raise ValueError(f"count must be an int >= 1, got {count!r}")
    if not hasattr(os, "sched_setaffinity"):  # macOS, Windows: no affinity API, run unrestricted
        yield usable_cpus()
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, sorted(before)[:count])
    try:
        yield len(os.sched_getaffinity(0))
    finally:
        os.sched_setaffinity(0, before)


# ---------------------------------------------------------------- datasets
class CostlySamples(Dataset):
    """Wraps a dataset and spends `work` units of CPU per sample, like decoding an image file."""

    def __init__(self, base: Dataset, work: int = 1000) -> None:
        if not isinstance(work, int) or work < 0:
            raise ValueError(f"work must be an int >= 0, got {work!r}")
        self.base, self.work = base, work

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, index: int) -> Any:
        burn_cpu(self.work)
        return self.base[index]


class SquaresDataset(Dataset):
    """Sample i is i * i; defined in a module, so workers started with spawn can import it."""

    def __init__(self, n: int) -> None:
        if not isinstance(n, int) or n < 0:
            raise ValueError(f"n must be an int >= 0, got {n!r}")
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        return index * index


class SampleRaisesAt(Dataset):
    """Sample i is i, except sample `bad_index`, which raises ValueError like a file that cannot be parsed.

    The message does not name the index, like most decoding errors: finding the sample is the caller's job.
    """

    def __init__(self, n: int, bad_index: int) -> None:
        if not 0 <= bad_index < n:
            raise ValueError(f"bad_index must be in [0, {n}), got {bad_index!r}")
        self.n, self.bad_index = n, bad_index

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> torch.Tensor:
        if index == self.bad_index:
            raise ValueError("cannot parse the label file")
        return torch.tensor(index)


class VariableLengthSequences(Dataset):
    """Token sequences of random length in [min_len, max_len] and a label: samples that cannot be stacked."""

    def __init__(self, n: int = 64, min_len: int = 3, max_len: int = 12, seed: int = 0) -> None:
        if not 1 <= min_len <= max_len:
            raise ValueError(f"need 1 <= min_len <= max_len, got min_len={min_len}, max_len={max_len}")
        rng = np.random.default_rng(seed)
        lengths = rng.integers(min_len, max_len + 1, size=n)
        self.sequences = [torch.from_numpy(rng.integers(1, 100, size=int(k))) for k in lengths]  # each (L,)
        self.labels = torch.from_numpy(rng.integers(0, 2, size=n))                               # (n,)

    def __len__(self) -> int:
        return len(self.sequences)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.sequences[index], self.labels[index]


class AugmentWithNumpyRng(Dataset):
    """Each sample draws a random "augmentation" (a crop offset) from a numpy Generator made in __init__."""

    def __init__(self, n: int = 8, seed: int = 0) -> None:
        self.n = n
        self.rng = np.random.default_rng(seed)  # copied into every worker, in the same state

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        return int(self.rng.integers(0, 1_000_000))  # the crop offset this sample gets


class AugmentWithTorchRng(AugmentWithNumpyRng):
    """The same draw from torch's global RNG, which DataLoader seeds per worker and per epoch."""

    def __getitem__(self, index: int) -> int:
        return int(torch.randint(0, 1_000_000, ()).item())


def seed_worker_numpy_rng(worker_id: int) -> None:
    """worker_init_fn: give the worker's copy of dataset.rng its own seed (differs per worker and per epoch)."""
    info = get_worker_info()
    if info is None:
        raise RuntimeError("seed_worker_numpy_rng is a worker_init_fn: pass it to DataLoader(worker_init_fn=...)")
    if not hasattr(info.dataset, "rng"):
        raise AttributeError(f"seed_worker_numpy_rng expected the dataset to have an `rng` attribute; "
                             f"{type(info.dataset).__name__} has none")
    info.dataset.rng = np.random.default_rng(info.seed)  # info.seed = base_seed + worker_id, new each epoch


class ChunkedValues(Dataset):
    """`values` (a Python list or a numpy array) served in chunks; each sample is the sum of one chunk."""

    def __init__(self, values: Sequence[float] | np.ndarray, chunk: int = 20_000) -> None:
        if len(values) < chunk:
            raise ValueError(f"values must hold at least one chunk ({chunk}), got {len(values)}")
        self.values, self.chunk = values, chunk

    def __len__(self) -> int:
        return len(self.values) // self.chunk

    def __getitem__(self, index: int) -> float:
        part = self.values[index * self.chunk:(index + 1) * self.chunk]
        return float(sum(part)) if isinstance(part, list) else float(part.sum())


class CountingDataset(Dataset):
    """Counts every __getitem__ call, across worker processes, in a shared integer.

    `context` is the start method of the shared integer's lock: None is the platform's default, as for DataLoader.
    """

    def __init__(self, n: int, context: str | None = None) -> None:
        self.n = n
        self.loaded = multiprocessing.get_context(context).Value("i", 0)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> torch.Tensor:
        with self.loaded.get_lock():
            self.loaded.value += 1
        return torch.tensor(index)


# ---------------------------------------------------------------- streams (IterableDataset) and worker seeds
class NumberStream(IterableDataset):
    """A stream of the numbers 0 .. n-1, like lines read from a file; every iterator starts the stream anew.

    With num_workers=k the DataLoader runs k copies of __iter__, one per worker: each yields the whole stream.
    """

    def __init__(self, n: int) -> None:
        if not isinstance(n, int) or n < 0:
            raise ValueError(f"n must be an int >= 0, got {n!r}")
        self.n = n

    def _indices(self) -> range:
        return range(self.n)

    def __iter__(self) -> Iterator[torch.Tensor]:
        for i in self._indices():
            yield torch.tensor(i)


class ShardedNumberStream(NumberStream):
    """The same stream, sharded: worker w of k yields items w, w + k, w + 2k, ... (all of them without workers)."""

    def _indices(self) -> range:
        info = get_worker_info()                           # None in the main process
        if info is None:
            return range(self.n)
        return range(info.id, self.n, info.num_workers)    # each worker its own share, together the whole stream


class WorkerSeeds(Dataset):
    """Sample i is (i, worker id, torch.initial_seed() in that worker): what seed each worker's torch RNG got."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> tuple[int, int, int]:
        info = get_worker_info()
        return index, (-1 if info is None else info.id), torch.initial_seed()


def seed_numpy_from_torch(worker_id: int) -> None:
    """worker_init_fn: seed numpy's global RNG and Python's random from the worker's torch seed.

    torch.initial_seed() in a worker is the DataLoader's base seed + worker id, and the base seed is drawn from
    the DataLoader's `generator`: one seeded generator makes every worker's randomness repeatable.
    """
    import random

    seed = torch.initial_seed() % 2**32
    np.random.seed(seed)
    random.seed(seed)


# ---------------------------------------------------------------- memory of worker processes
def private_mib(pid: int) -> float:
    """Private (unshared) memory of one process in MiB: the pages a forked worker has made its own."""
    import psutil

    return psutil.Process(pid).memory_full_info().uss / 2**20


def child_pids(exclude: Iterable[int] = ()) -> list[int]:
    """Process ids of this process's live children, leaving out `exclude` (say, those that existed before)."""
    import psutil

    skip = set(exclude)
    return [p.pid for p in psutil.Process().children() if p.is_running() and p.pid not in skip]


# ---------------------------------------------------------------- collation and batch transforms
def pad_collate(batch: list[tuple[torch.Tensor, Any]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pad (L_i,) sequences with 0 to (B, L_max); return (padded, lengths (B,), labels (B,))."""
    if not batch:
        raise ValueError("pad_collate got an empty batch")
    sequences, labels = zip(*batch)
    lengths = torch.tensor([len(s) for s in sequences])
    padded = torch.nn.utils.rnn.pad_sequence(list(sequences), batch_first=True, padding_value=0)  # (B, L_max)
    return padded, lengths, default_collate(list(labels))


def skip_none_collate(batch: list[Any]) -> Any:
    """default_collate after dropping samples that are None (unreadable files); None if nothing is left."""
    kept = [sample for sample in batch if sample is not None]
    return default_collate(kept) if kept else None


normalize_batch = normalize_uint8  # chapter 3's name for it: uint8 (B, C, H, W) to normalised float32, one op per batch


# ---------------------------------------------------------------- image files, readable or not
def corrupt_files(paths: Sequence[Path], keep_bytes: int = 200) -> None:
    """Truncate image files to their first `keep_bytes` bytes, as an interrupted copy would."""
    for path in paths:
        data = Path(path).read_bytes()
        Path(path).write_bytes(data[:keep_bytes])


def is_readable_image(path: str | Path) -> bool:
    """True when PIL can open and fully decode the file."""
    from PIL import Image

    try:
        with Image.open(path) as img:
            img.load()
        return True
    except (OSError, SyntaxError, ValueError):
        return False


class DummyOnUnreadable(Dataset):
    """The common advice, kept to show it fails: an unreadable file becomes (zeros, -1)."""

    def __init__(self, base: Dataset, dummy_shape: tuple[int, ...] = (3, 32, 32)) -> None:
        self.base, self.dummy_shape = base, dummy_shape

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        try:
            return self.base[index]
        except OSError:
            return torch.zeros(self.dummy_shape, dtype=torch.uint8), -1


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
    """Give an ImageFolder the label order you intend instead of the alphabetical one it picked."""
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
