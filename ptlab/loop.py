"""What every loop over (inputs, targets) batches shares: argument checks, the device, batches, and modes.

ptlab.train (training), ptlab.results (after training) and ptlab.overfit (the ritual) build on these.
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterable, Iterator

import torch
from torch import nn


def model_device(model: nn.Module) -> torch.device | None:
    """The device of the model's first parameter or buffer; None for a model that holds no tensor."""
    for tensor in (*model.parameters(), *model.buffers()):
        return tensor.device
    return None


def resolve_device(model: nn.Module, device: torch.device | str | None) -> torch.device:
    """The device given, else the device of the model's first parameter or buffer, else cpu."""
    if device is not None:
        return torch.device(device)
    found = model_device(model)
    return found if found is not None else torch.device("cpu")


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """tensor on device; a copy from pinned CPU memory is non_blocking (it can overlap with the GPU's work)."""
    return tensor.to(device, non_blocking=tensor.device.type == "cpu" and tensor.is_pinned())


def check_model(model: Any) -> None:
    """TypeError unless model is an nn.Module."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")


def require_batches(loader: Any, name: str) -> None:
    """TypeError unless loader is an iterable of batches; ValueError when it has a length of 0."""
    if isinstance(loader, (torch.Tensor, str, bytes)) or not isinstance(loader, Iterable):
        raise TypeError(f"{name} must be an iterable of (inputs, targets) batches such as a DataLoader, "
                        f"got {type(loader).__name__}")
    with contextlib.suppress(TypeError):
        if len(loader) == 0:
            raise ValueError(f"{name} is empty: it yields no batches (check the dataset size and drop_last)")


def unpack_batch(batch: Any, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Move an (inputs, targets) batch, inputs and targets both, to device; anything else is a TypeError."""
    if not isinstance(batch, (tuple, list)) or len(batch) != 2:
        raise TypeError(f"the loader must yield (inputs, targets) pairs, got {type(batch).__name__}"
                        + (f" of length {len(batch)}" if isinstance(batch, (tuple, list)) else ""))
    X, y = batch
    if not isinstance(X, torch.Tensor) or not isinstance(y, torch.Tensor):
        raise TypeError(f"inputs and targets must be tensors, got {type(X).__name__} and {type(y).__name__}")
    return to_device(X, device), to_device(y, device)


def count_correct(logits: torch.Tensor, y: torch.Tensor) -> int:
    """How many rows of (batch, num_classes) logits have their argmax at the target."""
    if logits.ndim != 2:
        raise ValueError(f"the model must return logits of shape (batch, num_classes), got {tuple(logits.shape)}")
    return int((logits.argmax(dim=1) == y).sum())


@contextlib.contextmanager
def _modes_restored(model: nn.Module) -> Iterator[None]:
    modes = [(m, m.training) for m in model.modules()]
    try:
        yield
    finally:
        for m, was_training in modes:
            m.training = was_training


@contextlib.contextmanager
def eval_mode(model: nn.Module) -> Iterator[None]:
    """Every submodule in eval mode; afterwards each gets back the mode it had (mixed modes survive)."""
    with _modes_restored(model):
        model.eval()
        yield


@contextlib.contextmanager
def train_mode(model: nn.Module) -> Iterator[None]:
    """Training mode that respects a deliberate freeze; afterwards each submodule gets back its mode.

    If the model itself is in training mode, nothing is switched: a submodule you put in eval mode
    (a frozen BatchNorm, whose running statistics must not move) stays in eval. If the whole model
    is in eval mode (you evaluated it by hand), it is switched to training mode for the duration.
    """
    with _modes_restored(model):
        if not model.training:
            model.train()
        yield
