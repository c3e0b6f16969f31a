"""Watch a training run, unchanged, and name the course's pitfalls whose signs it saw, with what was measured and where.

    with ptlab.watch.watch(steps=200) as report:
        train()                       # your own loop
    print(report)

or, from a shell: `python -m ptlab watch train.py --lr 0.1 --steps 200 --json findings.json`.

The watch installs global instrumentation for the duration of the block: module forward (pre-)hooks, optimizer
step pre/post hooks, a TorchFunctionMode that sees calls such as F.cross_entropy, and thin wrappers around
GradScaler, clip_grad_norm_ and DataLoader.__iter__. It only observes: it draws no random numbers, edits no
tensor in place, and removes every hook and wrapper when the block ends. (While it is on, nn.Transformer layers
in eval mode leave their fused fast path, which global hooks disable, so their outputs can differ in the last
bits.) A finding is a lead to check with its `pitfalls run` demo, not a verdict: correct code can show a sign.
"""
from __future__ import annotations

import argparse
import json
import os
import runpy
import sys
import traceback
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import torch
from torch import nn
from torch.nn.modules.loss import _Loss
from torch.overrides import TorchFunctionMode

from ..models import SmallCNN
from ..timing import compare
from .detectors import DETECTORS, LOSS_CALLS, SHAPE_LOSSES, SUM_CALLS, Finding
from .wrapped import Amp, Samplers

__all__ = ["watch", "Report", "Finding", "DETECTS", "main", "measure_overhead", "overhead_line"]

# Which registered pitfall each detector observes (the registry test runs every one of them both ways).
DETECTS: dict[str, str] = {
    "missing-zero-grad": "the same .grad tensors only added to over >= 3 optimizer steps",
    "missing-zero-grad-training": "the same, over >= 10 optimizer steps of a training loop",
    "softmax-before-cross-entropy": "cross_entropy's input is the output of softmax",
    "broadcast-loss-shape": "mse_loss/l1_loss input and target broadcast to a larger shape",
    "eval-without-no-grad": "eval-mode forwards with grad enabled, no backward, outputs kept alive",
    "eval-without-eval-mode": "BatchNorm or Dropout in train mode inside a no-grad pass",
    "running-loss-keeps-graph": "a sum of >= 3 forwards' loss tensors with a grad_fn, never backpropagated",
    "nan-from-a-poisoned-sample": "NaN/inf in a model's input batch",
    "exploding-gradients-nan": "a non-finite loss from finite inputs",
    "learning-rate-too-high": "the loss rising >= 30x above its first value and staying >= 3x",
    "shuffled-labels": "training cross-entropy still >= 0.95 ln(C) after >= 50 steps",
    "shuffle-off-for-training": "first training batches hold < 2 distinct labels on average",
    "frozen-backbone-still-updated": "requires_grad=False parameters with a .grad changed by a step",
    "frozen-backbone-batchnorm-train-mode": "a BatchNorm with frozen parameters running in train mode",
    "fp16-without-scaler": "backward on a float16-autocast loss no enabled GradScaler scaled",
    "clip-without-unscale": "clip_grad_norm_ on gradients still scaled by a GradScaler",
    "scaler-update-forgotten": "GradScaler.step twice with no update between",
    "scaler-update-before-step": "GradScaler.update with no step before it",
    "ddp-sampler-without-set-epoch": "a shuffling DistributedSampler iterated again with the same epoch",
}

_OWN_DIR = str(Path(__file__).parent) + os.sep      # every file of this package
_SKIP_DIRS = (_OWN_DIR, str(Path(torch.__file__).parent), str(Path(runpy.__file__).parent))


@dataclass
class Report:
    """What one watch found: filled in when the watch ends; `print(report)` shows it."""

    findings: list[Finding] = field(default_factory=list)
    steps_observed: int = 0
    script_failed: bool = False

    @property
    def pitfalls(self) -> list[str]:
        """The ids found, in order."""
        return [f.pitfall for f in self.findings]

    def to_json(self) -> dict[str, Any]:
        """{"findings": [{"pitfall", "message", "evidence"}], "steps_observed": N}."""
        return {"findings": [f.to_json() for f in self.findings], "steps_observed": self.steps_observed}

    def __str__(self) -> str:
        head = f"ptlab watch: {self.steps_observed} optimizer steps observed, "
        if not self.findings:
            return head + "no pitfall found"
        lines = [head + f"{len(self.findings)} pitfall(s) found"]
        for f in self.findings:
            lines.append(f"- {f.pitfall}: {f.message}")
            if f.where:
                lines.append(f"    at {f.where}")
            lines.append(f"    reproduce: python -m ptlab pitfalls run {f.pitfall}")
        return "\n".join(lines)

    def __repr__(self) -> str:          # a notebook shows the report as it prints
        return str(self)


