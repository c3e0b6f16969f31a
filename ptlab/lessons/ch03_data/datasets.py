"""Chapter 3's datasets: each shows one behaviour of Dataset and DataLoader, in a module so workers can import them.

A class defined in a notebook lives in `__main__`; a worker started with the spawn method (the default on macOS and
Windows) cannot import it. Everything a worker of this chapter needs lives here or in ptlab.workers.
"""
from __future__ import annotations

import io
import multiprocessing
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info


def burn_cpu(units: int) -> int:
    """A fixed amount of pure-Python CPU work (about 1 µs per unit); stands in for decoding a file."""
    if not isinstance(units, int) or units < 0:
        raise ValueError(f"units must be an int >= 0, got {units!r}")
    total = 0
    for i in range(units * 12):
        total = (total + i * i) % 1_000_003
    return total


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
    """Sample i is (i, worker id, torch.initial_seed(), np.random.random()) in the process that loads it.

    The third is the seed the worker's torch RNG got; the fourth a draw from numpy's global RNG, which DataLoader
    seeds in each worker too (worker id -1: the main process).
    """

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> tuple[int, int, int, float]:
        info = get_worker_info()
        return index, (-1 if info is None else info.id), torch.initial_seed(), float(np.random.random())


def encode_png(images: np.ndarray) -> list[bytes]:
    """Each uint8 image (N, H, W, 3) as the bytes of a PNG file, encoded in memory with PIL."""
    from PIL import Image

    if not isinstance(images, np.ndarray) or images.dtype != np.uint8 or images.ndim != 4 or images.shape[-1] != 3:
        raise ValueError(f"images must be a uint8 array (N, H, W, 3), got "
                         f"{getattr(images, 'dtype', type(images).__name__)} of shape {getattr(images, 'shape', None)}")
    encoded = []
    for image in images:
        buffer = io.BytesIO()
        Image.fromarray(image).save(buffer, format="PNG")
        encoded.append(buffer.getvalue())
    return encoded


class DecodedOnAccess(Dataset):
    """Decodes an image file in every __getitem__, from a path (a file on disk) or from its bytes held in memory."""

    def __init__(self, sources: Sequence[str | Path | bytes], labels: Sequence[int]) -> None:
        if len(sources) != len(labels):
            raise ValueError(f"sources and labels must have the same length, got {len(sources)} and {len(labels)}")
        self.sources, self.labels = list(sources), list(labels)

    def __len__(self) -> int:
        return len(self.sources)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        from PIL import Image

        source = self.sources[index]
        with Image.open(io.BytesIO(source) if isinstance(source, bytes) else source) as image:
            pixels = np.array(image.convert("RGB"))                    # decode: (H, W, 3) uint8, writable
        return torch.from_numpy(pixels).permute(2, 0, 1), self.labels[index]


class Preloaded(Dataset):
    """Holds decoded uint8 images (N, H, W, 3); __getitem__ returns a (3, H, W) view, or a copy with copy=True."""

    def __init__(self, images: np.ndarray, labels: Sequence[int], copy: bool = False) -> None:
        if not isinstance(images, np.ndarray) or images.ndim != 4 or len(images) != len(labels):
            raise ValueError(f"images must be an array (N, H, W, C) with one label each, got shape "
                             f"{getattr(images, 'shape', None)} and {len(labels)} labels")
        self.images, self.labels, self.copy = np.array(images), list(labels), copy   # our own writable array

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        image = self.images[index].copy() if self.copy else self.images[index]   # the extra copy, or a view
        return torch.from_numpy(image).permute(2, 0, 1), self.labels[index]


class TorchThreads(Dataset):
    """Sample i is torch.get_num_threads() in the process that loads it."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        return torch.get_num_threads()


def corrupt_files(paths: Sequence[Path], keep_bytes: int = 200) -> None:
    """Truncate image files to their first `keep_bytes` bytes, as an interrupted copy would."""
    for path in paths:
        data = Path(path).read_bytes()
        Path(path).write_bytes(data[:keep_bytes])


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
