"""Private to ptlab.watch: what a detector is, and the detectors of gradients, graphs and layer modes."""
from __future__ import annotations

import math
import sys
import weakref
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .report import WatchFinding

LOSS_CALLS = {"cross_entropy", "nll_loss", "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss",
              "binary_cross_entropy", "binary_cross_entropy_with_logits", "kl_div"}
SHAPE_LOSSES = {"mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss"}
SUM_CALLS = {"add", "add_", "__add__", "__radd__", "__iadd__", "sub", "__sub__", "mul", "__mul__", "__rmul__",
             "div", "__truediv__", "div_", "__itruediv__", "true_divide"}


def floats(values: list[torch.Tensor]) -> list[float]:
    return torch.stack([v.float().cpu() for v in values]).tolist() if values else []


def _ratios(values: list[float]) -> str:
    return ", ".join(f"{v / values[0]:.1f}x" for v in values) if values and values[0] else "-"


@dataclass(frozen=True)
class Sign:
    """A registered pitfall a detector finds, and the sign of it that the detector looks for."""

    pitfall: str
    sign: str


class Detector:
    """Base: the pitfalls found are `Sign` class attributes; every callback is optional; `findings()` is called once,
    when the watch ends."""

    def __init__(self, watch) -> None:
        self.watch = watch

    @classmethod
    def signs(cls) -> list[Sign]:
        """The pitfalls this detector finds, in the order declared."""
        return [value for value in vars(cls).values() if isinstance(value, Sign)]

    def findings(self) -> list[WatchFinding]:
        return []


class ZeroGrad(Detector):
    """No zero_grad: the same .grad tensors carry over from step to step, only added to."""

    NOT_ZEROED = Sign("missing-zero-grad", "the same .grad tensors only added to over >= 3 optimizer steps")
    NOT_ZEROED_IN_TRAINING = Sign("missing-zero-grad-training",
                                  "the same, over >= 10 optimizer steps of a training loop")

    def __init__(self, watch) -> None:
        super().__init__(watch)
        self.last: dict[int, tuple[dict, int]] = {}   # id(opt) -> ({id(p): (ref(grad), version)}, backwards)
        self.streak: list[tuple[int, torch.Tensor]] = []   # (step, grad norm) of steps whose grads were not reset
        self.best: list[tuple[int, torch.Tensor]] = []
        self.previous_norm: torch.Tensor | None = None
        self.where = None

    @staticmethod
    def _grads(opt) -> dict[int, torch.Tensor]:
        return {id(p): p.grad for g in opt.param_groups for p in g["params"] if p.requires_grad and p.grad is not None}

    def step_pre(self, opt, step: int) -> None:
        grads = self._grads(opt)
        previous = self.last.get(id(opt))
        if not grads:
            return
        norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(list(grads.values()))))
        if previous is None:
            self.previous_norm = norm
            return
        snapshot, backwards = previous
        new = self.watch.backwards - backwards
        common = [k for k in grads if k in snapshot]
        kept = bool(common) and new >= 1 and all(
            snapshot[k][0]() is grads[k] and 1 <= grads[k]._version - snapshot[k][1] <= new for k in common)
        if kept and self.previous_norm is not None:
            if not self.streak:
                self.streak = [(step - 1, self.previous_norm)]
                self.where = self.watch.where()
            self.streak.append((step, norm))
            if len(self.streak) > len(self.best):
                self.best = list(self.streak)
        else:
            self.streak = []
        self.previous_norm = norm

    def step_post(self, opt, step: int) -> None:
        grads = self._grads(opt)
        self.last[id(opt)] = ({k: (weakref.ref(g), g._version) for k, g in grads.items()}, self.watch.backwards)

    def findings(self) -> list[WatchFinding]:
        if len(self.best) < 3:
            return []
        steps = [s for s, _ in self.best]
        norms = floats([n for _, n in self.best])
        shown = norms[:5]
        found = [WatchFinding(
            self.NOT_ZEROED.pitfall,
            f"over optimizer steps {steps[0]}-{steps[-1]} the same .grad tensors were only added to (never reset "
            f"between steps: no zero_grad); the gradient norm went {_ratios(shown)} of step {steps[0]}'s",
            {"steps": [steps[0], steps[-1]], "grad norm": [round(v, 6) for v in shown]}, self.where)]
        if len(steps) >= 10:
            found.append(WatchFinding(
                self.NOT_ZEROED_IN_TRAINING.pitfall,
                f"a training loop ran {len(steps)} optimizer steps (steps {steps[0]}-{steps[-1]}) without resetting "
                f".grad: every step used the sum of all earlier gradients (norm at the last step "
                f"{norms[-1] / norms[0]:.1f}x the first)" if norms[0] and math.isfinite(norms[0])
                and math.isfinite(norms[-1]) else
                f"a training loop ran {len(steps)} optimizer steps without resetting .grad",
                {"steps without reset": len(steps), "grad norm first, last": [norms[0], norms[-1]]}, self.where))
        return found


