"""Private to ptlab.watch: the detectors fed by the wrapped GradScaler, clip_grad_norm_ and DataLoader.__iter__."""
from __future__ import annotations

import weakref
from typing import Any

import torch
from torch import nn

from .detectors import Detector, Sign, moment
from .report import WatchFinding


class Amp(Detector):
    """Mixed precision: float16 autocast without a GradScaler, and the scaler's calls in the wrong order."""

    NO_SCALER = Sign("fp16-without-scaler", "backward on a float16-autocast loss no enabled GradScaler scaled")
    CLIP_SCALED = Sign("clip-without-unscale", "clip_grad_norm_ on gradients still scaled by a GradScaler")
    UPDATE_FORGOTTEN = Sign("scaler-update-forgotten", "GradScaler.step twice with no update between")
    UPDATE_FIRST = Sign("scaler-update-before-step", "GradScaler.update with no step before it")

    def __init__(self, watch) -> None:
        super().__init__(watch)
        self.fp16_forward: tuple[str, int] | None = None
        self.scaled: dict[int, weakref.ref] = {}
        self.pending_scaler = None        # a scaler whose scaled gradients were not unscaled yet
        self.stepped: dict[tuple[int, int], bool] = {}   # (scaler, optimizer): stepped since the last update
        self.found: dict[str, WatchFinding] = {}

    def forward_pre(self, module: nn.Module, args: tuple, root: bool) -> None:
        if root and self.fp16_forward is None and torch.is_grad_enabled():   # an evaluation pass trains nothing
            for device in ("cuda", "cpu"):
                if torch.is_autocast_enabled(device) and torch.get_autocast_dtype(device) == torch.float16:
                    self.fp16_forward = (self.watch.module_name(module), self.watch.all_steps)

    def step_post(self, opt, step: int) -> None:
        self.fp16_forward = None          # what an earlier forward did is no longer this step's business

    def scaled_loss(self, scaler, result) -> None:
        if scaler.is_enabled() and isinstance(result, torch.Tensor):
            self.scaled[id(result)] = weakref.ref(result)

    def backward(self, tensor: torch.Tensor) -> None:
        ref = self.scaled.pop(id(tensor), None)
        scaled = ref is not None and ref() is tensor
        if scaled:
            self.pending_scaler = self.watch.last_scaler
        elif self.fp16_forward is not None and self.NO_SCALER.pitfall not in self.found:
            module, step = self.fp16_forward
            self.found[self.NO_SCALER.pitfall] = WatchFinding(
                self.NO_SCALER.pitfall,
                f"backward {moment(step)} ran on a loss computed under float16 autocast ({module}) that no enabled "
                f"GradScaler had scaled: gradients below float16's smallest value (6e-8) become 0",
                {"module": module, "optimizer steps before it": step, "autocast dtype": "float16"}, self.watch.where())
        self.fp16_forward = None

    def clip(self, norm: Any) -> None:
        if self.pending_scaler is not None and self.CLIP_SCALED.pitfall not in self.found:
            scale = self.pending_scaler.get_scale()
            seen = float(norm)
            self.found[self.CLIP_SCALED.pitfall] = WatchFinding(
                self.CLIP_SCALED.pitfall,
                f"clip_grad_norm_ {self.watch.moment()} clipped gradients still multiplied by the "
                f"GradScaler's scale ({scale:g}): it saw a norm of {seen:.4g}, the true one is about "
                f"{seen / scale:.4g}; call scaler.unscale_(optimizer) first",
                {"norm seen": seen, "scale": scale}, self.watch.where())

    def unscaled(self, scaler) -> None:
        self.pending_scaler = None
        self.watch.zero.unscaled_by(scaler)

    def scaler_step(self, scaler, optimizer=None) -> None:
        self.pending_scaler = None
        key = (id(scaler), id(optimizer))        # one scaler may step several optimizers before one update()
        if self.stepped.get(key) and self.UPDATE_FORGOTTEN.pitfall not in self.found:
            self.found[self.UPDATE_FORGOTTEN.pitfall] = WatchFinding(
                self.UPDATE_FORGOTTEN.pitfall,
                f"scaler.step() was called again {self.watch.moment()} with no scaler.update() since the "
                f"last one on the same optimizer", {"step": self.watch.step + 1}, self.watch.where())
        self.stepped[key] = True

    def scaler_update(self, scaler) -> None:
        stepped = any(v for (s, _), v in self.stepped.items() if s == id(scaler))
        if not stepped and scaler.is_enabled() and self.UPDATE_FIRST.pitfall not in self.found:
            self.found[self.UPDATE_FIRST.pitfall] = WatchFinding(
                self.UPDATE_FIRST.pitfall,
                f"scaler.update() was called with no scaler.step() before it ({self.watch.moment()})",
                {"step": self.watch.step}, self.watch.where())
        for key in self.stepped:
            if key[0] == id(scaler):
                self.stepped[key] = False

    def findings(self) -> list[WatchFinding]:
        return list(self.found.values())


class Samplers(Detector):
    """No set_epoch: a shuffling DistributedSampler iterated twice with the same epoch."""

    SAME_EPOCH = Sign("ddp-sampler-without-set-epoch",
                      "a shuffling DistributedSampler iterated again with the same epoch")

    def __init__(self, watch) -> None:
        super().__init__(watch)
        self.epochs: dict[int, list[int]] = {}
        self.found: WatchFinding | None = None

    def loader_iter(self, loader) -> None:
        from torch.utils.data.distributed import DistributedSampler

        sampler = getattr(loader, "sampler", None)
        if isinstance(sampler, DistributedSampler) and sampler.shuffle and self.found is None:
            seen = self.epochs.setdefault(id(sampler), [])
            if seen.count(sampler.epoch) >= 2:     # a third pass with one epoch: a peek plus one epoch is only 2
                self.found = WatchFinding(
                    self.SAME_EPOCH.pitfall,
                    f"a DataLoader with a shuffling DistributedSampler was iterated {len(seen) + 1} times, again "
                    f"with epoch {sampler.epoch}: every epoch gets the same order (call sampler.set_epoch(epoch))",
                    {"iterations": len(seen) + 1, "epoch": sampler.epoch}, self.watch.where())
            seen.append(sampler.epoch)

    def findings(self) -> list[WatchFinding]:
        return [self.found] if self.found else []
