"""Trained weights the course ships, and the batch and accuracy helpers that pitfalls, tests and notebooks share.

`data/ptlab_weights_v1.pt` holds two width-16 SmallCNNs, trained by `build_weights()` on the embedded dataset:

- "reference": all 10 classes, 400 batches of 64 with crop-and-flip augmentation. Chapter 4's pitfalls start
  from it when they need a trained model (it is far from the chapter's best, and every symptom shows on it).
- "backbone": only PRETRAIN_CLASSES, the same recipe. Chapter 4's fine-tuning section swaps its head and
  fine-tunes it on FINETUNE_CLASSES, which it has never seen.

Training them takes under a minute on a laptop, but every pitfall run would pay it again, so the file is built once
(`python -m ptlab data --rebuild-weights`) and loaded. Rebuilt on another CPU the weights are equivalent, not
identical (float rounding differs): nothing the course compares depends on the file's bytes.
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Iterator, Sequence

import torch
from torch import nn
from torch.nn import functional as F

from . import data
from .core import atomic_write
from .data import CLASSES, augment_batch, normalize_uint8, uint8_split
from .loop import eval_mode, model_device
from .models import SmallCNN

WIDTH = 16           # a quarter of SmallCNN's default compute: reproductions take seconds, not minutes
BATCH = 64
PRETRAIN_CLASSES: tuple[str, ...] = ("arrow_up", "arrow_down", "circle", "square", "triangle", "star")
FINETUNE_CLASSES: tuple[str, ...] = ("ring", "frame", "cross", "stripes")
WEIGHTS_FORMAT = "ptlab-weights"
WEIGHTS_VERSION = 1
STEPS = {"reference": 400, "backbone": 800}   # batches of 64 each model is trained for
_FIX_HINT = ("rebuild it with `.venv/bin/python -m ptlab data --rebuild-weights` "
             "(under a minute on 2 quiet cores, no network), "
             "or set PTLAB_DATA_DIR to the folder that holds it")


def weights_file() -> Path:
    """Where the weights live: beside the dataset file (data/, or $PTLAB_DATA_DIR)."""
    return data.DATA_DIR / f"ptlab_weights_v{WEIGHTS_VERSION}.pt"


class WeightsError(RuntimeError):
    """The shipped weights file is missing, unreadable, or not what this ptlab version expects."""


# ---------------------------------------------------------------- batches and accuracy
def batch_stream(seed: int = 0, augment: bool = False, indices: Sequence[int] | torch.Tensor | None = None,
                 batch_size: int = BATCH) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Endless normalised training batches (X (B, 3, 32, 32), y (B,)) drawn with replacement by a seeded generator,
    from the whole train split or from `indices` of it."""
    images, labels = uint8_split(True)
    pool = torch.arange(len(labels)) if indices is None else torch.as_tensor(indices, dtype=torch.long)
    if pool.ndim != 1 or len(pool) == 0:
        raise ValueError(f"indices must be a non-empty 1-D sequence of train-split indices, "
                         f"got shape {tuple(pool.shape)}")
    g = torch.Generator().manual_seed(seed)
    while True:
        idx = pool[torch.randint(0, len(pool), (batch_size,), generator=g)]
        batch = augment_batch(images[idx], g) if augment else images[idx]
        yield normalize_uint8(batch), labels[idx]


@torch.no_grad()
def accuracy_on(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, batch_size: int = 500) -> float:
    """Accuracy of model on uint8 images (N, 3, 32, 32) and labels (N,), in eval mode (every module's mode restored).

    Each batch goes to the model's device; predictions are compared with the labels on the CPU.
    """
    if len(images) != len(labels) or len(labels) == 0:
        raise ValueError(f"images and labels must be non-empty and of the same length, "
                         f"got {len(images)} and {len(labels)}")
    with eval_mode(model):
        device = model_device(model) or torch.device("cpu")
        correct = sum(int((model(normalize_uint8(images[i:i + batch_size]).to(device)).argmax(1).cpu()
                           == labels[i:i + batch_size].cpu()).sum())
                      for i in range(0, len(labels), batch_size))
    return correct / len(labels)


def accuracy_on_test(model: nn.Module, n: int = 2000, batch_size: int = 500) -> float:
    """Accuracy on the first n test images (of 2,000), in eval mode (the model's modes are restored)."""
    images, labels = uint8_split(False)
    return accuracy_on(model, images[:n], labels[:n], batch_size)


def class_indices(names: Sequence[str], train: bool = True) -> torch.Tensor:
    """Indices of the images of the named classes in one split, in order (N,)."""
    unknown = [n for n in names if n not in CLASSES]
    if unknown:
        raise ValueError(f"unknown class names {unknown}; the classes are {CLASSES}")
    _, labels = uint8_split(train)
    return torch.nonzero(torch.isin(labels, torch.tensor([CLASSES.index(n) for n in names]))).flatten()


def relabel(labels: torch.Tensor, names: Sequence[str]) -> torch.Tensor:
    """Map dataset labels of the named classes to 0..len(names)-1, in the order of names."""
    lookup = torch.full((len(CLASSES),), -1, dtype=torch.long)
    lookup[torch.tensor([CLASSES.index(n) for n in names])] = torch.arange(len(names))
    out = lookup[labels]
    if (out < 0).any():
        raise ValueError(f"labels contain classes outside {tuple(names)}")
    return out


