"""GPU memory, reproduced and read: the peak of a step against the batch size, "out of memory" caught under a
cap, and a memory snapshot read for what holds the memory.

- `peak_bytes(fn)`: the most CUDA memory live tensors took while fn ran, above what they took before.
- `largest_batch(try_batch, start, limit)`: doubles the batch from `start` until `try_batch(n)` raises
  torch.cuda.OutOfMemoryError (or `limit` is passed), then bisects between the last size that fit and the
  first that did not; it frees what a failed try left behind before the next one.
- `memory_cap(extra_bytes)`: for the block, this process may reserve at most what it reserves now plus
  `extra_bytes` (torch.cuda.set_per_process_memory_fraction), so an OOM is reached without filling a shared GPU;
  the fraction is restored and the cache emptied after.
- `memory_history()` records who allocated each block (torch.cuda.memory._record_memory_history with Python
  stacks); `live_blocks(torch.cuda.memory._snapshot())` and `holders(blocks)` read a snapshot: the live blocks
  grouped by the code that allocated them, largest first.
The snapshot readers, the search and the message reader run anywhere; the rest needs CUDA.
"""
from __future__ import annotations

import contextlib
import gc
import os
import re
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch
from torch import nn

MiB = 2**20
TORCH_DIR = os.path.dirname(torch.__file__) + os.sep   # frames in here are torch's own code
NO_FRAME = "(no Python frame recorded: allocated before recording started, or from C++)"


def _cuda_device(device: torch.device | str) -> torch.device:
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"this reads CUDA's caching allocator: device must be a CUDA device, got {device}")
    if not torch.cuda.is_available():
        raise RuntimeError("no CUDA device here: torch.cuda.is_available() is False")
    # torch.cuda's per-process memory-fraction functions need an index (a bare "cuda" raises ValueError there)
    return device if device.index is not None else torch.device("cuda", torch.cuda.current_device())


def free_cached(device: torch.device | str = "cuda") -> None:
    """Collect garbage and hand the allocator's unused cached blocks back to the driver."""
    gc.collect()
    if torch.device(device).type == "cuda" and torch.cuda.is_available():
        torch.cuda.empty_cache()


def peak_bytes(fn: Callable[[], object], device: torch.device | str = "cuda") -> int:
    """The peak of torch.cuda.memory_allocated() while fn() ran, minus what was allocated before it."""
    device = _cuda_device(device)
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    fn()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - before


def batch_step(model: nn.Module, optimizer: torch.optim.Optimizer, *, image_size: int = 32,
               num_classes: int = 10) -> Callable[[int], None]:
    """A function of the batch size that runs one training step of `model` (cross-entropy) on a random batch
    of that many images, made on the model's device; gradients are set to None after the step."""
    device = next(model.parameters()).device

    def step(batch_size: int) -> None:
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        optimizer.zero_grad(set_to_none=True)                                         # what a failed try left
        images = torch.randn(batch_size, 3, image_size, image_size, device=device)    # (B, 3, H, W)
        labels = torch.randint(0, num_classes, (batch_size,), device=device)         # (B,)
        nn.functional.cross_entropy(model(images), labels).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def oom_summary(message: str) -> str:
    """The first line of an out-of-memory message, which says how much was asked for."""
    return message.strip().splitlines()[0] if message.strip() else "(empty message)"


@dataclass(frozen=True)
class BatchSearch:
    """The largest batch that fit, the smallest that did not, every try in order, and the first error's message."""

    fits: int | None
    fails: int | None
    tried: list[tuple[int, bool]] = field(default_factory=list)
    error: str = ""

    def __str__(self) -> str:
        tries = ", ".join(f"{n} {'fits' if ok else 'OOM'}" for n, ok in self.tried)
        lines = [f"tried: {tries}", f"largest batch that fit: {self.fits}; smallest that did not: {self.fails}"]
        if self.error:
            lines.append(f"the error said: {oom_summary(self.error)}")
        return "\n".join(lines)


