"""Private to ptlab.watch: the instrumentation it installs for a block, which feeds events to the detectors."""
from __future__ import annotations

import os
import runpy
import sys
import warnings
import weakref
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch
from torch import nn
from torch.nn.modules.loss import _Loss
from torch.overrides import TorchFunctionMode

from .detectors import LOSS_CALLS, SHAPE_LOSSES, SUM_CALLS, Detector, FrozenUpdated, Graphs, ZeroGrad, moment
from .losses import LossCalls, LossValues
from .modes import Modes
from .report import WatchFinding, mark_consequences
from .wrapped import Amp, Samplers

# Every detector, in the order their findings are reported.
EVERY_DETECTOR: list[type[Detector]] = [ZeroGrad, FrozenUpdated, LossCalls, Graphs, Modes, LossValues, Amp, Samplers]

# cause -> the findings it can explain: gradients piled up (never reset) make the steps, and so the loss, grow. A
# finding is marked as its consequence only where the measured figures say so (report.mark_consequences: the pile's
# norm had reached 3x its first before the loss sign began); nothing else is marked, since nothing here measures
# that unshuffled data or a softmax made a loss rise (the rise can have a cause of its own).
_LOSS_SIGNS = {LossValues.LOSS_RISES.pitfall, LossValues.NON_FINITE_LOSS.pitfall, LossCalls.AT_CHANCE.pitfall}
EXPLAINS: dict[str, set[str]] = {
    ZeroGrad.NOT_ZEROED.pitfall: _LOSS_SIGNS,
    ZeroGrad.NOT_ZEROED_IN_TRAINING.pitfall: _LOSS_SIGNS,
}
# cause -> the loss signs it can make that nothing measures: found with it, such a sign is printed as a hint (exit
# 0) that names the cause, neither a cause of its own nor a consequence.
MAY_EXPLAIN: dict[str, set[str]] = {
    LossCalls.UNSHUFFLED.pitfall: _LOSS_SIGNS,
    LossCalls.SOFTMAX_FIRST.pitfall: {LossCalls.AT_CHANCE.pitfall},
    ZeroGrad.ZEROED_BEFORE_STEP.pitfall: {LossCalls.AT_CHANCE.pitfall},
}
# In-place writes that reset a .grad when they cover its whole memory (zero_grad's own are seen by wrapping it).
# An assignment into all of it (`p.grad[:] = 0`, `p.grad[...] = g`) replaces what it held: a reset too, whatever
# the value; one into some rows (`p.grad[rows] = 0`) is not.
_RESETS = {"zero_", "fill_", "copy_", "mul_", "_foreach_zero_", "__setitem__"}

_OWN_DIR = str(Path(__file__).parent) + os.sep      # every file of this package
_SKIP_DIRS = (_OWN_DIR, str(Path(torch.__file__).parent), str(Path(runpy.__file__).parent))


def _path(name: str) -> str:
    """A submodule's dotted name as code reaches it: "features.0.1" -> ".features[0][1]", "1" -> "[1]"."""
    return "".join(f"[{part}]" if part.isdigit() else f".{part}" for part in name.split(".")) if name else ""


class _Mode(TorchFunctionMode):
    def __init__(self, watcher: "Watcher") -> None:
        super().__init__()
        self.watcher = watcher

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name not in self.watcher.interesting:              # most calls: nothing to look at
            return func(*args, **kwargs)
        if (name in SHAPE_LOSSES and len(args) > 1 and isinstance(args[1], torch.Tensor)
                and isinstance(args[0], torch.Tensor) and args[0].shape != args[1].shape):
            result = _warning_at_caller(func, args, kwargs)
        else:
            result = func(*args, **kwargs)
        w = self.watcher
        if not w.busy and not torch.compiler.is_compiling():
            if name in w.call_names:
                w.on_call(name, args, kwargs, result)
            elif name == "backward" and args and isinstance(args[0], torch.Tensor):
                retain = kwargs.get("retain_graph", args[2] if len(args) > 2 else None)
                w.on_backward(args[0], bool(kwargs.get("create_graph", args[3] if len(args) > 3 else False))
                              if retain is None else bool(retain))
            elif name in _RESETS and args and w.zero.ptrs and (name in ("zero_", "copy_", "_foreach_zero_",
                                                                        "__setitem__") or (
                    len(args) > 1 and isinstance(args[1], (int, float)) and args[1] == 0)):
                whole = name != "__setitem__" or (len(args) > 1 and (args[1] is Ellipsis or args[1] == slice(None)))
                with w._quiet():
                    for tensor in (args[0] if isinstance(args[0], (list, tuple)) else [args[0]]) if whole else ():
                        if isinstance(tensor, torch.Tensor):
                            w.zero.written(tensor)
        return result


