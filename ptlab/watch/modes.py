"""Private to ptlab.watch: layers left in train mode where they should not be (an evaluation of the trained model in
train mode, a frozen backbone's BatchNorm that keeps learning statistics).

Which model a pass belongs to decides what it means. A model none of whose parameters an optimizer stepped is a copy
(an EMA or mean teacher, a MoCo key encoder, a distillation teacher): running it in train mode can be the design, so
it gets no finding while something else trains (when nothing trains at all, the script is an evaluation). For the
trained model, a forward pass in train mode that no backward uses is an evaluation, unless it is part of training
itself: it recurs in most training iterations (fakes for a GAN's discriminator, pseudo-labels) and no loss under
no_grad took its output as its input (a validation loss after every step does), it repeats one input (Monte Carlo
dropout: the same input again, or one batch tiled k >= 2 times in one pass), the model's other BatchNorm or Dropout
layers were put in eval mode on purpose, or it runs inside torch.utils.checkpoint or swa_utils.update_bn.
"""
from __future__ import annotations

import sys
import weakref
from collections import Counter
from typing import Any

import torch
from torch import nn

from .detectors import LOSS_CALLS, Detector, Sign, floats, moment
from .report import WatchFinding

_BN, _DROPOUT = nn.modules.batchnorm._BatchNorm, nn.modules.dropout._DropoutNd
_MAX_PASSES = 4000


