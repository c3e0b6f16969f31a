"""The embedded dataset: CIFAR-10-shaped synthetic shapes, made by a deterministic numpy generator (ptlab.shapes).

Ten classes of 32x32 RGB glyphs on textured, cluttered, noisy backgrounds. The arrays live in one file,
``data/ptlab_shapes_v1.npz``, checked by sha256 on first load; this module loads, transforms and augments them.
"""
from __future__ import annotations

import functools
import hashlib
import os
import zipfile
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterable, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from .core import atomic_write
from .shapes import CLASSES, generate_dataset

DATA_DIR_ENV = "PTLAB_DATA_DIR"


def _data_dir() -> Path:
    """Where the dataset file lives: $PTLAB_DATA_DIR, else the checkout's data/, else ~/.cache/ptlab/data.

    An installed wheel has no data/ beside the package; there the generator rebuilds the identical
    file into the cache folder (`python -m ptlab data --rebuild`), or PTLAB_DATA_DIR points at a copy.
    """
    if os.environ.get(DATA_DIR_ENV):
        return Path(os.environ[DATA_DIR_ENV]).expanduser()
    checkout = Path(__file__).resolve().parent.parent / "data"
    if checkout.is_dir():
        return checkout
    return Path.home() / ".cache" / "ptlab" / "data"


DATA_DIR = _data_dir()  # read once, on import
DATASET_FILE = DATA_DIR / "ptlab_shapes_v1.npz"
DATASET_SHA256 = "6a6b6dcbd0e01e34fc021fc48f009607737ef24ea5b867ca0066a749bc29523a"
# Per-channel mean and std of the train split, 0-1 scale (tests/test_data.py checks them).
MEAN: tuple[float, float, float] = (0.4993, 0.5006, 0.4981)
STD: tuple[float, float, float] = (0.2602, 0.2598, 0.2614)

DATASET_ENV = "PTLAB_DATASET"
DATA_ROOT_ENV = "PTLAB_DATA_ROOT"
DATASET_NAMES = ("embedded", "cifar10")
_FIX_HINT = ("rebuild it with `.venv/bin/python -m ptlab data --rebuild`: the generator writes the identical "
             "file in about 15 s (no git or network needed)")