def _warning_at_caller(func, args, kwargs):
    """Call a loss whose input and target shapes differ; its size warning names the learner's line, as without a watch.

    Called from the mode, the loss's `warnings.warn(..., stacklevel=2)` would name this file. For the call,
    `warnings.warn` is wrapped to pass the stack level of the line that called the loss, so the warning goes through
    the active filters and that module's registry as it would have ("default": once per line, "always": every call,
    "error" raises, "ignore" drops it). Nothing changes the filters, which would reset every module's registry.
    """
    caller = sys._getframe(1)
    while caller is not None and caller.f_code is not getattr(func, "__code__", None):
        caller = caller.f_back                   # the loss function's own frame, before the mode was asked
    caller = caller.f_back if caller is not None else None
    original = warnings.warn

    def warn(message, category=None, stacklevel=1, source=None):
        frame, level = sys._getframe(0), 1
        while frame is not None and frame is not caller:
            frame, level = frame.f_back, level + 1
        return original(message, category, level if frame is not None else stacklevel + 1, source)

    warnings.warn = warn
    try:
        return func(*args, **kwargs)
    finally:
        warnings.warn = original


class Watcher:
    """The installed instrumentation; forwards events to the detectors."""

    def __init__(self, steps: int) -> None:
        self.steps, self.step, self.backwards, self.forwards = steps, 0, 0, 0
        self.all_steps = 0          # optimizer steps, the ones after the watched `steps` too (to place what follows)
        self.busy = False
        self.depth = 0
        self.names: dict[int, str] = {}
        self.last_scaler = None
        self.detectors = [d(self) for d in EVERY_DETECTOR]
        self.zero = next(d for d in self.detectors if isinstance(d, ZeroGrad))
        self.graphs = next(d for d in self.detectors if isinstance(d, Graphs))
        self.root: nn.Module | None = None                # the outermost module of the forward under way
        self.opt_params: dict[int, frozenset[int]] = {}   # id(optimizer) -> ids of its parameters that train
        self.opt_steps: dict[int, int] = {}               # id(optimizer) -> steps observed
        self.opt_all_steps: dict[int, int] = {}           # id(optimizer) -> steps, the unwatched ones too
        self.trained: set[int] = set()                    # ids of parameters an optimizer stepped
        self.retaining = False                            # whether the backward under way has retain_graph=True
        self.sequential_batch: list[weakref.ref] = []     # the tensors of the batch a shuffle=False loader yielded
        self.call_names = LOSS_CALLS | SUM_CALLS | {"softmax"}
        self.interesting = frozenset(self.call_names | SHAPE_LOSSES | _RESETS | {"backward"})
        self.popped = False                                   # the function mode is off the stack inside step()
        self._by = {m: [getattr(d, m) for d in self.detectors if hasattr(d, m)]
                    for m in ("call", "backward", "forward_pre", "forward", "step_pre", "step_post")}
        self.handles: list[Any] = []
        self._counted: dict[int, int] = {}
        self.patches: list[tuple[Any, str, Any]] = []

    @property
    def active(self) -> bool:
        return self.step < self.steps

    # --- what the detectors ask ---------------------------------------------------------------------------
    def where(self, outside_forward: bool = False, frames: int = 1) -> str | None:
        """file:line of the innermost frame outside torch, runpy and this watch (and, if asked, outside forward());
        with frames=2, that line and the user line that called its function (a helper called twice apart)."""
        frame, found = sys._getframe(1), []
        while frame is not None and len(found) < frames:
            name = frame.f_code.co_filename
            if (not name.startswith(_SKIP_DIRS) and not name.startswith("<frozen")
                    and "contextlib" not in name
                    and not (outside_forward and frame.f_code.co_name == "forward"
                             and isinstance(frame.f_locals.get("self"), nn.Module))):
                found.append(f"{name}:{frame.f_lineno}")
            frame = frame.f_back
        return " <- ".join(found) if found else None

    def moment(self) -> str:
        """When a call ran, in optimizer steps, saying only what is known: a call after step N may be a validation
        pass that no step N + 1 follows."""
        return moment(self.all_steps)

    def module_name(self, module: nn.Module) -> str:
        return self.names.get(id(module), type(module).__name__)

    # --- events -------------------------------------------------------------------------------------------
    @contextmanager
    def _quiet(self) -> Iterator[None]:
        self.busy = True
        try:
            with torch._C.DisableTorchFunction():
                yield
        finally:
            self.busy = False

    def on_call(self, name, args, kwargs, result) -> None:
        if self.busy:
            return
        with self._quiet():
            for call in self._by["call"]:
                call(name, args, kwargs, result)

    def on_backward(self, tensor, retain: bool = False) -> None:
        with self._quiet():
            self.backwards += 1
            self.depth, self.retaining = 0, retain
            for backward in self._by["backward"]:
                backward(tensor)

    def forward_pre(self, module, args) -> None:
        if self.busy or torch.compiler.is_compiling():
            return
        with self._quiet():
            root = self.depth == 0 and not isinstance(module, _Loss)    # a loss module is not a model
            self.depth += 1
            if root:
                self.forwards += 1
                self.root = module
                if id(module) not in self.names:
                    root = type(module).__name__
                    self.names.update({id(m): root + _path(n) for n, m in module.named_modules()})
            for pre in self._by["forward_pre"]:
                pre(module, args, root)

    def forward_post(self, module, args, output) -> None:
        if self.busy or torch.compiler.is_compiling():
            return
        with self._quiet():
            self.depth = max(0, self.depth - 1)
            root = self.depth == 0 and not isinstance(module, _Loss)
            for post in self._by["forward"]:
                post(module, output, root)

    def _mode_off(self) -> None:
        """Inside optimizer.step() the function mode has nothing to see: take it off the stack (it costs a Python
        call for each of the step's many tensor operations), and put it back in step_post."""
        stack = torch.overrides._get_current_function_mode_stack()
        if stack and stack[-1] is self.mode and not self.popped:
            torch._C._pop_torch_function_stack()
            self.popped = True

    def _mode_on(self) -> None:
        if self.popped:
            torch._C._push_on_torch_function_stack(self.mode)
            self.popped = False

    def step_pre(self, opt, args, kwargs) -> None:
        self._mode_off()
        if not self.active:
            return
        with self._quiet():
            count = sum(len(g["params"]) for g in opt.param_groups)
            known = self.opt_params.get(id(opt))
            if known is None or self._counted.get(id(opt)) != count:
                self._counted[id(opt)] = count
                self.opt_params[id(opt)] = frozenset(id(p) for g in opt.param_groups for p in g["params"]
                                                     if p.requires_grad)
                self.trained |= self.opt_params[id(opt)]
            for pre in self._by["step_pre"]:
                pre(opt, self.step + 1)

    def step_post(self, opt, args, kwargs) -> None:
        self._mode_on()
        self.all_steps += 1
        self.opt_all_steps[id(opt)] = self.opt_all_steps.get(id(opt), 0) + 1
        if not self.active:
            return
        with self._quiet():
            self.step += 1
            self.opt_steps[id(opt)] = self.opt_steps.get(id(opt), 0) + 1
            self.depth = 0
            for post in self._by["step_post"]:
                post(opt, self.step)

    # --- installing and removing --------------------------------------------------------------------------
    def _patch(self, owner: Any, name: str, make) -> None:
        original = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
        self.patches.append((owner, name, original))
        setattr(owner, name, make(original))

    def install(self) -> None:
        from torch.nn.modules import module as module_hooks
        from torch.optim import optimizer as optimizer_hooks
        from torch.utils.data import DataLoader, SequentialSampler
        from torch.utils.data.dataloader import _BaseDataLoaderIter

        amp = next(d for d in self.detectors if isinstance(d, Amp))
        samplers = next(d for d in self.detectors if isinstance(d, Samplers))
        self.handles = [module_hooks.register_module_forward_pre_hook(self.forward_pre),
                        module_hooks.register_module_forward_hook(self.forward_post, always_call=True),
                        optimizer_hooks.register_optimizer_step_pre_hook(self.step_pre),
                        optimizer_hooks.register_optimizer_step_post_hook(self.step_post)]
        watcher = self

        def scale(original):
            def wrapper(scaler, outputs):
                result = original(scaler, outputs)
                watcher.last_scaler = scaler
                with watcher._quiet():
                    amp.scaled_loss(scaler, result)
                return result
            return wrapper

        def around(original, before):
            def wrapper(*args, **kwargs):
                with watcher._quiet():
                    before(*args)
                return original(*args, **kwargs)
            return wrapper

        def clip(original):
            def wrapper(*args, **kwargs):
                norm = original(*args, **kwargs)
                with watcher._quiet():
                    amp.clip(norm)
                    watcher.zero.clipped(norm)
                return norm
            return wrapper

        scaler_cls = torch.amp.GradScaler
        self._patch(scaler_cls, "scale", scale)
        self._patch(scaler_cls, "unscale_", lambda o: around(o, lambda s, *a: amp.unscaled(s)))
        self._patch(scaler_cls, "step", lambda o: around(o, lambda s, *a: amp.scaler_step(s, a[0] if a else None)))
        self._patch(scaler_cls, "update", lambda o: around(o, lambda s, *a: amp.scaler_update(s)))
        self._patch(torch.nn.utils, "clip_grad_norm_", clip)
        self._patch(torch.nn.utils.clip_grad, "clip_grad_norm_", clip)
        self._patch(DataLoader, "__iter__", lambda o: around(o, lambda loader, *a: samplers.loader_iter(loader)))

        def next_batch(original):
            def wrapper(iterator):
                batch = original(iterator)
                if watcher.active:          # a shuffle=False loader's batch is known by its tensors' identity
                    sampler = getattr(iterator, "_index_sampler", None)
                    sequential = isinstance(getattr(sampler, "sampler", sampler), SequentialSampler)
                    values = batch.values() if isinstance(batch, dict) else batch if isinstance(
                        batch, (tuple, list)) else [batch]
                    watcher.sequential_batch = [weakref.ref(v) for v in values
                                                if sequential and isinstance(v, torch.Tensor)]
                return batch
            return wrapper

        self._patch(_BaseDataLoaderIter, "__next__", next_batch)

        def zero_grad(original):
            def wrapper(owner, *args, **kwargs):
                result = original(owner, *args, **kwargs)
                if watcher.active and not watcher.busy:
                    with watcher._quiet():
                        watcher.zero.zeroed(owner)
                return result
            return wrapper

        self._patch(torch.optim.Optimizer, "zero_grad", zero_grad)
        self._patch(nn.Module, "zero_grad", zero_grad)
        # torch.compile(module) warns when any global module hook is installed; the watch's own must not make it
        # print what the script alone would not. A hook the script installed itself still makes it warn.
        own = {h.id for h in self.handles}
        dicts = [module_hooks._global_forward_pre_hooks, module_hooks._global_forward_hooks,
                 module_hooks._global_backward_pre_hooks, module_hooks._global_backward_hooks]

        def any_global_hook(original):
            def wrapper():
                return any(set(d) - own for d in dicts)
            return wrapper

        self._patch(module_hooks, "_has_any_global_hook", any_global_hook)
        self.mode = _Mode(self)
        self.mode.__enter__()

    def remove(self) -> None:
        try:
            self._mode_on()                         # a step() that raised never reached step_post
            self.mode.__exit__(None, None, None)
        finally:
            for handle in self.handles:
                handle.remove()
            for owner, name, original in reversed(self.patches):
                setattr(owner, name, original)
            self.handles, self.patches = [], []

    def findings(self) -> list[WatchFinding]:
        found: list[WatchFinding] = []
        with torch._C.DisableTorchFunction():
            for detector in self.detectors:
                found += detector.findings()
        return mark_consequences(found, EXPLAINS, MAY_EXPLAIN)
