"""Device choice and seeding: set once, in plain view, at the top of every notebook; the environment for a
child Python; random state kept across a block; a file written atomically."""
from __future__ import annotations

import contextlib
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable, Iterable, Iterator

import numpy as np
import torch

DEVICE_ENV = "PTLAB_DEVICE"
_KNOWN_DEVICES = ("cpu", "cuda", "mps")


@dataclass(frozen=True)
class DeviceChoice:
    """The device ptlab picked and the reason, for a readable setup cell."""

    device: torch.device
    reason: str

    def __str__(self) -> str:
        return f"{self.device} ({self.reason})"


def choose_device() -> DeviceChoice:
    """Pick cuda, then mps, then cpu; the PTLAB_DEVICE environment variable overrides."""
    wanted = os.environ.get(DEVICE_ENV, "").strip()
    if wanted:
        kind = wanted.split(":")[0]
        if kind not in _KNOWN_DEVICES:
            raise ValueError(
                f"{DEVICE_ENV}={wanted!r} is not a device ptlab knows; use one of {', '.join(_KNOWN_DEVICES)}"
            )
        if kind == "cuda" and not torch.cuda.is_available():
            raise RuntimeError(f"{DEVICE_ENV}={wanted!r} but torch.cuda.is_available() is False on this machine")
        if kind == "mps" and not torch.backends.mps.is_available():
            raise RuntimeError(f"{DEVICE_ENV}={wanted!r} but torch.backends.mps.is_available() is False")
        return DeviceChoice(torch.device(wanted), f"set by {DEVICE_ENV}")
    if torch.cuda.is_available():
        return DeviceChoice(torch.device("cuda"), f"CUDA GPU found: {torch.cuda.get_device_name(0)}")
    if torch.backends.mps.is_available():
        return DeviceChoice(torch.device("mps"), "Apple GPU (MPS) found")
    return DeviceChoice(torch.device("cpu"), "no CUDA or MPS device found")


def get_device() -> torch.device:
    """The device the course runs on: cuda, then mps, then cpu (PTLAB_DEVICE overrides)."""
    return choose_device().device


def seed_everything(seed: int, deterministic: bool = False) -> None:
    """Seed Python, NumPy and torch (all devices); optionally ask torch for deterministic kernels."""
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # also seeds every CUDA device
    if deterministic:
        # cuBLAS needs this before its first call to be deterministic.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False



@contextlib.contextmanager
def kept_random_state(devices: Iterable[torch.device | str] = (),
                      generators: Iterable[torch.Generator] = ()) -> Iterator[None]:
    """Restore on exit torch's CPU generator, the generators of those `devices` that are of this machine's
    accelerator type (CUDA, MPS, ...), and each generator in `generators`."""
    accelerator = torch.accelerator.current_accelerator()
    kind = accelerator.type if accelerator is not None else "cuda"
    indices = sorted({d.index if d.index is not None else torch.accelerator.current_device_index()
                      for d in map(torch.device, devices) if d.type == kind})
    states = [(g, g.get_state()) for g in generators]
    with torch.random.fork_rng(devices=indices, device_type=kind):
        try:
            yield
        finally:
            for g, state in states:
                g.set_state(state)

# The folder holding this ptlab package (a checkout's root, or site-packages).
PTLAB_ROOT = str(Path(__file__).resolve().parents[1])


def env_importing_this_ptlab(env: dict[str, str] | None = None) -> dict[str, str]:
    """A copy of `env` (default: this process's environment) whose PYTHONPATH starts with PTLAB_ROOT, so a child
    Python imports this ptlab, not one pip installed elsewhere. A `python -c` child still puts its working
    directory first: such a child inserts PTLAB_ROOT at the front of sys.path itself."""
    env = dict(os.environ if env is None else env)
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([PTLAB_ROOT, *paths])
    return env


def atomic_write(path: str | Path, write: Callable[[BinaryIO], object]) -> Path:
    """Call write(handle) on a temporary file beside `path`, flush it to disk, then rename it over `path`.

    A reader sees the old file or the whole new one, never a part: the rename is the only step that changes
    `path`, and a rename within one folder is atomic. The temporary file is `.<name>.<pid>.tmp`; it is removed
    when write raises (a killed writer leaves it). Creates the folder; returns `path`.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
