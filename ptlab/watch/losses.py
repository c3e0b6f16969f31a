"""Private to ptlab.watch: the detectors of the loss, what its function is given and the values it takes."""
from __future__ import annotations

import math
import weakref
from typing import Any

import torch
from torch import nn

from .detectors import SHAPE_LOSSES, Detector, Sign, floats
from .report import WatchFinding


class LossCalls(Detector):
    """What the losses are given: softmax output, shapes that broadcast, labels at chance, unshuffled batches."""

    SOFTMAX_FIRST = Sign("softmax-before-cross-entropy", "cross_entropy's input is the output of softmax")
    BROADCAST = Sign("broadcast-loss-shape", "mse_loss/l1_loss input and target broadcast to a larger shape")
    AT_CHANCE = Sign("shuffled-labels", "training cross-entropy still >= 0.95 ln(C) after >= 50 steps")
    UNSHUFFLED = Sign("shuffle-off-for-training", "first training batches hold < 2 distinct labels on average")

    def __init__(self, watch) -> None:
        super().__init__(watch)
        self.softmax_out: list[weakref.ref] = []
        self.found: dict[str, WatchFinding] = {}
        self.ce: list[torch.Tensor] = []         # training cross-entropy values
        self.classes = 0
        self.distinct: list[int] = []
        self.batch = 0
        self.where_first: str | None = None
        self.where_loss: str | None = None

    def call(self, name: str, args: tuple, kwargs: dict, result: Any) -> None:
        if name == "softmax":
            self.softmax_out = [r for r in self.softmax_out[-7:] if r() is not None] + [weakref.ref(result)]
            return
        if len(args) < 2 or not isinstance(args[0], torch.Tensor) or not isinstance(args[1], torch.Tensor):
            return
        x, target = args[0], args[1]
        if name == "cross_entropy":
            self._cross_entropy(x, target, result)
        elif name in SHAPE_LOSSES and x.shape != target.shape and self.BROADCAST.pitfall not in self.found:
            shape = torch.broadcast_shapes(x.shape, target.shape)
            if shape != x.shape:
                self.found[self.BROADCAST.pitfall] = WatchFinding(
                    self.BROADCAST.pitfall,
                    f"{name} at step {self.watch.step + 1} got input {tuple(x.shape)} and target "
                    f"{tuple(target.shape)}: they broadcast to {tuple(shape)}, so every prediction is compared "
                    f"with every target", {"input": list(x.shape), "target": list(target.shape),
                                           "broadcast to": list(shape)}, self.watch.where())

    def _cross_entropy(self, x: torch.Tensor, target: torch.Tensor, loss: torch.Tensor) -> None:
        from_softmax = type(x.grad_fn).__name__ == "SoftmaxBackward0" or any(r() is x for r in self.softmax_out)
        if from_softmax and self.SOFTMAX_FIRST.pitfall not in self.found:
            self.found[self.SOFTMAX_FIRST.pitfall] = WatchFinding(
                self.SOFTMAX_FIRST.pitfall,
                f"cross_entropy at step {self.watch.step + 1} got the output of softmax (shape {tuple(x.shape)}) "
                f"as its input: it applies log_softmax itself and wants raw logits",
                {"input made by": "softmax", "shape": list(x.shape)}, self.watch.where())
        training = torch.is_grad_enabled() and loss.requires_grad and self.watch.active
        if not training or x.ndim != 2 or target.ndim != 1 or target.dtype.is_floating_point:
            return
        self.classes = x.shape[1]
        if not self.ce:
            self.where_loss = self.watch.where()
        self.ce.append(loss.detach().clone())
        if len(self.distinct) < 10 and self.classes >= 3 and len(target) >= 2 * self.classes:
            self.distinct.append(target.unique().numel())
            self.batch = len(target)
            if len(self.distinct) == 1:
                self.where_first = self.watch.where()

    def findings(self) -> list[WatchFinding]:
        found = list(self.found.values())
        if len(self.distinct) >= 5:
            mean = sum(self.distinct) / len(self.distinct)
            if mean < 2:
                found.append(WatchFinding(
                    self.UNSHUFFLED.pitfall,
                    f"the first {len(self.distinct)} training batches of {self.batch} held {mean:.1f} distinct "
                    f"labels on average, of {self.classes} classes: the data comes class by class (shuffle=False?)",
                    {"distinct labels per batch": self.distinct, "classes": self.classes}, self.where_first))
        if len(self.ce) >= 50:
            values = floats(self.ce)
            last = sum(values[-20:]) / 20
            chance = math.log(self.classes)
            if last >= 0.95 * chance:
                found.append(WatchFinding(
                    self.AT_CHANCE.pitfall,
                    f"after {len(values)} training steps the cross-entropy is still {last:.3f} (mean of the last "
                    f"20), at chance: ln({self.classes}) = {chance:.3f}; the labels may not belong to their inputs, or "
                    f"the model has not started learning yet (a warm-up, a learning rate too small)",
                    {"steps": len(values), "loss, last 20": last, "ln(classes)": chance}, self.where_loss))
        return found


