"""Chapter 6's pitfall fixtures: the batches and models the reproductions share, an Outcome with long texts,
and a rerun in a fresh Python that sees no CUDA device."""
from __future__ import annotations

import math
import pickle
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from ptlab.core import PTLAB_ROOT, env_importing_this_ptlab
from ptlab.course.pitfall_record import Outcome


def _batch(seed: int = 0, n: int = 64, features: int = 8):
    """A fixed regression batch: X (n, features), y (n, 1)."""
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, features, generator=g)                                  # (n, F)
    y = X @ torch.randn(features, 1, generator=g) + 0.1 * torch.randn(n, 1, generator=g)  # (n, 1)
    return X, y


@dataclass(frozen=True)
class OutcomeWithTexts(Outcome):
    """An Outcome that keeps long texts (a warning in full) out of the side-by-side table: `outcome.texts`."""

    texts: dict[str, str] = field(default_factory=dict)


def _steps_until_error(step, n_steps: int) -> tuple[int, str]:
    """Run step() n_steps times; return how many completed and the first error as 'Type: message'."""
    for done in range(n_steps):
        try:
            step()
        except (RuntimeError, AssertionError) as error:
            return done, f"{type(error).__name__}: {error}"
    return n_steps, "none"


def _near_converged_mlp():
    """A 2-layer MLP whose output is small, so the loss gradients are tiny (as late in training)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    with torch.no_grad():
        model[2].weight.mul_(0.01)
        model[2].bias.zero_()
    return model


def _small_targets() -> tuple[torch.Tensor, torch.Tensor]:
    """A batch whose targets are tiny, so near _near_converged_mlp's outputs: X (1024, 32), y (1024, 1)."""
    g = torch.Generator().manual_seed(0)
    X = torch.randn(1024, 32, generator=g)                 # (1024, 32)
    y = 1e-4 * (X @ torch.randn(32, 1, generator=g))       # (1024, 1): small targets
    return X, y


def _zeroed_gradient_entries(model: nn.Module, reference: nn.Module) -> tuple[int, int]:
    """(entries of model's .grad that are 0 where reference's are not, entries non-zero in reference)."""
    pairs = [(p.grad, q.grad) for p, q in zip(model.parameters(), reference.parameters())]
    nonzero = sum((q != 0).sum().item() for _, q in pairs)
    zeroed = sum(((p == 0) & (q != 0)).sum().item() for p, q in pairs)
    return zeroed, nonzero


_RERUN_SCRIPT = """
import pickle, sys
sys.path.insert(0, {root!r})                 # before the working directory `-c` puts first
import torch
if torch.cuda.is_available():
    sys.exit("CUDA_VISIBLE_DEVICES='' did not hide CUDA from torch")
from {module} import {name} as reproduce
with open(sys.argv[1], "wb") as out:
    pickle.dump(reproduce(buggy={buggy}), out)
"""


def _rerun_without_cuda(reproduce, buggy: bool) -> Outcome:
    """reproduce(buggy) run in a fresh Python whose torch sees no CUDA device, as on a CPU-only machine."""
    env = {**env_importing_this_ptlab(), "CUDA_VISIBLE_DEVICES": ""}
    code = _RERUN_SCRIPT.format(root=PTLAB_ROOT, module=reproduce.__module__, name=reproduce.__name__,
                                buggy=bool(buggy))
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "outcome.pickle"
        run = subprocess.run([sys.executable, "-c", code, str(path)], env=env, capture_output=True, text=True,
                             timeout=300)
        if run.returncode != 0:
            raise RuntimeError(f"rerunning {reproduce.__name__} without CUDA failed (exit code {run.returncode}):\n"
                               f"{run.stderr[-2000:]}")
        with path.open("rb") as f:
            return pickle.load(f)


def _exact_if_not_finite(value: float) -> float | str:
    """inf and nan as exact text (they are the same on every machine); a finite value stays a measured float."""
    return value if math.isfinite(value) else str(value)


def _overflowing_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """A regression batch whose float16 gradients overflow at scales of 16384 and above: X (64, 8), y (64, 1)."""
    g = torch.Generator().manual_seed(1)
    X = torch.randn(64, 8, generator=g)                    # (64, 8)
    return X, X @ torch.randn(8, 1, generator=g)           # (64, 1)
