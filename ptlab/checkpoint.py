"""Checkpoints that resume training exactly: everything that training state is made of, written atomically.

A checkpoint holds the model, the optimizer (AdamW's moments, SGD's momentum), the scheduler (where
the learning rate is in its schedule), the epoch, the config, every random generator that decides
what comes next (torch CPU and CUDA, NumPy, `random`, and named generators such as a DataLoader's),
and anything else you pass as `extra`. It is loaded with `weights_only=True`: plain containers,
numbers, strings and tensors only, so a checkpoint from elsewhere cannot run code when it is loaded.
"""
from __future__ import annotations

import os
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import nn

from .core import atomic_write

FORMAT = "ptlab-checkpoint-1"


def random_state() -> dict[str, Any]:
    """Every global random generator's state, as plain containers and tensors (weights_only-safe)."""
    name, keys, position, has_gauss, cached = np.random.get_state()
    version, python_state, gauss_next = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": {"name": name, "keys": torch.from_numpy(keys.astype(np.int64)), "position": int(position),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "python": {"version": version, "state": list(python_state), "gauss_next": gauss_next},
    }


def set_random_state(state: dict[str, Any]) -> None:
    """Restore what random_state() captured (CUDA's only where this machine has the same GPUs)."""
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda"])
    n = state["numpy"]
    np.random.set_state((n["name"], n["keys"].numpy().astype(np.uint32), n["position"], n["has_gauss"],
                         n["cached_gaussian"]))
    p = state["python"]
    random.setstate((p["version"], tuple(p["state"]), p["gauss_next"]))


def atomic_save(obj: Any, path: str | Path) -> Path:
    """torch.save to a temporary file beside `path`, flushed to disk, then renamed over `path`.

    A crash (or a kill) during the write leaves the previous file at `path` untouched: the rename is
    the only step that changes it, and a rename within one folder is atomic. The temporary file such
    a writer leaves, `.<name>.<pid>.tmp`, is removed by the next save to `path` once no process `pid`
    runs (POSIX; on Windows it stays: there this code cannot safely ask whether a process runs).
    """
    path = atomic_write(path, lambda handle: torch.save(obj, handle))
    if hasattr(os, "O_DIRECTORY"):  # make the rename itself durable (POSIX)
        folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)
    _remove_stale_temporaries(path)
    return path


def _remove_stale_temporaries(path: Path) -> None:
    """Remove atomic_save's temporary files of `path` whose writer no longer runs (one killed mid-save)."""
    pattern = re.compile(re.escape(f".{path.name}.") + r"(\d{1,9})\.tmp")
    for candidate in path.parent.iterdir():
        match = pattern.fullmatch(candidate.name)
        if match and not _running(int(match.group(1))):
            try:
                candidate.unlink()
            except OSError:  # removed meanwhile by another save, or not ours to remove
                pass


def _running(pid: int) -> bool:
    """Whether process `pid` exists on this machine; True where that cannot be asked safely (not POSIX)."""
    if os.name != "posix":
        return True  # on Windows os.kill(pid, 0) sends Ctrl+C: keep the file rather than risk a live write
    try:
        os.kill(pid, 0)  # signal 0 sends nothing: it only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, under another user
        pass
    return True


@dataclass
class Checkpoint:
    """What load_checkpoint restored besides the weights: where training was, and with which settings."""

    epoch: int
    config: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None


def save_checkpoint(path: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer | None = None,
                    scheduler: Any = None, *, epoch: int, config: dict[str, Any] | None = None,
                    generators: dict[str, torch.Generator] | None = None,
                    extra: dict[str, Any] | None = None) -> Path:
    """Save everything needed to resume exactly, atomically; returns the path."""
    if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
        raise ValueError(f"epoch must be an int >= 0, got {epoch!r}")
    if isinstance(model, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
        model = model.module  # save the plain model's keys: no 'module.' prefix (chapter 5's pitfall)
    state = {
        "format": FORMAT,
        "epoch": epoch,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict() if optimizer is not None else None,
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "config": dict(config or {}),
        "random": random_state(),
        "generators": {name: g.get_state() for name, g in (generators or {}).items()},
        "extra": dict(extra or {}),
    }
    return atomic_save(state, path)


def load_checkpoint(path: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer | None = None,
                    scheduler: Any = None, *, generators: dict[str, torch.Generator] | None = None,
                    restore_random: bool = True) -> Checkpoint:
    """Load a checkpoint into model (strict), optimizer, scheduler and generators, with weights_only=True.

    A DistributedDataParallel or DataParallel wrapper is loaded through its .module, as it was saved.
    The file is always read onto the CPU, so a checkpoint written on a GPU loads on a machine without one;
    load_state_dict then copies the weights, and the optimizer's state, to wherever the model's parameters
    are. The random generators' states stay on the CPU: torch takes a generator's state (a CUDA one's
    too) only as a CPU ByteTensor, so mapping the file to a GPU would make the resume fail.
    restore_random=True (the default, for resuming) also sets torch's, NumPy's and Python's global random
    generators back to their state at the save; pass restore_random=False to load weights for evaluation
    or inspection without rewinding them.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    state = torch.load(path, map_location="cpu", weights_only=True)   # never a GPU: see the docstring
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise ValueError(f"{path} is not a ptlab checkpoint (format {FORMAT!r}); "
                         "for a bare state_dict use model.load_state_dict(torch.load(path, weights_only=True))")
    if isinstance(model, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
        model = model.module  # the file holds the plain model's keys (see save_checkpoint)
    model.load_state_dict(state["model"])
    for name, target in (("optimizer", optimizer), ("scheduler", scheduler)):
        if target is not None:
            if state[name] is None:
                raise ValueError(f"{path} holds no {name} state, but a {name} was given to restore")
            target.load_state_dict(state[name])
    for name, generator in (generators or {}).items():
        if name not in state["generators"]:
            raise KeyError(f"{path} holds no generator {name!r}; it has {sorted(state['generators'])}")
        generator.set_state(state["generators"][name])
    if restore_random:
        set_random_state(state["random"])
    return Checkpoint(state["epoch"], state["config"], state["extra"], path)


class MatchedLoad(NamedTuple):
    """What load_matching_weights did: keys copied, checkpoint keys skipped, model keys left as they were."""

    loaded: list[str]
    skipped: list[str]
    missing: list[str]


def load_matching_weights(model: nn.Module, state: Mapping[str, torch.Tensor]) -> MatchedLoad:
    """Load every tensor of `state` whose key and shape match `model`'s; return what was loaded and skipped."""
    if not isinstance(model, nn.Module) or not isinstance(state, Mapping):
        raise TypeError("load_matching_weights(model, state) needs an nn.Module and a state_dict (a mapping)")
    own = model.state_dict()
    matching = {k: v for k, v in state.items()
                if k in own and isinstance(v, torch.Tensor) and v.shape == own[k].shape}
    if not matching:
        raise ValueError(f"no key of `state` matches the model with the same shape (state has {sorted(state)[:4]}, "
                         f"the model {sorted(own)[:4]}); for a ptlab checkpoint pass checkpoint['model']")
    result = model.load_state_dict(matching, strict=False)
    return MatchedLoad(list(matching), [k for k in state if k not in matching], list(result.missing_keys))