def _inside(*modules: str) -> bool:
    """Whether this call runs inside a function of one of these modules (looked up only when a pass is recorded)."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_globals.get("__name__") in modules:
            return True
        frame = frame.f_back
    return False


def _tiled(x: torch.Tensor) -> bool:
    """Whether the batch is one block of rows repeated k >= 2 times (x.repeat(k, 1), x.repeat_interleave(k, 0))."""
    n = x.shape[0] if x.dim() else 0
    if n < 2 or x.numel() > 10_000_000:
        return False
    flat = x.detach().reshape(n, -1)
    for k in (k for k in range(2, n + 1) if n % k == 0):
        m = n // k
        if torch.equal(flat[:m], flat[m:2 * m]) and torch.equal(flat, flat[:m].repeat(k, 1)):
            return True
        grouped = flat.view(m, k, -1)
        if torch.equal(grouped, grouped[:, :1].expand_as(grouped)):
            return True
    return False


def _first_tensor(output: Any) -> torch.Tensor | None:
    """The output itself, or the first tensor in a tuple, list or dict output."""
    if isinstance(output, torch.Tensor):
        return output
    values = output.values() if isinstance(output, dict) else output if isinstance(output, (tuple, list)) else ()
    return next((v for v in values if isinstance(v, torch.Tensor)), None)


class _Pass:
    """One forward pass of a root module in which a BatchNorm or Dropout ran in train mode."""

    __slots__ = ("root", "grad", "step", "input", "key", "consumed", "module", "is_bn", "drift", "where", "mixed",
                 "skip", "output", "scored")

    def __init__(self, root: nn.Module, grad: bool, step: int, x: torch.Tensor | None) -> None:
        self.root, self.grad, self.step = id(root), grad, step
        self.input = weakref.ref(x) if x is not None else None
        self.consumed = self.mixed = self.skip = self.is_bn = self.scored = False
        self.output: weakref.ref | None = None
        self.key: tuple | None = None
        self.module: str | None = None
        self.drift: torch.Tensor | None = None
        self.where: str | None = None


class _Frozen:
    """A BatchNorm with frozen parameters seen in train mode: the pass it ran in and what that one forward did."""

    __slots__ = ("module", "p", "label", "drift")

    def __init__(self, module: nn.Module, p: _Pass, label: str) -> None:
        self.module, self.p, self.label, self.drift = weakref.ref(module), p, label, None


class Modes(Detector):
    """Layers running in train mode by mistake: in an evaluation of the trained model, or a frozen BatchNorm."""

    TRAIN_MODE_IN_EVAL = Sign("eval-without-eval-mode",
                              "BatchNorm/Dropout in train mode in passes no backward used: of the trained model "
                              "outside its training iterations, or of any model in a script that trains nothing")
    FROZEN_BN_TRAINING = Sign("frozen-backbone-batchnorm-train-mode",
                              "a BatchNorm in a frozen backbone (it and every layer before it frozen) in train mode "
                              "while the rest of the model trains")

    def __init__(self, watch) -> None:
        super().__init__(watch)
        self.current: _Pass | None = None
        self.passes: list[_Pass] = []
        self.per_window: dict[tuple[int, int], int] = {}
        self.roots: dict[int, tuple[weakref.ref, frozenset[int]]] = {}
        self.measuring: dict[int, tuple[list, torch.Tensor]] = {}
        self.frozen: dict[int, _Frozen] = {}

    def forward_pre(self, module: nn.Module, args: tuple, root: bool) -> None:
        if root:
            x = args[0] if args and isinstance(args[0], torch.Tensor) else None
            self.current = _Pass(module, torch.is_grad_enabled(), self.watch.all_steps, x)
        p = self.current
        if p is None or not isinstance(module, (_BN, _DROPOUT)):
            return
        if not module.training:
            p.mixed = p.mixed or isinstance(module, _DROPOUT) or module.track_running_stats
            return
        is_bn = isinstance(module, _BN) and module.track_running_stats and module.momentum is not None
        if not is_bn and not (isinstance(module, _DROPOUT) and module.p > 0):
            return
        holders: list = []
        if is_bn and module.affine and not module.weight.requires_grad and module.momentum != 0 \
                and id(module) not in self.frozen:          # momentum 0: its statistics frozen that way instead
            self.frozen[id(module)] = _Frozen(module, p, self._label(module))
            holders.append(self.frozen[id(module)])
        if p.module is None:
            self._record(p, module, is_bn)
            if is_bn:
                holders.append(p)
        if holders:
            self.measuring[id(module)] = (holders, module.running_mean.detach().clone())

    def _record(self, p: _Pass, module: nn.Module, is_bn: bool) -> None:
        p.module, p.is_bn = self._label(module), is_bn
        window = (p.root, p.step)
        self.per_window[window] = seen = self.per_window.get(window, 0) + 1
        if seen <= 2 or not p.grad:
            p.where = self.watch.where(outside_forward=True)
            p.skip = _inside("torch.utils.checkpoint", "torch.optim.swa_utils")
        x = p.input() if p.input is not None else None
        if not p.grad and x is not None and x.numel():     # what identifies a repeated input (MC sampling)
            sample = x.detach().flatten()[:: max(1, x.numel() // 64)][:64].double()
            p.key = (tuple(x.shape), *torch.stack([sample.sum(), (sample * sample).sum()]).tolist())
            p.skip = p.skip or _tiled(x)                    # one batch tiled in one pass: sampling too
        if p.root not in self.roots:
            root = self.watch.root
            self.roots[p.root] = (weakref.ref(root), frozenset(id(q) for q in root.parameters()))
        if len(self.passes) >= _MAX_PASSES:         # a long run: forget the passes a backward used
            self.passes = [q for q in self.passes if not q.consumed][-_MAX_PASSES // 2:]
        self.passes.append(p)

    def _label(self, module: nn.Module) -> str:
        return f"{self.watch.module_name(module)} ({type(module).__name__})"

    def forward(self, module: nn.Module, output: Any, root: bool) -> None:
        measured = self.measuring.pop(id(module), None) if self.measuring else None
        if measured is not None:
            holders, before = measured
            change = (module.running_mean.detach() - before).abs().max()
            for holder in holders:
                holder.drift = change
        p = self.current
        if root and p is not None and p.module is not None and not p.grad:
            tensor = _first_tensor(output)
            p.output = weakref.ref(tensor) if tensor is not None else None
        if root and p is not None and p.module is not None and p.grad:
            tensor = _first_tensor(output)
            if tensor is None or not tensor.requires_grad:
                p.consumed = True                   # nothing a backward could use: unknown, so not an evaluation
                return

            def used(grad, p=p):
                p.consumed = True
            try:
                tensor.register_hook(used)
            except RuntimeError:                    # a tensor that takes no hook: unknown, so not an evaluation
                p.consumed = True

    def call(self, name: str, args: tuple, kwargs: dict, result: Any) -> None:
        """A loss under no_grad whose input is a train-mode pass's output: that pass is scored, an evaluation."""
        if name in LOSS_CALLS and args and not torch.is_grad_enabled() and isinstance(args[0], torch.Tensor):
            for p in self.passes[-4:]:
                if p.output is not None and p.output() is args[0]:
                    p.scored = True

    # --- deciding, when the watch ends ------------------------------------------------------------------------
    def _trained(self, root_id: int) -> bool:
        return bool(self.roots[root_id][1] & self.watch.trained) if root_id in self.roots else False

    def _root_steps(self, root_id: int) -> int:
        params = self.roots[root_id][1]
        return max((self.watch.opt_all_steps.get(o, 0) for o, ps in self.watch.opt_params.items() if ps & params),
                   default=0)

    def _evaluation(self) -> WatchFinding | None:
        by_root: dict[int, list[_Pass]] = {}
        evaluating_only = self.watch.step == 0                  # no optimizer stepped: the script only evaluates
        for p in self.passes:
            if not p.skip and not p.mixed and not p.consumed and (evaluating_only or self._trained(p.root)):
                by_root.setdefault(p.root, []).append(p)
        for root_id, passes in by_root.items():
            keys = Counter((p.step, p.key) for p in passes)     # one input again in one window: sampling
            passes = [p for p in passes if p.key is None or keys[(p.step, p.key)] == 1]
            windows = sorted({p.step for p in passes})
            steps = self._root_steps(root_id)
            if len(windows) >= 3 and len(windows) >= 0.5 * steps:    # recurring: part of training, unless scored
                passes = [p for p in passes if p.scored]
                windows = sorted({p.step for p in passes})
            if not passes:
                continue
            first = passes[0]
            root = self.roots[root_id][0]()
            name = type(root).__name__ if root is not None else "the model"
            how = ("with gradients off" if not first.grad else "with gradients on, and no backward used their output")
            after = ", ".join(str(w) for w in windows[:5]) + (", ..." if len(windows) > 5 else "")
            when = (f"after step(s) {after}; {len(windows)} of its {steps} training iterations" if steps else
                    "no optimizer stepped while the watch ran")
            whose = f"the trained {name}" if steps else name
            effect = "normalised each batch with the batch's own statistics" if first.is_bn else \
                "dropped activations at random"
            drift = floats([first.drift])[0] if first.drift is not None else None
            moved = f", and this one pass moved its running_mean by up to {drift:.3g}" if drift is not None else ""
            return WatchFinding(
                self.TRAIN_MODE_IN_EVAL.pitfall,
                f"{len(passes)} forward pass(es) of {whose} ran in train mode {how} ({when}): in the first, "
                f"{first.module} "
                f"{effect}{moved}; if these passes evaluate the model, call model.eval() first",
                {"passes": len(passes), "after steps": windows, "training iterations": steps,
                 "module": first.module, "running_mean moved by (max), first pass": drift},
                first.where, since=first.step)
        return None

    def _frozen_prefix(self, root: nn.Module, module: nn.Module) -> bool:
        """Whether the BatchNorm's parameters and every parameter registered before them in the model are frozen."""
        own = {id(q) for q in module.parameters()}
        for q in root.parameters():
            if q.requires_grad:
                return False
            if id(q) in own:
                return True
        return False

    def _frozen_bn(self) -> WatchFinding | None:
        for frozen in self.frozen.values():
            module, p = frozen.module(), frozen.p
            root = self.roots[p.root][0]() if p.root in self.roots else None
            if module is None or root is None or not p.grad or not self._trained(p.root):
                continue
            if not self._frozen_prefix(root, module):
                continue
            drift = floats([frozen.drift])[0] if frozen.drift is not None else None
            if drift == 0:
                continue                            # its statistics did not move: nothing measured to report
            moved = f": this one forward moved its running_mean by up to {drift:.3g}" if drift is not None else ""
            return WatchFinding(
                self.FROZEN_BN_TRAINING.pitfall,
                f"{frozen.label} and every layer before it are frozen (requires_grad=False) while the rest of the "
                f"{type(root).__name__} trains, but it ran in train mode in a training forward {moment(p.step)}"
                f"{moved}; its running statistics keep moving to the new data (call .eval() on the frozen part "
                f"after every model.train())",
                {"module": frozen.label, "step": p.step + 1, "running_mean moved by (max), one forward": drift},
                p.where, since=p.step + 1)
        return None

    def findings(self) -> list[WatchFinding]:
        return [f for f in (self._evaluation(), self._frozen_bn()) if f is not None]
