"""Private to ptlab.watch: the detectors of the loss, what its function is given and the values it takes."""
from __future__ import annotations

import math
import weakref
from typing import Any

import torch
from torch import nn

from .detectors import LOSS_CALLS, SHAPE_LOSSES, Detector, Sign, floats, moment
from .report import WatchFinding

_MAX_CLASSES = 1024           # label statistics are kept for classifiers up to this many classes
_MAX_BATCHES = 200            # and for this many training batches


class LossCalls(Detector):
    """What the losses are given: softmax output, shapes that broadcast, labels at chance, unshuffled batches."""

    SOFTMAX_FIRST = Sign("softmax-before-cross-entropy", "cross_entropy's input is the output of softmax")
    BROADCAST = Sign("broadcast-loss-shape", "mse_loss/l1_loss input and target both broadcast to a larger shape")
    AT_CHANCE = Sign("shuffled-labels", "a hint: with balanced labels, training cross-entropy within 5% of ln(C) "
                                        "after >= 50 cross-entropy calls, although the weights moved >= 20%", hint=True)
    UNSHUFFLED = Sign("shuffle-off-for-training",
                      "training batches of (nearly) one class each, or labels in sorted order, while several classes "
                      "appear over the run")

    def __init__(self, watch) -> None:
        super().__init__(watch)
        self.softmax_out: list[weakref.ref] = []
        self.checked_rows = 0
        self.found: dict[str, WatchFinding] = {}
        self.ce: list[torch.Tensor] = []         # training cross-entropy values
        self.classes = 0
        self.counts: torch.Tensor | None = None  # labels seen per class, over the training batches
        self.batch: list[tuple[int, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]] = []
        self.targets: list[torch.Tensor] = []
        self.where_first: str | None = None
        self.where_loss: str | None = None
        self.sequential = False                  # whether a shuffle=False DataLoader yielded the first batch's labels
        self.moved_at_end: float | None = None   # how far the weights moved by the last watched step
        self.start: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}   # id(opt) -> [(param, sample)]

    def step_pre(self, opt, step: int) -> None:
        if id(opt) not in self.start:           # a strided sample of every weight, to measure how far they moved
            self.start[id(opt)] = [(p, self._sample(p).clone()) for g in opt.param_groups for p in g["params"]]

    def step_post(self, opt, step: int) -> None:
        if step == self.watch.steps:            # the last watched step: what runs after it is not measured
            self.moved_at_end = self.moved()

    @staticmethod
    def _sample(p: torch.Tensor) -> torch.Tensor:
        flat = p.detach().reshape(-1)
        return flat[:: max(1, flat.numel() // 512)].float()

    def moved(self) -> float | None:
        """How far the weights moved since the first step, relative to their norm then: estimated from strided
        samples, each scaled to the size of its tensor."""
        pairs = [(self._sample(p), s, p.numel() / s.numel()) for pairs in self.start.values() for p, s in pairs
                 if p.numel()]
        if not pairs:
            return None
        before = torch.stack([s.square().sum() * k for _, s, k in pairs]).sum().sqrt()
        change = torch.stack([(now - s).square().sum() * k for now, s, k in pairs]).sum().sqrt()
        return float(change / before) if float(before) > 0 else None

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
            if shape != x.shape and shape != target.shape:     # both stretched: (B, 1) against (B,) gives (B, B)
                self.found[self.BROADCAST.pitfall] = WatchFinding(
                    self.BROADCAST.pitfall,
                    f"{name} {self.watch.moment()} got input {tuple(x.shape)} and target "
                    f"{tuple(target.shape)}: they broadcast to {tuple(shape)}, so every prediction is compared "
                    f"with every target", {"input": list(x.shape), "target": list(target.shape),
                                           "broadcast to": list(shape)}, self.watch.where(), since=self.watch.step + 1)

    def _cross_entropy(self, x: torch.Tensor, target: torch.Tensor, loss: torch.Tensor) -> None:
        if self.SOFTMAX_FIRST.pitfall not in self.found:
            made = "the output of softmax" if type(x.grad_fn).__name__ == "SoftmaxBackward0" or any(
                r() is x for r in self.softmax_out) else self._probabilities(x)
            if made:
                self.found[self.SOFTMAX_FIRST.pitfall] = WatchFinding(
                    self.SOFTMAX_FIRST.pitfall,
                    f"cross_entropy {self.watch.moment()} got {made} (shape {tuple(x.shape)}) as its input: "
                    f"it applies log_softmax itself and wants raw logits",
                    {"input": made, "shape": list(x.shape)}, self.watch.where(), since=self.watch.step + 1)
        training = torch.is_grad_enabled() and loss.requires_grad and self.watch.active
        if not training or x.ndim != 2 or target.ndim != 1 or target.dtype.is_floating_point or loss.numel() != 1:
            return
        if not self.ce:
            self.classes, self.where_loss = x.shape[1], self.watch.where()
            self.sequential = any(r() is target for r in self.watch.sequential_batch)
        if x.shape[1] != self.classes:
            return                              # another head: the statistics follow the first one
        self.ce.append(loss.detach().clone())
        if 2 <= self.classes <= _MAX_CLASSES and len(target) >= 2 and len(self.targets) < _MAX_BATCHES:
            self.targets.append(target.detach())                # label statistics are computed when the watch ends
            if len(self.targets) == 1:
                self.where_first = self.watch.where()

    def _label_stats(self) -> None:
        """Per batch: size, distinct labels, whether sorted, first and last label; and the labels seen per class."""
        counts = None
        for target in self.targets:
            valid = (target >= 0) & (target < self.classes)     # ignore_index (-100) is not a class
            batch = torch.zeros(self.classes, device=target.device).scatter_add_(
                0, target.clamp(0, self.classes - 1), valid.float())
            counts = batch if counts is None else counts + batch
            self.batch.append((len(target), (batch > 0).sum(), (target[1:] >= target[:-1]).all(), target[0],
                               target[-1]))
        self.counts = counts

    def _probabilities(self, x: torch.Tensor) -> str | None:
        """For the first few inputs, whether every row is a probability vector (a softmax under another name)."""
        self.checked_rows += 1
        if self.checked_rows > 3 or x.ndim != 2 or x.shape[1] < 2 or not x.is_floating_point():
            return None
        x = x.detach().float()
        rows = torch.stack([x.min(), (x.sum(dim=1) - 1).abs().max()]).tolist()
        return "rows that are probabilities (each non-negative, summing to 1)" if rows[0] >= 0 and rows[1] < 1e-3 \
            else None

    def _unshuffled(self) -> WatchFinding | None:
        if len(self.batch) < 5 or self.counts is None:
            return None
        sizes = sorted(b[0] for b in self.batch)
        size = sizes[len(sizes) // 2]
        distinct = floats([b[1] for b in self.batch])
        ordered = floats([b[2] for b in self.batch])
        edges = floats([torch.stack([b[3], b[4]]) for b in self.batch])
        counts = self.counts.float().cpu()
        seen = int((counts > 0).sum())
        share = counts[counts > 0] / counts.sum()
        expected = float((1 - (1 - share) ** size).sum())       # distinct labels in a shuffled batch of this size
        mean = sum(distinct) / len(distinct)
        rising = sum(b[0] >= a[1] for a, b in zip(edges, edges[1:])) / (len(edges) - 1)
        sorted_order = sum(ordered) / len(ordered) >= 0.9 and rising >= 0.9 and size >= 4
        if seen < 2 or expected < 2.5 or mean > expected / 2 or not (mean < 2 or sorted_order):
            return None
        how = ("in sorted label order" if mean >= 2 else "one class at a time")
        loader = " (its DataLoader has shuffle=False)" if self.sequential else ""
        return WatchFinding(
            self.UNSHUFFLED.pitfall,
            f"the first {len(distinct)} training batches of {size} held {mean:.2f} distinct labels on average, "
            f"while {seen} classes appeared over them (a shuffled batch of {size} would hold about {expected:.1f}): "
            f"the training data comes {how}{loader}",
            {"batches": len(distinct), "distinct labels per batch": round(mean, 3), "classes seen": seen,
             "expected if shuffled": round(expected, 3), "batches in sorted order": sum(ordered)},
            self.where_first, since=1)

    def _at_chance(self) -> WatchFinding | None:
        if len(self.ce) < 50 or self.counts is None or int((self.counts > 0).sum()) < 2:
            return None
        values = floats(self.ce)
        last = sum(values[-20:]) / 20
        share = self.counts.float().cpu() / self.counts.sum().cpu()
        entropy = float(-(share[share > 0] * share[share > 0].log()).sum())
        chance = math.log(self.classes)
        moved = self.moved_at_end if self.moved_at_end is not None else self.moved()
        if entropy < 0.95 * chance:
            return None                 # unbalanced labels (a language model's characters): chance is no landmark
        if moved is None or not math.isfinite(last) or not math.isfinite(moved):
            return None                 # a NaN is at no distance from chance
        if abs(last / chance - 1) > 0.05 or moved < 0.2:
            return None
        steps = self.watch.step
        calls = f" ({len(values)} cross-entropy calls)" if len(values) != steps else ""
        return WatchFinding(
            self.AT_CHANCE.pitfall,
            f"after {steps} optimizer steps{calls} the training cross-entropy is still {last:.3f} (mean of its last "
            f"20), within {abs(last / chance - 1):.0%} of chance (ln({self.classes}) = {chance:.3f}, the labels being "
            f"balanced), although the optimizer changed the weights by {moved:.0%} of their norm: the model moves "
            f"but has not left chance. Either the labels do not belong to their inputs (check them), or the model "
            f"has not learned the task yet (too few steps, a learning rate too small, a task too hard for it)",
            {"optimizer steps": steps, "cross-entropy calls": len(values), "loss, last 20": last, "chance": chance,
             "label entropy": entropy, "weights moved (relative)": moved}, self.where_loss, certain=False,
            since=steps)

    def findings(self) -> list[WatchFinding]:
        found = list(self.found.values())
        self._label_stats()
        return found + [f for f in (self._unshuffled(), self._at_chance()) if f is not None]


class LossValues(Detector):
    """NaN/inf in an input batch, a loss that becomes NaN/inf or keeps rising: watch inputs and each loss."""

    POISONED_INPUT = Sign("nan-from-a-poisoned-sample",
                          "NaN/inf in a model's input batch when its output came out non-finite (a model that fills "
                          "NaN-marked missing values itself does not), or in a loss's target when that loss did")
    NON_FINITE_LOSS = Sign("exploding-gradients-nan", "a non-finite loss from finite inputs and targets")
    LOSS_RISES = Sign("learning-rate-too-high",
                      "a loss made by a loss function, backpropagated at one line, rising >= 30x above its first value "
                      "and staying >= 3x")

    def __init__(self, watch) -> None:
        super().__init__(watch)
        # (count of non-finite values, optimizer steps before, what held them, where), until the first bad one
        self.inputs: list[tuple[torch.Tensor, int, str, str | None]] = []
        self.bad_input: tuple[int, int, str] | None = None
        self.outputs: list[weakref.ref] = []     # the last root outputs: a model's input made by one is no sample
        self.pending: tuple[torch.Tensor, str] | None = None    # a root's input batch, until its output is seen
        self.losses: dict[str | None, list[tuple[int, torch.Tensor]]] = {}  # where backward ran -> (step, loss)
        self.recent: list[torch.Tensor] = []
        self.count = 0                           # scalar losses backpropagated
        self.minimised: set[str | None] = set()  # the series made by a loss function (cross_entropy, mse_loss...)
        self.check_modules = False
        self.checked = 0                         # forward passes checked for a non-finite output
        self.first_bad: tuple[str, bool | None] | None = None   # (module, own weights all finite; None: it has none)

    def _keep(self, values: torch.Tensor, what: str, counts: torch.Tensor | None = None) -> None:
        """Count a batch's non-finite values without a sync; every 400 batches, look (and stop at the first bad)."""
        if self.bad_input is not None:
            return
        n = (~torch.isfinite(values.detach())).sum()
        self.inputs.append((n if counts is None else n * counts, self.watch.step, what, None))
        if len(self.inputs) >= 400:
            self._first_bad_input()
            self.inputs = []

    def _first_bad_input(self) -> None:
        if self.bad_input is None and self.inputs:
            counts = floats([n for n, _, _, _ in self.inputs])
            bad = next((i for i, n in enumerate(counts) if n), None)
            if bad is not None:
                _, step, what, _ = self.inputs[bad]
                self.bad_input = (int(counts[bad]), step, what)

    def forward_pre(self, module: nn.Module, args: tuple, root: bool) -> None:
        if root and args and isinstance(args[0], torch.Tensor) and args[0].is_floating_point():
            x = args[0]
            if x.grad_fn is not None or any(r() is x for r in self.outputs):
                return                           # an activation (one model's output fed to another), not a sample
            self.pending = (x, f"the input batch of {self.watch.module_name(module)}")

    def call(self, name: str, args: tuple, kwargs: dict, result: Any) -> None:
        if name not in LOSS_CALLS or len(args) < 2 or not isinstance(args[1], torch.Tensor) \
                or not args[1].is_floating_point() or not isinstance(result, torch.Tensor):
            return
        # a target's non-finite values count only where the loss came out non-finite (a masked NaN does not)
        self._keep(args[1], f"the target of {name}", (~torch.isfinite(result.detach())).any())

    def forward(self, module: nn.Module, output: Any, root: bool) -> None:
        if root and self.pending is not None:      # an input's NaN counts only where the output came out non-finite
            x, what = self.pending
            self.pending = None
            bad_out = (~torch.isfinite(output.detach())).any() \
                if isinstance(output, torch.Tensor) and output.is_floating_point() else None
            self._keep(x, what, bad_out)
        if root and isinstance(output, torch.Tensor):
            self.outputs = [r for r in self.outputs[-3:] if r() is not None] + [weakref.ref(output)]
        if not self.check_modules or self.first_bad is not None:
            return
        if isinstance(output, torch.Tensor) and output.is_floating_point() \
                and not bool(torch.isfinite(output.detach()).all()):
            own = list(module.parameters(recurse=False))
            finite = all(bool(torch.isfinite(p.detach()).all()) for p in own) if own else None
            self.first_bad = (f"{self.watch.module_name(module)} ({type(module).__name__})", finite)
        elif root:
            self.checked += 1

    def backward(self, tensor: torch.Tensor) -> None:
        if tensor.numel() == 1:
            value = tensor.detach().reshape(()).clone()
            where = self.watch.where(frames=2)          # one series per line (and caller): a GAN's two losses apart
            self.losses.setdefault(where, []).append((self.watch.step + 1, value))
            if self.watch.graphs._lookup(tensor) is not None:
                self.minimised.add(where)               # made by a loss function, not a policy gradient's sum
            self.recent = self.recent[-9:] + [value]
            self.count += 1
            if not self.check_modules and self.count % 10 == 0:
                self.check_modules = not all(math.isfinite(v) for v in floats(self.recent))

    def step_post(self, opt, step: int) -> None:
        # on the CPU every step (no cost); on an accelerator every 10th loss, in backward(): one sync per 10 steps
        if not self.check_modules and self.recent and self.recent[-1].device.type == "cpu" \
                and not math.isfinite(self.recent[-1].item()):
            self.check_modules = True

    def _non_finite(self, where: str | None, steps: list[int], losses: list[float], bad: int) -> WatchFinding:
        finite = losses[:bad]
        if self.first_bad is not None:
            module, own_finite = self.first_bad
            after = (f"; in the forward passes after it, the first module whose output was non-finite was {module}"
                     + (" (its own weights were still finite)" if own_finite else
                        " (it has no parameters of its own; no module that returned before it in that pass gave a "
                        "non-finite tensor)" if own_finite is None else
                        " (its own weights were already non-finite, written by a step)"))
        elif self.checked:
            after = (f"; in the {self.checked} forward pass(es) checked after it, no module's output was "
                     f"non-finite: the loss computation itself made it (a log of 0? a division by 0?)")
        else:
            after = ""                           # no forward ran after it was seen: nothing was checked
        rose = bool(finite) and finite[0] > 0 and max(finite) >= 3 * finite[0]
        if rose:
            before = f" after rising from {finite[0]:.3g} to {max(finite):.3g}"
        else:                                    # nothing grew before it: no sign of exploding gradients, a hint
            before = ((f" (its last finite value was {finite[-1]:.3g}, and it had not risen before)" if finite else "")
                      + "; nothing measured shows a gradient that grew: look at the loss computation too (a division "
                        "by 0? a log of 0?)")
        return WatchFinding(
            self.NON_FINITE_LOSS.pitfall,
            f"the loss became {losses[bad]} at step {steps[bad]}, from finite inputs and targets{before}{after}",
            {"first non-finite loss at step": steps[bad], "largest finite loss": max(finite) if finite else None,
             "first non-finite module": self.first_bad[0] if self.first_bad else None,
             "forward passes checked": self.checked}, where, certain=rose, since=steps[bad])

    def findings(self) -> list[WatchFinding]:
        self._first_bad_input()
        series = {where: ([s for s, _ in v], floats([t for _, t in v])) for where, v in self.losses.items()}
        if self.bad_input is not None:
            n, step, what = self.bad_input
            where = next(iter(series), None)
            where = where and where.split(" <- ")[0]
            return [WatchFinding(
                self.POISONED_INPUT.pitfall, f"{what} {moment(step)} held {n} NaN/inf value(s)",
                {"optimizer steps before it": step, "non-finite values": n, "in": what}, where, since=step + 1)]
        found = []
        for where, (steps, losses) in series.items():
            bad = next((i for i, v in enumerate(losses) if not math.isfinite(v)), None)
            if bad is not None:
                found.append(self._non_finite(where and where.split(" <- ")[0], steps, losses, bad))
            elif len(losses) >= 10 and losses[0] > 0 and where in self.minimised:
                peak = max(losses)
                last = sum(losses[-5:]) / 5
                if peak >= 30 * losses[0] and last >= 3 * losses[0]:
                    at = losses.index(peak)
                    found.append(WatchFinding(
                        self.LOSS_RISES.pitfall,
                        f"the loss rose from {losses[0]:.3g} (step {steps[0]}) to {peak:.3g} (step {steps[at]}) "
                        f"and is still {last:.3g} over its last 5 steps, {last / losses[0]:.3g}x where it started",
                        {"first loss": losses[0], "largest loss": peak, "last 5 steps": last}, where.split(" <- ")[0],
                        since=next(s for s, v in zip(steps, losses) if v >= 3 * losses[0])))
        found.sort(key=lambda f: f.since)
        return found[:1]