class FrozenUpdated(Detector):
    """A frozen backbone: parameters with requires_grad=False still hold a .grad and the step moves them."""

    UPDATED = Sign("frozen-backbone-still-updated", "requires_grad=False parameters with a .grad changed by a step")

    def __init__(self, watch) -> None:
        super().__init__(watch)
        self.before: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.found: WatchFinding | None = None

    def step_pre(self, opt, step: int) -> None:
        if self.found is None:
            self.before = [(p, p.detach().clone()) for g in opt.param_groups for p in g["params"]
                           if not p.requires_grad and p.grad is not None]

    def step_post(self, opt, step: int) -> None:
        if self.found is None and self.before:
            changes = [(p.detach() - b).abs().max() for p, b in self.before]
            moved = [c for c in floats(changes) if c > 0]
            if moved:
                self.found = WatchFinding(
                    self.UPDATED.pitfall,
                    f"optimizer step {step}: {len(self.before)} parameter tensors with requires_grad=False still "
                    f"had a .grad (not None), and the step changed {len(moved)} of them (largest change "
                    f"{max(moved):.3g})", {"step": step, "frozen with a grad": len(self.before),
                                            "changed": len(moved), "largest change": max(moved)},
                    self.watch.where())
            self.before = []

    def findings(self) -> list[WatchFinding]:
        return [self.found] if self.found else []


class Graphs(Detector):
    """Graphs that no backward will ever free: a running total of losses, evaluation outputs with a grad_fn."""

    EVAL_KEEPS_GRAPH = Sign("eval-without-no-grad",
                            "eval-mode forwards with grad enabled, no backward, outputs kept alive")
    RUNNING_TOTAL = Sign("running-loss-keeps-graph",
                         "a sum of >= 3 forwards' loss tensors with a grad_fn, never backpropagated")

    def __init__(self, watch) -> None:
        super().__init__(watch)
        self.tracked: dict[int, tuple[weakref.ref, frozenset[int]]] = {}
        self.candidates: dict[int, tuple[weakref.ref, frozenset[int], str | None]] = {}
        self.eval_outputs: list[weakref.ref] = []
        self.eval_found: WatchFinding | None = None
        self.forwards_with_graph = 0

    def _lookup(self, value: Any) -> frozenset[int] | None:
        if isinstance(value, torch.Tensor) and id(value) in self.tracked:
            ref, forwards = self.tracked[id(value)]
            if ref() is value:
                return forwards
        return None

    def call(self, name: str, args: tuple, kwargs: dict, result: Any) -> None:
        if not isinstance(result, torch.Tensor) or result.grad_fn is None:
            return
        if name in LOSS_CALLS:
            self.tracked[id(result)] = (weakref.ref(result), frozenset([self.watch.forwards]))
            return
        sets = [s for s in (self._lookup(a) for a in args[:2]) if s is not None]
        if not sets:
            return
        forwards = frozenset().union(*sets)
        self.tracked[id(result)] = (weakref.ref(result), forwards)
        if len(forwards) >= 3 and name in {"add", "add_", "__add__", "__radd__", "__iadd__"}:
            old = self.candidates.get(id(result))
            where = old[2] if old else self.watch.where()
            self.candidates[id(result)] = (weakref.ref(result), forwards, where)
        if len(self.tracked) > 4096:
            self.tracked = {k: v for k, v in self.tracked.items() if v[0]() is not None}

    def backward(self, tensor: torch.Tensor) -> None:
        self.candidates.pop(id(tensor), None)
        # A sum of losses that this backward goes through (gradient accumulation, an unrolled sequence, a mean
        # taken afterwards) had its graphs freed: it is not a running total.
        covered = self._lookup(tensor)
        if covered:
            self.candidates = {k: c for k, c in self.candidates.items() if not c[1] <= covered}
        self.eval_outputs = []

    def forward(self, module: nn.Module, output: Any, root: bool) -> None:
        if not root or module.training or not torch.is_grad_enabled() or self.eval_found is not None:
            return
        tensor = output if isinstance(output, torch.Tensor) else None
        if tensor is None or tensor.grad_fn is None:
            return
        alive = sum(r() is not None for r in self.eval_outputs)
        self.eval_outputs.append(weakref.ref(tensor))
        if alive >= 2:
            self.eval_found = WatchFinding(
                self.EVAL_KEEPS_GRAPH.pitfall,
                f"{alive + 1} forward passes of {type(module).__name__} in eval mode ran with gradients enabled and "
                f"no backward between them; their outputs, still alive, keep every pass's graph and activations "
                f"(use torch.no_grad() or torch.inference_mode())",
                {"forwards": alive + 1, "outputs alive with a grad_fn": alive + 1}, self.watch.where())

    def findings(self) -> list[WatchFinding]:
        found = [self.eval_found] if self.eval_found else []
        if self.candidates:
            _, forwards, where = max(self.candidates.values(), key=lambda c: len(c[1]))
            n = len(forwards)
            found.append(WatchFinding(
                self.RUNNING_TOTAL.pitfall,
                f"a tensor summing the losses of {n} forward passes carries a grad_fn and was never "
                f"backpropagated: it keeps every batch's graph alive (add loss.item() instead)",
                {"forward passes summed": n}, where))
        return found