def _write_npz(file: BinaryIO, arrays: dict[str, np.ndarray]) -> None:
    """np.savez_compressed, but byte-for-byte reproducible: fixed timestamps and attributes in the zip."""
    with zipfile.ZipFile(file, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for key, array in arrays.items():
            info = zipfile.ZipInfo(f"{key}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            info.create_system = 3                  # "unix" on every OS
            info.external_attr = 0o644 << 16
            with archive.open(info, "w", force_zip64=True) as f:
                np.lib.format.write_array(f, np.ascontiguousarray(array), allow_pickle=False)


def rebuild_dataset(path: str | Path | None = None) -> str:
    """Regenerate the dataset file from seed 0 and return its sha256 (equal to DATASET_SHA256)."""
    path = Path(path) if path is not None else DATASET_FILE
    arrays = generate_dataset(seed=0)
    atomic_write(path, lambda handle: _write_npz(handle, arrays))
    _load_file.cache_clear()
    uint8_split.cache_clear()
    return _sha256(path)


# ---------------------------------------------------------------- loading and checking the file
def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def verify_dataset(path: str | Path | None = None) -> str:
    """The sha256 of the dataset file, or DatasetError if it is missing, unreadable or changed."""
    path = Path(path) if path is not None else DATASET_FILE
    if not path.is_file():
        raise DatasetError(f"dataset file {path} is missing; {_FIX_HINT} (or set {DATA_DIR_ENV} to the folder "
                           "that holds it)")
    try:
        found = _sha256(path)
    except OSError as err:
        raise DatasetError(f"dataset file {path} cannot be read ({err}); {_FIX_HINT}") from err
    if found != DATASET_SHA256:
        raise DatasetError(f"dataset file {path} is corrupted or changed: sha256 {found[:12]}... "
                           f"but expected {DATASET_SHA256[:12]}...; {_FIX_HINT}")
    return found


class DatasetError(RuntimeError):
    """The embedded dataset file is missing, unreadable or not the file this ptlab version expects."""


@functools.lru_cache(maxsize=None)
def _load_file(path: Path) -> dict[str, np.ndarray]:
    verify_dataset(path)
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {key: npz[key] for key in ("train_images", "train_labels", "test_images", "test_labels")}
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as err:
        raise DatasetError(f"dataset file {path} cannot be read ({err}); {_FIX_HINT}") from err
    for array in arrays.values():
        array.setflags(write=False)  # shared by every caller in this process: keep it read-only
    return arrays


def load_arrays(train: bool = True, path: str | Path | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Images (N, 32, 32, 3) uint8 and labels (N,) int64 of one split, verified once, cached per process."""
    path = Path(path).resolve() if path is not None else DATASET_FILE
    arrays = _load_file(path)
    split = "train" if train else "test"
    return arrays[f"{split}_images"], arrays[f"{split}_labels"]


class EmbeddedImages(Dataset):
    """The embedded dataset in the shape of torchvision.datasets.CIFAR10, yielding uint8 (3, 32, 32) tensors."""

    def __init__(self, train: bool = True, transform: Callable | None = None,
                 target_transform: Callable | None = None, path: str | Path | None = None) -> None:
        self.train = bool(train)
        self.transform = transform
        self.target_transform = target_transform
        images, labels = load_arrays(self.train, path)
        self.data: np.ndarray = images                                         # (N, 32, 32, 3) uint8, like CIFAR10
        self.targets: list[int] = labels.tolist()
        self.classes: list[str] = list(CLASSES)
        self.class_to_idx: dict[str, int] = {name: i for i, name in enumerate(CLASSES)}
        self._images = to_nchw(images)                                         # (N, 3, 32, 32) uint8

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        image, target = self._images[index], self.targets[index]
        if self.transform is not None:
            image = self.transform(image)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return image, target

    def __repr__(self) -> str:
        lines = [f"Dataset {type(self).__name__}", f"    Number of datapoints: {len(self)}",
                 f"    Split: {'Train' if self.train else 'Test'}", f"    Classes: {', '.join(self.classes)}"]
        if self.transform is not None:
            lines.append("    Transform: " + repr(self.transform).replace("\n", "\n    "))
        if self.target_transform is not None:
            lines.append("    Target transform: " + repr(self.target_transform).replace("\n", "\n    "))
        return "\n".join(lines)


def make_transform(augment: bool = False):
    """The course's v2 pipeline: ToImage, (RandomCrop(32, padding=4) + RandomHorizontalFlip,) float, Normalize."""
    from torchvision.transforms import v2

    steps = [v2.ToImage()]  # PIL (CIFAR10, ImageFolder) or uint8 tensor (EmbeddedImages): same pipeline
    if augment:
        steps += [v2.RandomCrop(32, padding=4), v2.RandomHorizontalFlip()]
    steps += [v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)]
    return v2.Compose(steps)


def to_nchw(images: np.ndarray) -> torch.Tensor:
    """numpy images (N, H, W, C) uint8 as a contiguous torch tensor (N, C, H, W) uint8 (a copy: safe to write)."""
    if not isinstance(images, np.ndarray) or images.ndim != 4 or images.dtype != np.uint8:
        raise ValueError(f"images must be a uint8 numpy array (N, H, W, C), got "
                         f"{getattr(images, 'dtype', type(images).__name__)} of shape {getattr(images, 'shape', None)}")
    return torch.from_numpy(images.copy()).permute(0, 3, 1, 2).contiguous()


def normalize_uint8(images: torch.Tensor, mean: Sequence[float] = MEAN, std: Sequence[float] = STD) -> torch.Tensor:
    """uint8 images (B, C, H, W) as float32 scaled to [0, 1], then normalised per channel (by default with the
    train split's MEAN and STD), in one vectorised op per batch."""
    if (not isinstance(images, torch.Tensor) or images.dtype != torch.uint8 or images.ndim != 4
            or images.shape[1] != len(mean) or len(mean) != len(std)):
        raise ValueError(f"images must be a uint8 tensor (B, {len(mean)}, H, W) with one mean and std per channel, "
                         f"got {getattr(images, 'dtype', type(images).__name__)} of shape "
                         f"{tuple(getattr(images, 'shape', ()))}")
    mean_t = torch.tensor(mean, dtype=torch.float32, device=images.device).view(1, -1, 1, 1)
    std_t = torch.tensor(std, dtype=torch.float32, device=images.device).view(1, -1, 1, 1)
    return (images.float() / 255 - mean_t) / std_t


def augment_batch(images: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """RandomCrop(32, padding=4) and a horizontal flip (p=0.5), drawn per image, on a uint8 batch (B, 3, 32, 32),
    as a few vectorised ops; `generator` None draws from torch's global generator (which DataLoader seeds
    differently in every worker)."""
    if not isinstance(images, torch.Tensor) or images.ndim != 4:
        raise ValueError(f"images must be a batch (B, C, H, W), got {getattr(images, 'shape', type(images).__name__)}")
    B, _, H, W = images.shape
    padded = torch.nn.functional.pad(images, (4, 4, 4, 4))               # (B, 3, H+8, W+8), black border
    top = torch.randint(0, 9, (B,), generator=generator)
    left = torch.randint(0, 9, (B,), generator=generator)
    rows = (top[:, None] + torch.arange(H))[:, :, None]                   # (B, H, 1)
    cols = (left[:, None] + torch.arange(W))[:, None, :]                  # (B, 1, W)
    crops = padded[torch.arange(B)[:, None, None], :, rows, cols]         # (B, H, W, 3)
    crops = crops.permute(0, 3, 1, 2)                                     # (B, 3, H, W)
    flip = torch.rand(B, generator=generator) < 0.5
    return torch.where(flip[:, None, None, None], crops.flip(-1), crops)


def crops_and_flips(image: torch.Tensor) -> list[torch.Tensor]:
    """Every image RandomCrop(32, padding=4) followed by RandomHorizontalFlip can make of one (3, 32, 32) image:
    81 crops, then the same 81 mirrored (162, in that order)."""
    if not isinstance(image, torch.Tensor) or tuple(image.shape[-2:]) != (32, 32) or image.ndim != 3:
        raise ValueError(f"image must be one (C, 32, 32) tensor, got {getattr(image, 'shape', type(image).__name__)}")
    padded = torch.nn.functional.pad(image, (4, 4, 4, 4))
    crops = [padded[:, top:top + 32, left:left + 32] for top in range(9) for left in range(9)]
    return crops + [c.flip(-1) for c in crops]


def augment_collate(samples: list[tuple[torch.Tensor, Any]]) -> tuple[torch.Tensor, torch.Tensor]:
    """A DataLoader collate_fn for uint8 image samples: stacks the batch, then does make_transform(augment=True)'s
    work on the whole batch at once (augment_batch's random crop and flip, drawn per image, then normalize_uint8).
    The dataset's own transform must leave uint8 (3, 32, 32) images: None for EmbeddedImages, v2.PILToTensor()
    for PIL images."""
    from torch.utils.data import default_collate

    images, labels = default_collate(samples)
    if images.dtype != torch.uint8:
        raise ValueError(f"augment_collate needs uint8 images, got {images.dtype}: give the dataset no float "
                         "conversion or Normalize (transform=None, or v2.PILToTensor() for PIL images)")
    return normalize_uint8(augment_batch(images.as_subclass(torch.Tensor))), labels


def denormalize(images: torch.Tensor, mean: Sequence[float] = MEAN, std: Sequence[float] = STD) -> torch.Tensor:
    """Undo Normalize on float images (B, C, H, W) or (C, H, W): x * std + mean per channel, back to the 0-1 scale."""
    if (not isinstance(images, torch.Tensor) or not images.is_floating_point() or images.ndim not in (3, 4)
            or images.shape[-3] != len(mean) or len(mean) != len(std)):
        raise ValueError(f"images must be a float tensor (B, {len(mean)}, H, W) or ({len(mean)}, H, W) with one mean "
                         f"and std per channel, got {getattr(images, 'dtype', type(images).__name__)} of shape "
                         f"{tuple(getattr(images, 'shape', ()))}")
    mean_t = torch.tensor(mean, dtype=images.dtype, device=images.device).view(-1, 1, 1)
    std_t = torch.tensor(std, dtype=images.dtype, device=images.device).view(-1, 1, 1)
    return images * std_t + mean_t


def channel_stats(batches: torch.Tensor | Iterable[torch.Tensor]) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and std (population) on the 0-1 scale of uint8 images (N, C, H, W), or of an iterable of
    such batches (e.g. `(images for images, _ in loader)` over a DataLoader of your training split that yields
    uint8): summed exactly in int64, so the order does not matter."""
    if isinstance(batches, torch.Tensor):
        batches = batches.split(512) if batches.ndim == 4 else (batches,)      # bounded int64 copies
    total = total_sq = None
    count = 0
    for batch in batches:
        if not isinstance(batch, torch.Tensor) or batch.dtype != torch.uint8 or batch.ndim != 4:
            raise ValueError(f"each batch must be a uint8 tensor (B, C, H, W), got "
                             f"{getattr(batch, 'dtype', type(batch).__name__)} of shape "
                             f"{tuple(getattr(batch, 'shape', ()))}")
        pixels = batch.transpose(0, 1).reshape(batch.shape[1], -1).long()      # (C, B*H*W)
        sums, sq = pixels.sum(dim=1), (pixels * pixels).sum(dim=1)
        if total is not None and len(sums) != len(total):
            raise ValueError(f"every batch must have {len(total)} channels, got one with {len(sums)}")
        total, total_sq = (sums, sq) if total is None else (total + sums, total_sq + sq)
        count += pixels.shape[1]
    if total is None or count == 0:
        raise ValueError("channel_stats needs at least one non-empty batch of images")
    mean = total.double() / count                                               # exact sums, float64 from here
    var = total_sq.double() / count - mean * mean
    return tuple((mean / 255).tolist()), tuple((var.clamp(min=0).sqrt() / 255).tolist())


@functools.lru_cache(maxsize=2)
def uint8_split(train: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """A whole split as uint8 images (N, 3, 32, 32) and int64 labels (N,), cached per process (treat as read-only)."""
    images, labels = load_arrays(bool(train))
    return to_nchw(images), torch.from_numpy(labels.copy())


def to_float_tensors(train: bool = True, device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """A whole split as normalised float32 (N, 3, 32, 32) and int64 labels (N,), for full-batch work."""
    images, labels = uint8_split(train)
    return normalize_uint8(images).to(device), labels.clone().to(device)


def load_dataset(train: bool = True, transform: Callable | None = None, name: str | None = None,
                 root: str | Path | None = None) -> Dataset:
    """The embedded dataset, or real CIFAR-10 (downloaded) when name or $PTLAB_DATASET says "cifar10".

    CIFAR10 yields PIL images, EmbeddedImages uint8 tensors: start transforms with v2.ToImage()
    (as make_transform does) and the same code runs on both.
    """
    chosen = name if name is not None else os.environ.get(DATASET_ENV, "embedded")
    chosen = str(chosen).strip().lower()
    if chosen == "embedded":
        return EmbeddedImages(train=train, transform=transform)
    if chosen == "cifar10":
        from torchvision.datasets import CIFAR10

        root = root or os.environ.get(DATA_ROOT_ENV) or Path.home() / ".cache" / "ptlab"
        return CIFAR10(root=str(root), train=train, transform=transform, download=True)
    source = "name" if name is not None else f"${DATASET_ENV}"
    raise ValueError(f"{source}={chosen!r} is not a dataset ptlab knows; use one of {', '.join(DATASET_NAMES)}")


def export_image_folder(dest: str | Path, train: bool = True, per_class: int | None = None) -> Path:
    """Write the split as dest/<class>/<index>.png so torchvision.datasets.ImageFolder(dest) can read it."""
    from PIL import Image

    if per_class is not None and (not isinstance(per_class, int) or per_class < 1):
        raise ValueError(f"per_class must be a positive int or None, got {per_class!r}")
    dest = Path(dest)
    images, labels = load_arrays(train)
    for label, name in enumerate(CLASSES):
        folder = dest / name
        folder.mkdir(parents=True, exist_ok=True)
        indices = np.flatnonzero(labels == label)[:per_class]
        for index in indices:
            Image.fromarray(images[index]).save(folder / f"{index:05d}.png")
    return dest


def train_val_split(labels: Sequence[int] | np.ndarray | torch.Tensor, val_fraction: float = 0.1,
                    seed: int = 0) -> tuple[list[int], list[int]]:
    """Seeded, stratified indices (train, validation): each class gives the same share to validation.

    Use with torch.utils.data.Subset. The test split stays untouched until one final evaluation.
    """
    if not (isinstance(val_fraction, (int, float)) and 0 < val_fraction < 1):
        raise ValueError(f"val_fraction must be a number strictly between 0 and 1, got {val_fraction!r}")
    labels = np.asarray(labels.tolist() if isinstance(labels, torch.Tensor) else labels)
    if labels.ndim != 1 or len(labels) == 0:
        raise ValueError(f"labels must be a non-empty 1-D sequence of class ids, got shape {labels.shape}")
    rng = np.random.default_rng(seed)
    train, val = [], []
    for cls in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == cls))
        n_val = int(round(len(members) * val_fraction))
        if n_val == 0 or n_val == len(members):
            raise ValueError(f"class {cls} has {len(members)} samples: too few to give {val_fraction} of them "
                             f"to validation and keep some for training")
        val += members[:n_val].tolist()
        train += members[n_val:].tolist()
    return sorted(train), sorted(val)
