"""Private to ptlab.watch: what a detector is, and the detectors of gradients, graphs and layer modes."""
from __future__ import annotations

import math
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


def moment(step: int) -> str:
    """When something ran, given the optimizer steps done before it: only what is known (a call after step N may
    be a validation pass that no step N + 1 follows)."""
    return f"after optimizer step {step}" if step else "before the first optimizer step"


def _ratios(values: list[float]) -> str:
    return ", ".join(f"{v / values[0]:.1f}x" for v in values) if values and values[0] else "-"


@dataclass(frozen=True)
class Sign:
    """A registered pitfall a detector finds, and the sign of it that the detector looks for."""

    pitfall: str
    sign: str
    hint: bool = False          # only ever a hint (exit 0): the catalogue marks it "hint", not ✔


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
    """Gradients never reset between steps (no zero_grad), or reset after backward and before the step.

    A reset is seen, not guessed from version counters: optimizer.zero_grad() and module.zero_grad() are wrapped,
    `p.grad = None` or a new tensor changes the .grad object, and an in-place zero_()/fill_(0)/mul_(0)/copy_() or an
    assignment (`p.grad[:] = 0`) over a whole .grad's memory (through .data too) is seen by the watch's function mode.
    Such writes reset the optimizer's gradients only once they covered every .grad it had: one written in part
    (`p.grad[rows] = 0`), or a few of them, leave the rest piling up. An in-place write that is not a reset
    (clip_grad_norm_, GradScaler.unscale_) leaves the streak alone.
    """

    NOT_ZEROED = Sign("missing-zero-grad", "the same .grad tensors added to, never reset, over >= 3 optimizer steps")
    NOT_ZEROED_IN_TRAINING = Sign("missing-zero-grad-training",
                                  "the same, over >= 10 optimizer steps of a training loop")
    ZEROED_BEFORE_STEP = Sign("zero-grad-after-backward",
                              "zero_grad() after the last backward() and before step(): no gradient reaches the step")

    def __init__(self, watch) -> None:
        super().__init__(watch)
        self.last: dict[int, tuple[dict, int]] = {}   # id(opt) -> ({id(p): (ref(grad), data_ptr, version)}, backwards)
        self.resets: dict[int, tuple[int, str | None]] = {}   # id(opt) -> (backwards at the reset, where)
        self.ptrs: dict[int, tuple[int, int]] = {}    # data_ptr of a .grad -> (id(opt), numel), to see zeroing
        self.writes: dict[int, dict[int, tuple[int, str | None]]] = {}   # id(opt) -> {ptr: (backwards, where)}
        self.snapshots: dict[int, dict[int, torch.Tensor]] = {}          # id(opt) -> the .grad each step left
        # id(opt) -> (step, grad norm, the scale unscale_ divided by before it or None, the norm over the norm of
        # that step's own gradient, None where unknown), while never reset
        self.streaks: dict[int, list[tuple[int, torch.Tensor, float | None, torch.Tensor | None]]] = {}
        self.best: list[tuple[int, torch.Tensor, float | None, torch.Tensor | None]] = []
        self.best_where: str | None = None
        self.previous_norm: dict[int, torch.Tensor] = {}
        self.wheres: dict[int, str | None] = {}
        self.zeroed_found: WatchFinding | None = None
        self.clip: tuple[int, torch.Tensor] | None = None     # (backwards then, norm clip_grad_norm_ returned)
        self.clipped_norms = False
        self.unscale: tuple[int, float] | None = None         # (backwards then, the scale GradScaler.unscale_ used)

    @staticmethod
    def _grads(opt) -> dict[int, torch.Tensor]:
        return {id(p): p.grad for g in opt.param_groups for p in g["params"] if p.requires_grad and p.grad is not None}

    # --- resets -------------------------------------------------------------------------------------------------
    def zeroed(self, owner) -> None:
        """optimizer.zero_grad() or module.zero_grad() ran: a reset for every optimizer whose parameters it covers."""
        if isinstance(owner, torch.optim.Optimizer):
            opts = [id(owner)]
        else:
            ids = {id(p) for p in owner.parameters()}
            opts = [o for o, params in self.watch.opt_params.items() if params & ids]
        where = self.watch.where()
        for opt in opts:
            self.resets[opt] = (self.watch.backwards, where)

    def written(self, tensor: torch.Tensor) -> None:
        """An in-place zero_/fill_/mul_/copy_ or a whole assignment on a tensor: counted if it covers a watched .grad's
        whole memory; the optimizer's gradients are reset once every .grad it had is covered (see step_pre)."""
        known = self.ptrs.get(tensor.data_ptr()) if self.ptrs else None
        if known is not None and tensor.numel() == known[1]:
            self.writes.setdefault(known[0], {})[tensor.data_ptr()] = (self.watch.backwards, self.watch.where())

    def clipped(self, norm: Any) -> None:
        """clip_grad_norm_ returned the norm before clipping: the size of the gradient sum, which the step measures."""
        if isinstance(norm, torch.Tensor):
            self.clip = (self.watch.backwards, norm.detach().float().reshape(()))

    def unscaled_by(self, scaler) -> None:
        """GradScaler.unscale_ is about to divide every .grad by the scale: a pile's older part shrinks too."""
        if scaler.is_enabled():
            self.unscale = (self.watch.backwards, float(scaler.get_scale()))

    # --- steps --------------------------------------------------------------------------------------------------
    def step_pre(self, opt, step: int) -> None:
        grads = self._grads(opt)
        previous = self.last.get(id(opt))
        backwards_before = previous[1] if previous else 0
        reset = self.resets.pop(id(opt), None)
        writes = self.writes.pop(id(opt), {})
        expected = [ptr for ptr, (o, _) in self.ptrs.items() if o == id(opt)]
        if reset is None and expected and all(ptr in writes for ptr in expected):
            reset = min(writes[ptr] for ptr in expected)       # every .grad written whole: a reset
        new = self.watch.backwards - backwards_before
        if reset is not None and new >= 1 and reset[0] == self.watch.backwards and self.zeroed_found is None:
            self._zeroed_before_step(opt, step, grads, reset[1])
        streak = self.streaks.setdefault(id(opt), [])
        if not grads:
            streak.clear()
            return
        rescaled = self.clip is not None and self.clip[0] == self.watch.backwards
        if rescaled:
            norm, self.clipped_norms = self.clip[1], True       # before clipping, which scaled .grad down
        else:
            norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(list(grads.values()))))
        if previous is None:
            self.previous_norm[id(opt)] = norm
            return
        snapshot = previous[0]
        common = [k for k in grads if k in snapshot]
        kept = reset is None and new >= 1 and any(      # one .grad added to since the last step is a pile
            snapshot[k][0]() is grads[k] and grads[k].data_ptr() == snapshot[k][1]
            and grads[k]._version > snapshot[k][2] for k in common)
        scale = self.unscale[1] if self.unscale is not None and self.unscale[0] == self.watch.backwards else None
        if kept and id(opt) in self.previous_norm:
            if not streak:
                streak.append((self.opt_step(opt) - 1, self.previous_norm[id(opt)], scale, None))
                self.wheres[id(opt)] = self.watch.where()
            streak.append((self.opt_step(opt), norm, scale,
                           None if rescaled or scale is not None else self._over_fresh(opt, grads, norm)))
            if len(streak) > len(self.best):
                self.best, self.best_where = list(streak), self.wheres[id(opt)]
        else:
            streak.clear()
        self.previous_norm[id(opt)] = norm

    def _over_fresh(self, opt, grads: dict, norm: torch.Tensor) -> torch.Tensor | None:
        """The pile's norm over the norm of what this step's backward passes added to it (.grad minus what the last
        step left), or None if that is not known."""
        left = self.snapshots.get(id(opt), {})
        fresh = [g - left[k] if k in left else g for k, g in grads.items()]
        return norm / torch.linalg.vector_norm(torch.stack(torch._foreach_norm(fresh))).clamp_min(1e-30)

    def opt_step(self, opt) -> int:
        """This optimizer's own step number, the one about to run."""
        return self.watch.opt_steps.get(id(opt), 0) + 1

    def _zeroed_before_step(self, opt, step: int, grads: dict, where_reset: str | None) -> None:
        params = [p for g in opt.param_groups for p in g["params"] if p.requires_grad]
        if any(v > 0 for v in floats([g.abs().max() for g in grads.values() if g.numel()])):
            return                      # some gradient still reaches the step (a partial reset): say nothing
        none = len(params) - len(grads)
        what = (f"all {len(params)} .grad were None" if none == len(params) else
                f"{none} .grad were None and {len(grads)} all zeros")
        self.zeroed_found = WatchFinding(
            self.ZEROED_BEFORE_STEP.pitfall,
            f"optimizer step {step}: zero_grad() ran after the last backward() and before step() (at {where_reset}), "
            f"so at the step {what}: the gradients were discarded and the step could not learn from them "
            f"(move zero_grad() before backward(), or after step())",
            {"step": step, "parameters": len(params), ".grad None": none, "zero_grad at": where_reset},
            self.watch.where(), since=step)

    def step_post(self, opt, step: int) -> None:
        grads = self._grads(opt)
        self.resets.pop(id(opt), None)          # a reset inside step() (LBFGS's closure) belongs to that step
        self.writes.pop(id(opt), None)
        self.snapshots[id(opt)] = {k: g.detach().clone() for k, g in grads.items()}
        self.last[id(opt)] = ({k: (weakref.ref(g), g.data_ptr(), g._version) for k, g in grads.items()},
                              self.watch.backwards)
        self.ptrs = {ptr: o for ptr, o in self.ptrs.items() if o[0] != id(opt)}
        self.ptrs.update((g.data_ptr(), (id(opt), g.numel())) for g in grads.values())

    def findings(self) -> list[WatchFinding]:
        found = [self.zeroed_found] if self.zeroed_found else []
        if len(self.best) < 3:
            return found
        steps = [s for s, _, _, _ in self.best]
        norms = floats([n for _, n, _, _ in self.best])
        scales = [k for _, _, k, _ in self.best[1:]]
        known = [(s, r) for s, _, _, r in self.best if r is not None]
        over_fresh = dict(zip([s for s, _ in known], floats([r for _, r in known])))
        shown = norms[:5]
        grown = next((s for s, v in zip(steps, norms) if norms[0] and v >= 3 * norms[0]), None)
        piled = next((s for s in steps if over_fresh.get(s, 0) >= 3), None)
        evidence = {"steps": [steps[0], steps[-1]], "grad norm": [round(v, 6) for v in shown],
                    "grad norm >= 3x its first at step": grown,
                    "grad norm >= 3x that of the step's own gradient at step": piled}
        text = (f"over optimizer steps {steps[0]}-{steps[-1]} the same .grad tensors were only added to (never reset "
                f"between steps: no zero_grad); the gradient norm"
                f"{' (before clip_grad_norm_ scaled it)' if self.clipped_norms else ''} went {_ratios(shown)} of step "
                f"{steps[0]}'s")
        if len(steps) < 10:
            return found + [WatchFinding(self.NOT_ZEROED.pitfall, text, evidence, self.best_where, since=steps[0],
                                         explains_from=piled)]
        if norms[0] and math.isfinite(norms[0]) and math.isfinite(norms[-1]):
            text += f", and {norms[-1] / norms[0]:.3g}x at step {steps[-1]}"
        if all(k is not None for k in scales):
            text += (f": each step used what the backward passes since step {steps[0]} left in .grad, but "
                     f"GradScaler.unscale_ divided all of it by the scale (last {scales[-1]:g}) before each of these "
                     f"{len(steps) - 1} steps, so every earlier gradient shrank by that factor again at each step")
            evidence["unscale_ before every step, scale"] = scales[-1]
        elif self.clipped_norms:
            text += (f": each of these {len(steps)} steps used what every backward since step {steps[0]} had added to "
                     f".grad, scaled down again by each clip_grad_norm_ that clipped it")
        else:
            text += f": each of these {len(steps)} steps used the sum of every gradient since step {steps[0]}"
        return found + [WatchFinding(self.NOT_ZEROED_IN_TRAINING.pitfall, text,
                                     {**evidence, "grad norm, last step": norms[-1]}, self.best_where, since=steps[0],
                                     explains_from=piled)]


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


