"""Private to ptlab.watch: the instrumentation it installs for a block, which feeds events to the detectors."""
from __future__ import annotations

import os
import runpy
import sys
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch
from torch import nn
from torch.nn.modules.loss import _Loss
from torch.overrides import TorchFunctionMode

from .detectors import LOSS_CALLS, SHAPE_LOSSES, SUM_CALLS, Detector, FrozenUpdated, Graphs, Modes, ZeroGrad
from .losses import LossCalls, LossValues
from .report import WatchFinding
from .wrapped import Amp, Samplers

# Every detector, in the order their findings are reported.
EVERY_DETECTOR: list[type[Detector]] = [ZeroGrad, FrozenUpdated, LossCalls, Graphs, Modes, LossValues, Amp, Samplers]

_OWN_DIR = str(Path(__file__).parent) + os.sep      # every file of this package
_SKIP_DIRS = (_OWN_DIR, str(Path(torch.__file__).parent), str(Path(runpy.__file__).parent))


class _Mode(TorchFunctionMode):
    def __init__(self, watcher: "Watcher") -> None:
        super().__init__()
        self.watcher = watcher

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if (getattr(func, "__name__", "") in SHAPE_LOSSES and len(args) > 1 and isinstance(args[1], torch.Tensor)
                and isinstance(args[0], torch.Tensor) and args[0].shape != args[1].shape):
            result = _warning_at_caller(func, args, kwargs, self.watcher.warned)
        else:
            result = func(*args, **kwargs)
        w = self.watcher
        if not w.busy and not torch.compiler.is_compiling():
            name = getattr(func, "__name__", "")
            if name in w.call_names:
                w.on_call(name, args, kwargs, result)
            elif name == "backward" and args and isinstance(args[0], torch.Tensor):
                w.on_backward(args[0])
        return result


def _warning_at_caller(func, args, kwargs, shown: set):
    """Call a loss whose input and target shapes differ; its size warning names the learner's line, as without a watch.

    Called from the mode, the loss's `warnings.warn(..., stacklevel=2)` would name this file. The warning is caught
    and issued again at the line that called the loss, once per line (the default filter's rule); a filter set to
    "error" or "ignore" still acts on it.
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = func(*args, **kwargs)
    frame = sys._getframe(1)
    while frame is not None and frame.f_code is not getattr(func, "__code__", None):
        frame = frame.f_back                     # the loss function's own frame, before the mode was asked
    frame = frame.f_back if frame is not None and frame.f_back is not None else sys._getframe(1)
    for w in caught:
        key = (str(w.message), w.category, frame.f_code.co_filename, frame.f_lineno)
        if key not in shown:
            shown.add(key)
            warnings.warn_explicit(w.message, w.category, frame.f_code.co_filename, frame.f_lineno,
                                   module=frame.f_globals.get("__name__"))
    return result


class Watcher:
    """The installed instrumentation; forwards events to the detectors."""

    def __init__(self, steps: int) -> None:
        self.steps, self.step, self.backwards, self.forwards = steps, 0, 0, 0
        self.busy = False
        self.depth = 0
        self.names: dict[int, str] = {}
        self.last_scaler = None
        self.warned: set = set()
        self.detectors = [d(self) for d in EVERY_DETECTOR]
        self.call_names = LOSS_CALLS | SUM_CALLS | {"softmax"}
        self._by = {m: [getattr(d, m) for d in self.detectors if hasattr(d, m)]
                    for m in ("call", "backward", "forward_pre", "forward", "step_pre", "step_post")}
        self.handles: list[Any] = []
        self.patches: list[tuple[Any, str, Any]] = []

    @property
    def active(self) -> bool:
        return self.step < self.steps

    # --- what the detectors ask ---------------------------------------------------------------------------
    def where(self, outside_forward: bool = False) -> str | None:
        """file:line of the innermost frame outside torch, runpy and this watch (and, if asked, outside forward())."""
        frame = sys._getframe(1)
        while frame is not None:
            name = frame.f_code.co_filename
            if (not name.startswith(_SKIP_DIRS) and not name.startswith("<frozen")
                    and "contextlib" not in name
                    and not (outside_forward and frame.f_code.co_name == "forward"
                             and isinstance(frame.f_locals.get("self"), nn.Module))):
                return f"{name}:{frame.f_lineno}"
            frame = frame.f_back
        return None

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

    def on_backward(self, tensor) -> None:
        with self._quiet():
            self.backwards += 1
            self.depth = 0
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
                if id(module) not in self.names:
                    self.names.update({id(m): (n or type(m).__name__) for n, m in module.named_modules()})
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

    def step_pre(self, opt, args, kwargs) -> None:
        if not self.active:
            return
        with self._quiet():
            for pre in self._by["step_pre"]:
                pre(opt, self.step + 1)

    def step_post(self, opt, args, kwargs) -> None:
        if not self.active:
            return
        with self._quiet():
            self.step += 1
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
        from torch.utils.data import DataLoader

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
                return norm
            return wrapper

        scaler_cls = torch.amp.GradScaler
        self._patch(scaler_cls, "scale", scale)
        self._patch(scaler_cls, "unscale_", lambda o: around(o, lambda *a: amp.unscaled()))
        self._patch(scaler_cls, "step", lambda o: around(o, lambda s, *a: amp.scaler_step(s, a[0] if a else None)))
        self._patch(scaler_cls, "update", lambda o: around(o, lambda s, *a: amp.scaler_update(s)))
        self._patch(torch.nn.utils, "clip_grad_norm_", clip)
        self._patch(torch.nn.utils.clip_grad, "clip_grad_norm_", clip)
        self._patch(DataLoader, "__iter__", lambda o: around(o, lambda loader, *a: samplers.loader_iter(loader)))
        self.mode = _Mode(self)
        self.mode.__enter__()

    def remove(self) -> None:
        try:
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
        return found