class _Mode(TorchFunctionMode):
    def __init__(self, watcher: "_Watcher") -> None:
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
    """Call a loss whose input and target shapes differ; its size warning names the learner's line, as without the watch.

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


class _Watcher:
    """The installed instrumentation; forwards events to the detectors."""

    def __init__(self, steps: int) -> None:
        self.steps, self.step, self.backwards, self.forwards = steps, 0, 0, 0
        self.busy = False
        self.depth = 0
        self.names: dict[int, str] = {}
        self.last_scaler = None
        self.warned: set = set()
        self.detectors = [d(self) for d in [*DETECTORS, Amp, Samplers]]
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

    def findings(self) -> list[Finding]:
        found: list[Finding] = []
        with torch._C.DisableTorchFunction():
            for detector in self.detectors:
                found += detector.findings()
        return found


@contextmanager
def watch(steps: int = 200) -> Iterator[Report]:
    """Observe the block's first `steps` optimizer steps; the yielded Report is filled in when the block ends."""
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an int >= 1, got {steps!r}")
    report = Report()
    watcher = _Watcher(steps)
    watcher.install()
    try:
        yield report
    finally:
        watcher.remove()
        report.steps_observed = watcher.step
        report.findings = watcher.findings()


def _split_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    """(the watch's own options, [SCRIPT, *its args]); --steps/--json are the watch's unless after `--`."""
    own, script = [], []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--" and script:
            script += argv[i + 1:]
            break
        if arg in ("--steps", "--json") and i + 1 < len(argv):
            own += argv[i:i + 2]
            i += 2
            continue
        if arg.startswith(("--steps=", "--json=")) or (not script and arg in ("-h", "--help")):
            own.append(arg)
        else:
            script.append(arg)
        i += 1
    return own, script


def main(argv: list[str] | None = None) -> int:
    """`python -m ptlab watch SCRIPT [ARGS...] [--steps N] [--json PATH]`: 0 nothing found, 1 found, 2 script failed."""
    own, script = _split_argv(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python -m ptlab watch", description=__doc__.splitlines()[0],
                                     usage="python -m ptlab watch SCRIPT [SCRIPT_ARGS...] [--steps N] [--json PATH]",
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                                     epilog="--steps and --json are the watch's wherever they stand; a script's own "
                                            "options of those names go after `--`. Exit status: 0 nothing found, "
                                            "1 a pitfall found, 2 the script failed.")
    parser.add_argument("--steps", type=int, default=200, help="optimizer steps to observe")
    parser.add_argument("--json", metavar="PATH", help="also write the findings as JSON to PATH")
    args = parser.parse_args(own)
    if not script:
        parser.error("give the training script to run: python -m ptlab watch SCRIPT [SCRIPT_ARGS...]")
    path = Path(script[0])
    if not path.is_file():
        parser.error(f"SCRIPT {str(path)!r} is not a file")
    report = run_script(path, script[1:], steps=args.steps)
    print(report, file=sys.stderr if report.script_failed else sys.stdout)
    if args.json:
        Path(args.json).write_text(json.dumps(report.to_json(), indent=2, default=str) + "\n", encoding="utf-8")
    return 2 if report.script_failed else (1 if report.findings else 0)


def run_script(path: Path, script_args: list[str], steps: int = 200) -> Report:
    """Run a script as __main__ with sys.argv set, under the watch; a failure's traceback is printed."""
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = [str(path), *script_args]
    sys.path.insert(0, str(path.resolve().parent))
    failed = False
    try:
        with watch(steps=steps) as report:
            try:
                runpy.run_path(str(path), run_name="__main__")
            except SystemExit as exit_:
                failed = exit_.code not in (None, 0)
            except BaseException:       # the script's own failure: show it, then the report
                failed = True
                traceback.print_exc()
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
    report.script_failed = failed
    return report


def measure_overhead(steps: int = 20, batch_size: int = 64, repeats: int = 5) -> dict[str, float]:
    """Chapter 4's SmallCNN training step with and without the watch, side by side: seconds per step and the ratio."""
    generator = torch.Generator().manual_seed(0)
    X = torch.randn(batch_size, 3, 32, 32, generator=generator)
    y = torch.randint(0, 10, (batch_size,), generator=generator)
    model = SmallCNN(width=16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def train_steps() -> None:
        for _ in range(steps):
            loss = nn.functional.cross_entropy(model(X), y)
            opt.zero_grad()
            loss.backward()
            opt.step()

    def watched() -> None:
        with watch(steps=10 * steps):
            train_steps()

    result = compare(train_steps, watched, warmup=1, repeats=repeats, names=("plain", "watched"))
    plain, with_watch = result.a.median / steps, result.b.median / steps
    return {"plain s/step": plain, "watched s/step": with_watch, "overhead": with_watch / plain - 1}


OVERHEAD_BUDGET = 0.25


def overhead_line() -> tuple[str, bool]:
    """make bench's line: the watch's overhead on chapter 4's SmallCNN step, and whether it is within budget."""
    figures = measure_overhead()
    within = figures["overhead"] <= OVERHEAD_BUDGET
    return (f"ptlab watch on a SmallCNN training step (batch 64): {figures['plain s/step'] * 1e3:.1f} ms plain, "
            f"{figures['watched s/step'] * 1e3:.1f} ms watched, overhead {figures['overhead']:+.0%} "
            f"(budget {OVERHEAD_BUDGET:.0%})"), within

