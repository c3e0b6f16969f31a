"""Where training memory goes: parameters, gradients, optimizer state and saved activations.

`memory_breakdown(model, optimizer, batch)` measures each part for one training step on a copy of
the model (yours is not trained): parameters and gradients by their tensors, the optimizer's state
after one step (AdamW keeps two tensors per parameter, SGD with momentum one), and the activations
autograd saves for backward, counted by a saved-tensor hook. The input batch counts the bytes its
tensors cover; a batch sliced from a larger tensor keeps all of it alive, reported apart. Byte counts
follow from shapes and dtypes, so they are exact facts, the same on every CPU (on a GPU, cuDNN may save
extra tensors of its own).
"""
from __future__ import annotations

import copy
import gc
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import torch
from torch import nn

from .loop import model_device, to_device

MiB = 2**20


def tensor_bytes(tensors) -> int:
    """Bytes held by these tensors, each storage counted once (views share their base's memory)."""
    seen = {storage_key(t) for t in tensors if isinstance(t, torch.Tensor)}
    return sum(key[-1] for key in seen)


def _covered_bytes(tensors) -> int:
    """Bytes the tensors' elements span in memory, each distinct view counted once (a slice: its rows only)."""
    spans = {}
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.numel():
            span = 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))   # elements
            spans[(t.device.type, t.data_ptr(), span)] = span * t.element_size()
    return sum(spans.values())


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes of each part of one training step's memory."""

    parameters: int
    gradients: int
    optimizer_state: int
    activations: int
    batch: int                 # the bytes the batch's tensors cover
    batch_storage: int = 0     # the bytes of the storages they keep alive: more than `batch` for a slice of a data set

    @property
    def total(self) -> int:
        return self.parameters + self.gradients + self.optimizer_state + self.activations + self.batch

    def __str__(self) -> str:
        rows = [("parameters", self.parameters), ("gradients", self.gradients),
                ("optimizer state", self.optimizer_state), ("saved activations", self.activations),
                ("input batch", self.batch), ("total", self.total)]
        lines = [f"{name:<18}{n / MiB:>9.2f} MiB  ({n:,} bytes)" for name, n in rows]
        if self.batch_storage > self.batch:
            extra = self.batch_storage - self.batch
            lines.append(f"the input batch is a view: it keeps {self.batch_storage / MiB:.2f} MiB "
                         f"({self.batch_storage:,} bytes) of storage alive, {extra / MiB:.2f} MiB more than it covers "
                         "(not in the total)")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return str(self)


def memory_breakdown(model: nn.Module, optimizer: torch.optim.Optimizer, batch: tuple[torch.Tensor, torch.Tensor],
                     loss_fn: Callable | None = None) -> MemoryBreakdown:
    """Measure one training step's memory by part, on a deep copy of model and optimizer.

    The batch is moved to the model's device first (where it already is, it is used as it is).
    """
    if not isinstance(model, nn.Module) or not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError("memory_breakdown(model, optimizer, (X, y)) needs an nn.Module and a torch optimizer")
    loss_fn = loss_fn or nn.functional.cross_entropy
    X, y = batch
    device = model_device(model)
    if device is not None:
        X, y = to_device(X, device), to_device(y, device)
    twin, twin_optimizer = copy.deepcopy((model, optimizer))  # one copy: the optimizer holds the twin's params
    twin.train()
    params = list(twin.parameters())
    with SavedTensors(exclude=[*params, X, y, *twin.buffers()]) as saved:
        loss = loss_fn(twin(X), y)
    activations = saved.bytes
    twin_optimizer.zero_grad()
    loss.backward()
    gradients = tensor_bytes(p.grad for p in params if p.grad is not None)
    twin_optimizer.step()
    state = [t for s in twin_optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
    return MemoryBreakdown(parameters=tensor_bytes(params), gradients=gradients,
                           optimizer_state=tensor_bytes(state), activations=activations,
                           batch=_covered_bytes([X, y]), batch_storage=tensor_bytes([X, y]))


def storage_key(t: torch.Tensor) -> tuple[str, int, int]:
    """(device type, address, bytes) of the storage under t: views of one storage share it."""
    storage = t.untyped_storage()
    return t.device.type, storage.data_ptr(), storage.nbytes()


def saved_tensor_bytes(fn: Callable[[], Any], exclude: Iterable[torch.Tensor] = ()) -> int:
    """Bytes autograd saves for backward while fn() runs, each saved storage counted once.

    What autograd saves includes parameters (a Linear saves its weight to pass gradients back) and the
    caller's input; pass them in `exclude` to count the rest, the activations, alone.
    """
    if not callable(fn):
        raise TypeError(f"saved_tensor_bytes needs a callable, got {type(fn).__name__}")
    with SavedTensors(exclude=exclude) as saved:
        fn()
    return saved.bytes


class _SavedRecord:
    """What the pack hook stores: the saved tensor, detached (holding an output's grad_fn would make a
    reference cycle that keeps the graph alive), and weakly referable so we can see when it is freed."""

    __slots__ = ("tensor", "__weakref__")

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor


class SavedTensors:
    """Records, with torch.autograd.graph.saved_tensors_hooks, every tensor autograd saves for backward
    inside `with SavedTensors() as saved:`. Afterwards saved.bytes is what was saved (each storage once),
    and saved.held_bytes() how many bytes of it are still alive, i.e. kept by a graph that something
    still references. Storages of `exclude` (the parameters, the input batch: they exist anyway) are
    left out of `bytes`. A storage is known by its (device, address, size), so `bytes` is exact for one
    forward pass; over several, a freed storage whose address is reused for one of the same size counts
    once, and `bytes` can come out lower than all that was saved.
    """

    def __init__(self, exclude: Iterable[torch.Tensor] = ()) -> None:
        self._exclude = {storage_key(t) for t in exclude}
        self._saved: dict[tuple[str, int, int], int] = {}
        self._records: list[weakref.ref] = []
        self._hooks: Any = None

    def _pack(self, t: torch.Tensor) -> _SavedRecord:
        key = storage_key(t)
        if key not in self._exclude:
            self._saved[key] = key[-1]
        record = _SavedRecord(t.detach())
        self._records.append(weakref.ref(record))
        return record

    @property
    def bytes(self) -> int:
        """Bytes of the distinct storages autograd saved inside the block, `exclude` left out."""
        return sum(self._saved.values())

    def __enter__(self) -> "SavedTensors":
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda record: record.tensor)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._hooks.__exit__(*exc)

    @property
    def recorded(self) -> int:
        """How many tensors autograd saved inside the block (alive or freed since)."""
        return len(self._records)

    def alive(self) -> int:
        """How many of the recorded saved tensors are still alive now (after a garbage collection)."""
        gc.collect()
        return sum(ref() is not None for ref in self._records)

    def held_bytes(self, exclude: Iterable[torch.Tensor] = ()) -> int:
        """Bytes of saved tensors still alive now, leaving out the storages of `exclude` (weights, inputs)."""
        gc.collect()
        skip = {storage_key(t) for t in exclude}
        held: dict[tuple[int, int], int] = {}
        for ref in self._records:
            record = ref()
            if record is not None:
                key = storage_key(record.tensor)
                if key not in skip:
                    held[key] = key[-1]
        return sum(held.values())