class _Output:
    """An eval-mode forward's output with a grad_fn: whether a backward later went through it."""

    __slots__ = ("ref", "used")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.ref, self.used = weakref.ref(tensor), False

    def mark(self, grad: Any) -> None:
        self.used = True


class Graphs(Detector):
    """Graphs that no backward will ever free: a running total of losses, evaluation outputs with a grad_fn."""

    EVAL_KEEPS_GRAPH = Sign("eval-without-no-grad",
                            "eval-mode forwards with grad enabled whose outputs, alive together, no backward used")
    RUNNING_TOTAL = Sign("running-loss-keeps-graph",
                         "a sum of >= 3 forwards' loss tensors with a grad_fn, never backpropagated")

    def __init__(self, watch) -> None:
        super().__init__(watch)
        self.tracked: dict[int, tuple[weakref.ref, frozenset[int]]] = {}
        self.candidates: dict[int, tuple[weakref.ref, frozenset[int], str | None]] = {}
        self.eval_outputs: list[_Output] = []
        self.eval_groups: list[tuple[list[_Output], str, str | None]] = []   # outputs alive together, model, where
        self.backpropagated: set[int] = set()    # forward passes whose loss a backward went through
        self.retained: set[int] = set()          # of them, those whose backward had retain_graph=True

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
            self.backpropagated |= covered
            self.retained = (self.retained | covered) if self.watch.retaining else (self.retained - covered)
            self.candidates = {k: c for k, c in self.candidates.items() if not c[1] <= covered}
        self.eval_outputs = []

    def forward(self, module: nn.Module, output: Any, root: bool) -> None:
        if not root or module.training or not torch.is_grad_enabled() or len(self.eval_groups) >= 64:
            return
        tensor = output if isinstance(output, torch.Tensor) else None
        if tensor is None or tensor.grad_fn is None:
            return
        record = _Output(tensor)
        try:
            tensor.register_hook(record.mark)       # a later backward through it: the pass was training, not eval
        except RuntimeError:
            return
        self.eval_outputs = [r for r in self.eval_outputs if r.ref() is not None] + [record]
        if len(self.eval_outputs) >= 3:
            self.eval_groups.append((list(self.eval_outputs), type(module).__name__, self.watch.where()))

    def _eval_kept(self) -> WatchFinding | None:
        # decided when the watch ends: was any output used? The largest group none of whose outputs was used
        unused = [g for g in self.eval_groups if not any(r.used for r in g[0])]
        for outputs, model, where in sorted(unused, key=lambda g: -len(g[0]))[:1]:
            n = len(outputs)
            return WatchFinding(
                self.EVAL_KEEPS_GRAPH.pitfall,
                f"{n} forward passes of {model} in eval mode ran with gradients enabled and no backward between "
                f"them; their outputs were alive together, each keeping its pass's graph and activations, and no "
                f"backward ever used them (use torch.no_grad() or torch.inference_mode())",
                {"forwards": n, "outputs alive with a grad_fn": n, "used by a backward": 0}, where)
        return None

    def findings(self) -> list[WatchFinding]:
        found = [f for f in (self._eval_kept(),) if f is not None]
        if self.candidates:
            _, forwards, where = max(self.candidates.values(), key=lambda c: len(c[1]))
            n, done = len(forwards), len(forwards & self.backpropagated)
            retained = len(forwards & self.retained)
            freed = done - retained
            if freed == n:
                kept = (f"each of those losses was backpropagated on its own, which freed the activations it saved, "
                        f"but the sum still holds all {n} graphs' nodes, a chain that grows every step")
            elif freed == 0:
                kept = "it keeps every one of those graphs alive, with the activations they saved" + (
                    f" ({retained} of them were backpropagated with retain_graph=True, which frees nothing)"
                    if retained else "")
            else:
                kept = (f"{n - freed} of those losses were never backpropagated, or only with retain_graph=True: the "
                        f"sum keeps their graphs alive, with the activations they saved")
            found.append(WatchFinding(
                self.RUNNING_TOTAL.pitfall,
                f"a tensor summing the losses of {n} forward passes carries a grad_fn and no backward went through "
                f"it: {kept} (add loss.item() instead)",
                {"forward passes summed": n, "of them backpropagated on their own": done,
                 "of them with retain_graph=True": retained}, where))
        return found