# ---------------------------------------------------------------- building the weights
def _train(classes: Sequence[str], steps: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """A width-16 SmallCNN trained on the named classes: AdamW + OneCycleLR to 1e-2, crop + flip, batches of 64."""
    torch.manual_seed(seed)
    model = SmallCNN(num_classes=len(classes), width=WIDTH)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=5e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-2, total_steps=steps)
    indices = None if tuple(classes) == CLASSES else class_indices(classes)
    for _, (X, y) in zip(range(steps), batch_stream(seed=seed, augment=True, indices=indices)):
        loss = F.cross_entropy(model(X), y if indices is None else relabel(y, classes))
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def build_weights() -> dict:
    """Train both models from seed 0 (seconds each) and return the dict the weights file holds."""
    from tqdm.auto import tqdm

    models = {}
    for name, classes in tqdm([("reference", CLASSES), ("backbone", PRETRAIN_CLASSES)], desc="training", unit="model"):
        models[name] = {"classes": list(classes), "width": WIDTH, "steps": STEPS[name],
                        "state_dict": _train(classes, STEPS[name])}
    return {"format": WEIGHTS_FORMAT, "version": WEIGHTS_VERSION,
            "made_with": f"torch {torch.__version__.split('+')[0]}, {torch.backends.cpu.get_cpu_capability()}",
            "models": models}


def rebuild_weights(path: str | Path | None = None) -> Path:
    """Train the weights again and write them atomically to path (default: the weights file); returns the path."""
    path = Path(path) if path is not None else weights_file()
    weights = build_weights()
    atomic_write(path, lambda handle: torch.save(weights, handle))
    _load.cache_clear()
    return path


# ---------------------------------------------------------------- loading and checking them
def _check_model_entry(name: str, entry, path: Path) -> None:
    if not isinstance(entry, dict) or not {"classes", "width", "state_dict"} <= entry.keys():
        raise WeightsError(f"weights file {path}: entry {name!r} is malformed; {_FIX_HINT}")
    try:
        model = SmallCNN(num_classes=len(entry["classes"]), width=entry["width"])
        model.load_state_dict(entry["state_dict"], strict=True)
    except (RuntimeError, TypeError, ValueError) as err:
        raise WeightsError(f"weights file {path}: {name!r} does not fit a SmallCNN ({str(err)[:200]}); "
                           f"{_FIX_HINT}") from err
    if not all(torch.isfinite(t.float()).all() for t in entry["state_dict"].values()):
        raise WeightsError(f"weights file {path}: {name!r} holds non-finite values; {_FIX_HINT}")


@functools.lru_cache(maxsize=4)
def _load(path: Path, mtime_ns: int) -> dict:
    try:
        blob = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # a truncated zip, garbage bytes, a pickle weights_only refuses: all one problem
        raise WeightsError(f"weights file {path} cannot be read ({type(err).__name__}: {str(err)[:160]}); "
                           f"{_FIX_HINT}") from err
    if not isinstance(blob, dict) or blob.get("format") != WEIGHTS_FORMAT or blob.get("version") != WEIGHTS_VERSION:
        raise WeightsError(f"weights file {path} is not version {WEIGHTS_VERSION} of ptlab's weights; {_FIX_HINT}")
    expected = {"reference": list(CLASSES), "backbone": list(PRETRAIN_CLASSES)}
    for name, classes in expected.items():
        entry = blob.get("models", {}).get(name)
        _check_model_entry(name, entry, path)
        if entry["classes"] != classes or entry["width"] != WIDTH:
            raise WeightsError(f"weights file {path}: {name!r} was trained on other classes or at another width; "
                               f"{_FIX_HINT}")
    return blob


def load_weights(path: str | Path | None = None) -> dict:
    """The weights file's contents, checked (format, version, classes, shapes, finite values); cached per process."""
    path = Path(path).resolve() if path is not None else weights_file().resolve()
    if not path.is_file():
        raise WeightsError(f"weights file {path.name} is missing from {path.parent}; {_FIX_HINT}")
    return _load(path, path.stat().st_mtime_ns)


def _model(name: str) -> SmallCNN:
    entry = load_weights()["models"][name]
    model = SmallCNN(num_classes=len(entry["classes"]), width=entry["width"])
    model.load_state_dict(entry["state_dict"])
    return model.eval()


def reference_model() -> SmallCNN:
    """A fresh copy of the shipped 10-class reference model (width 16), in eval mode."""
    return _model("reference")


def pretrained_backbone() -> SmallCNN:
    """A fresh copy of the model pretrained on PRETRAIN_CLASSES only (its head has len(PRETRAIN_CLASSES) outputs)."""
    return _model("backbone")


def describe_weights() -> str:
    """One line per shipped model: its classes and its accuracy on those classes' test images."""
    lines = []
    for name, model in (("reference", reference_model()), ("backbone", pretrained_backbone())):
        classes = load_weights()["models"][name]["classes"]
        images, labels = uint8_split(False)
        idx = class_indices(classes, train=False)
        acc = accuracy_on(model, images[idx], relabel(labels[idx], classes))
        lines.append(f"{name}: {len(classes)} classes, test accuracy on them {acc:.3f}")
    return "\n".join(lines)


__all__ = ["WIDTH", "BATCH", "PRETRAIN_CLASSES", "FINETUNE_CLASSES", "WeightsError", "weights_file", "augment_batch",
           "batch_stream", "accuracy_on", "accuracy_on_test", "class_indices", "relabel", "build_weights",
           "rebuild_weights", "load_weights", "reference_model", "pretrained_backbone", "describe_weights"]