def _inside_checkpoint() -> bool:
    """Whether this call runs inside torch.utils.checkpoint (looked up only when a finding is about to be made)."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_globals.get("__name__") == "torch.utils.checkpoint":
            return True
        frame = frame.f_back
    return False


class Modes(Detector):
    """Layers running in train mode by mistake: inside a no-grad pass, or a frozen BatchNorm."""

    TRAIN_MODE_IN_EVAL = Sign("eval-without-eval-mode", "BatchNorm or Dropout in train mode inside a no-grad pass")
    FROZEN_BN_TRAINING = Sign("frozen-backbone-batchnorm-train-mode",
                              "a BatchNorm with frozen parameters running in train mode")

    def __init__(self, watch) -> None:
        super().__init__(watch)
        self.found: dict[str, tuple[WatchFinding, nn.Module | None, torch.Tensor | None]] = {}

    def forward_pre(self, module: nn.Module, args: tuple, root: bool) -> None:
        if not module.training:
            return
        is_bn = isinstance(module, nn.modules.batchnorm._BatchNorm) and module.track_running_stats \
            and module.momentum is not None
        is_dropout = isinstance(module, nn.modules.dropout._DropoutNd) and module.p > 0
        if not (is_bn or is_dropout):
            return
        name = self.watch.module_name(module)
        frozen_bn = is_bn and module.affine and not module.weight.requires_grad
        if not torch.is_grad_enabled() and self.TRAIN_MODE_IN_EVAL.pitfall not in self.found and _inside_checkpoint():
            return      # reentrant checkpointing runs the forward under no_grad: training, not evaluation
        if not torch.is_grad_enabled() and not frozen_bn and self.TRAIN_MODE_IN_EVAL.pitfall not in self.found:
            what = "updates its running statistics from this batch" if is_bn else "drops activations at random"
            self.found[self.TRAIN_MODE_IN_EVAL.pitfall] = (WatchFinding(
                self.TRAIN_MODE_IN_EVAL.pitfall,
                f"{name} ({type(module).__name__}) ran in train mode inside a no-grad pass (after step "
                f"{self.watch.step}): it {what}; if this pass evaluates the model, call model.eval() first",
                {"module": name, "type": type(module).__name__, "step": self.watch.step},
                self.watch.where(outside_forward=True)),
                module if is_bn else None, module.running_mean.detach().clone() if is_bn else None)
        elif frozen_bn and self.FROZEN_BN_TRAINING.pitfall not in self.found:
            self.found[self.FROZEN_BN_TRAINING.pitfall] = (WatchFinding(
                self.FROZEN_BN_TRAINING.pitfall,
                f"{name} ({type(module).__name__}) is frozen (requires_grad=False) but ran in train mode at step "
                f"{self.watch.step + 1}: its running statistics keep moving to the new data",
                {"module": name, "step": self.watch.step + 1}, self.watch.where(outside_forward=True)),
                module, module.running_mean.detach().clone())

    def findings(self) -> list[WatchFinding]:
        out = []
        for finding, module, before in self.found.values():
            if module is not None:
                drift = (module.running_mean.detach() - before).abs().max().item()
                finding.evidence["running_mean moved by (max)"] = drift
                finding.message += f" (its running_mean has moved by up to {drift:.3g} since)"
            out.append(finding)
        return out