class LossValues(Detector):
    """NaN/inf in an input batch, a loss that becomes NaN/inf or keeps rising: watch inputs and the loss."""

    POISONED_INPUT = Sign("nan-from-a-poisoned-sample", "NaN/inf in a model's input batch")
    NON_FINITE_LOSS = Sign("exploding-gradients-nan", "a non-finite loss from finite inputs")
    LOSS_RISES = Sign("learning-rate-too-high", "the loss rising >= 30x above its first value and staying >= 3x")

    def __init__(self, watch) -> None:
        super().__init__(watch)
        self.inputs: list[tuple[torch.Tensor, int, str, str | None]] = []   # (count of non-finite, step, module, where)
        self.losses: list[torch.Tensor] = []
        self.loss_where: str | None = None
        self.check_modules = False
        self.first_bad_module: str | None = None

    def forward_pre(self, module: nn.Module, args: tuple, root: bool) -> None:
        if root and args and isinstance(args[0], torch.Tensor) and args[0].is_floating_point() and self.watch.active:
            if len(self.inputs) < 400:
                self.inputs.append(((~torch.isfinite(args[0].detach())).sum(), self.watch.step + 1,
                                    self.watch.module_name(module), None))

    def forward(self, module: nn.Module, output: Any, root: bool) -> None:
        if self.check_modules and self.first_bad_module is None and isinstance(output, torch.Tensor) \
                and output.is_floating_point() and not bool(torch.isfinite(output.detach()).all()):
            self.first_bad_module = f"{self.watch.module_name(module)} ({type(module).__name__})"

    def backward(self, tensor: torch.Tensor) -> None:
        if tensor.numel() == 1 and self.watch.active:
            self.losses.append(tensor.detach().reshape(()).clone())
            if self.loss_where is None:
                self.loss_where = self.watch.where()
            if not self.check_modules and len(self.losses) % 10 == 0:
                self.check_modules = not all(math.isfinite(v) for v in floats(self.losses[-10:]))

    def step_post(self, opt, step: int) -> None:
        # on the CPU every step (no cost); on an accelerator every 10th loss, in backward(): one sync per 10 steps
        if (not self.check_modules and self.losses and self.losses[-1].device.type == "cpu"
                and not math.isfinite(self.losses[-1].item())):
            self.check_modules = True

    def findings(self) -> list[WatchFinding]:
        found = []
        bad_inputs = [(int(n), step, module) for n, step, module, _ in self.inputs if int(n)]
        losses = floats(self.losses)
        bad_loss = next((i for i, v in enumerate(losses) if not math.isfinite(v)), None)
        if bad_inputs:
            n, step, module = bad_inputs[0]
            found.append(WatchFinding(
                self.POISONED_INPUT.pitfall,
                f"the input batch of {module} at step {step} held {n} NaN/inf value(s)"
                + (f"; the loss was not finite from backward number {bad_loss + 1} on" if bad_loss is not None
                   else ""),
                {"step": step, "non-finite input values": n, "batches with them": len(bad_inputs),
                 "first non-finite loss at step": None if bad_loss is None else bad_loss + 1}, self.loss_where))
        elif bad_loss is not None:
            finite = [v for v in losses[:bad_loss]]
            found.append(WatchFinding(
                self.NON_FINITE_LOSS.pitfall,
                f"the loss became {losses[bad_loss]} at backward number {bad_loss + 1}, from finite inputs"
                + (f" after rising from {finite[0]:.3g} to {max(finite):.3g}" if finite else "")
                + (f"; after that, the first module with a non-finite output was {self.first_bad_module}"
                   if self.first_bad_module else
                   "; no module's output was non-finite: the loss computation itself made it (a log of 0? "
                   "a division by 0?)" if self.check_modules else ""),
                {"first non-finite loss at step": bad_loss + 1, "largest finite loss": max(finite) if finite else None,
                 "first non-finite module": self.first_bad_module}, self.loss_where))
        elif len(losses) >= 10 and losses[0] > 0:
            peak = max(losses)
            last = sum(losses[-5:]) / 5
            if peak >= 30 * losses[0] and last >= 3 * losses[0]:
                found.append(WatchFinding(
                    self.LOSS_RISES.pitfall,
                    f"the loss rose from {losses[0]:.3g} (step 1) to {peak:.3g} (step {losses.index(peak) + 1}) "
                    f"and is still {last:.3g} over the last 5 steps: the steps are far too large",
                    {"first loss": losses[0], "largest loss": peak, "last 5 steps": last}, self.loss_where))
        return found