def largest_batch(try_batch: Callable[[int], object], start: int, limit: int, *, granularity: int | None = None,
                  errors: tuple[type[BaseException], ...] = (torch.cuda.OutOfMemoryError,),
                  after_failure: Callable[[], None] = free_cached) -> BatchSearch:
    """Double the batch from `start` while try_batch(n) succeeds (up to `limit`), then bisect between the last
    size that fit and the first that raised one of `errors`, to a step of `granularity` (default: `start`).

    Other exceptions propagate. After each failure the error is dropped (its traceback holds the failed step's
    tensors) and `after_failure()` runs (default: gc and torch.cuda.empty_cache()).
    """
    for name, value in (("start", start), ("limit", limit)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if limit < start:
        raise ValueError(f"limit ({limit}) must be at least start ({start})")
    granularity = start if granularity is None else granularity
    if not isinstance(granularity, int) or granularity < 1:
        raise ValueError(f"granularity must be a positive int, got {granularity!r}")
    tried: list[tuple[int, bool]] = []
    first_error = ""

    def fits(n: int) -> bool:
        nonlocal first_error
        message = None
        try:
            try_batch(n)
        except errors as err:             # the except block ends here: err and its traceback are released
            message = str(err)
        if message is not None:
            first_error = first_error or message
            after_failure()
        tried.append((n, message is None))
        return message is None

    good, bad, n = None, None, start
    while n <= limit:
        if not fits(n):
            bad = n
            break
        good, n = n, n * 2
    if good is not None and bad is not None:
        while bad - good > granularity:
            middle = good + (bad - good) // 2 // granularity * granularity
            if middle <= good:
                break
            if fits(middle):
                good = middle
            else:
                bad = middle
    return BatchSearch(good, bad, tried, first_error)


@contextlib.contextmanager
def memory_cap(extra_bytes: int, device: torch.device | str = "cuda") -> Iterator[int]:
    """For the block, cap what this process's caching allocator may reserve at what it reserves now (after
    emptying its cache) plus `extra_bytes`; yields the cap in bytes. After the block (even on an error) the
    previous per-process fraction is restored and the cache emptied."""
    if not isinstance(extra_bytes, int) or isinstance(extra_bytes, bool) or extra_bytes < 1:
        raise ValueError(f"extra_bytes must be a positive int, got {extra_bytes!r}")
    device = _cuda_device(device)
    free_cached(device)
    total = torch.cuda.get_device_properties(device).total_memory
    cap = torch.cuda.memory_reserved(device) + extra_bytes
    getter = getattr(torch.cuda, "get_per_process_memory_fraction", None)
    previous = getter(device) if getter else 1.0
    torch.cuda.set_per_process_memory_fraction(min(1.0, cap / total), device)
    try:
        yield cap
    finally:
        torch.cuda.set_per_process_memory_fraction(previous, device)
        free_cached(device)


@contextlib.contextmanager
def memory_history(max_entries: int = 100_000, device: torch.device | str = "cuda") -> Iterator[None]:
    """Record, for the block, the Python stack of every CUDA allocation (what a snapshot's blocks show as
    frames); recording stops after the block."""
    if not isinstance(max_entries, int) or isinstance(max_entries, bool) or max_entries < 1:
        raise ValueError(f"max_entries must be a positive int, got {max_entries!r}")
    device = _cuda_device(device)
    torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks="python",
                                              max_entries=max_entries, device=device)
    try:
        yield
    finally:
        torch.cuda.memory._record_memory_history(enabled=None, device=device)


@dataclass(frozen=True)
class LiveBlock:
    """A block of a snapshot that a tensor holds: its size in bytes and the frames that allocated it, innermost
    first (each a dict with filename, line and name)."""

    size: int
    frames: tuple[dict, ...]


def live_blocks(snapshot: dict, device: int | None = None) -> list[LiveBlock]:
    """Every block in state 'active_allocated' in a torch.cuda.memory._snapshot() dict (of one device index,
    or of all)."""
    if not isinstance(snapshot, dict) or not isinstance(snapshot.get("segments"), list):
        raise ValueError("snapshot must be the dict torch.cuda.memory._snapshot() returns, with a 'segments' list")
    blocks = []
    for segment in snapshot["segments"]:
        if device is not None and segment.get("device") != device:
            continue
        for block in segment.get("blocks", []):
            if block.get("state") == "active_allocated":
                blocks.append(LiveBlock(int(block["size"]), tuple(block.get("frames") or ())))
    return blocks


def _where(frame: dict) -> str:
    return f"{os.path.basename(frame['filename'])}:{frame['line']} {frame['name']}"


def frame_label(frames: tuple[dict, ...], torch_dir: str = TORCH_DIR) -> str:
    """Who allocated a block: the innermost frame (the torch function, for a layer's output), and the innermost
    frame outside torch's own code when that is another one (the line of your code that led there)."""
    if not frames:
        return NO_FRAME
    inner = _where(frames[0])
    yours = next((f for f in frames if not f["filename"].startswith(torch_dir)), None)
    if yours is None or yours is frames[0]:
        return inner
    return f"{inner}  <- {_where(yours)}"


@dataclass(frozen=True)
class Holder:
    """The live blocks one place in the code allocated: where, how many bytes, how many blocks."""

    label: str
    bytes: int
    blocks: int


def holders(blocks: list[LiveBlock], torch_dir: str = TORCH_DIR) -> list[Holder]:
    """Live blocks grouped by frame_label, largest total first."""
    grouped: dict[str, list[int]] = {}
    for block in blocks:
        grouped.setdefault(frame_label(block.frames, torch_dir), []).append(block.size)
    return sorted((Holder(label, sum(sizes), len(sizes)) for label, sizes in grouped.items()),
                  key=lambda h: (-h.bytes, h.label))


def bytes_under(blocks: list[LiveBlock], function: str) -> int:
    """Bytes of the live blocks allocated while a function of this name was on the stack ('forward', say)."""
    return sum(b.size for b in blocks if any(f["name"] == function for f in b.frames))


def format_holders(found: list[Holder], top: int = 6) -> str:
    """The `top` largest holders as a table: MiB, blocks, where."""
    total = sum(h.bytes for h in found) or 1
    lines = [f"{'MiB':<10}{'share':<8}{'blocks':<8}allocated by (innermost frame  <- your code)"]
    for h in found[:top]:
        lines.append(f"{h.bytes / MiB:<10.2f}{h.bytes / total:<8.1%}{h.blocks:<8}{h.label}")
    if len(found) > top:
        rest = found[top:]
        lines.append(f"{sum(h.bytes for h in rest) / MiB:<10.2f}{sum(h.bytes for h in rest) / total:<8.1%}"
                     f"{sum(h.blocks for h in rest):<8}({len(rest)} more places)")
    return "\n".join(lines)


def oom_requested_bytes(message: str) -> int | None:
    """The size an out-of-memory message says was asked for ("Tried to allocate 2.00 GiB"), in bytes; None if
    the message does not say."""
    match = re.search(r"(?:Tried to allocate|Requested size:)\s*([\d.]+)\s*(B|KiB|MiB|GiB|TiB)", message)
    if not match:
        return None
    scale = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}[match.group(2)]
    return round(float(match.group(1)) * scale)
