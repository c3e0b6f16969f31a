"""A gradient-flow detector: which parameters get no gradient, why, and where the graph was cut.

`diagnose_gradients(model, loss=...)` inspects a loss you computed; `diagnose_gradients(model,
batch=(X, y), loss_fn=...)` runs one forward pass itself, watching every torch call and module,
so it can name the op (detach, .data, no_grad, .item(), argmax...) and the module that cut the
graph. With `optimizer=` it also names parameters that get a gradient but that no param group holds,
or whose group has lr 0. Parameters, their .grad, buffers and the RNG of every device in use (CPU and
CUDA) are left as they were.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch
from torch import nn
from torch.utils._pytree import tree_flatten

from ._graph_cuts import LEAVE_GRAPH, CutEvent, ForwardWatcher, module_label, upstream_leaves
from .claims import measured
from .core import kept_random_state
from .loop import model_device, to_device
from .memory import SavedTensors, saved_tensor_bytes, storage_key  # noqa: F401  (their old import path)

# What each cause means, in the words the report prints.
CAUSES = {
    "frozen": "requires_grad is False",
    "unregistered": "held in a plain list, dict or tensor attribute: invisible to parameters(), "
                    "so the optimizer never updates it",
    "detach": "the graph was cut by detach()",
    "data": "the graph was cut by .data",
    "no_grad": "computed under torch.no_grad() inside forward",
    "inference_mode": "computed under torch.inference_mode() inside forward",
    "round-trip": "left the graph through .item(), .numpy() or .tolist(): a Python number or an array has "
                  "no graph, whether or not it is turned back into a tensor",
    "non-differentiable": "reached the loss only through an op with an integer or bool result "
                          "(argmax, a comparison, an integer cast)",
    "unused": "never used in forward",
    "output-unused": "used in forward, but that result never reaches the loss",
    "not-in-graph": "not in the loss's graph (pass batch= to find where it was cut)",
    "buffer": "registered with register_buffer while requires_grad=True: saved in state_dict, but not in "
              "parameters(), so no optimizer ever updates it (make it an nn.Parameter, or drop requires_grad)",
    "not-in-optimizer": "gets a gradient, but no param group of the optimizer holds it: step() never updates it",
    "lr-zero": "gets a gradient, but its param group has lr 0: step() leaves it where it is",
    "zero": "the gradient is exactly 0",
    "vanishing": "the gradient is vanishingly small compared with the other parameters'",
    "non-finite": "the gradient holds NaN or inf",
    "partial": "gets a gradient, but one of its paths to the loss was cut: that path adds nothing to it",
    "custom-function": "reached the loss only through a custom autograd.Function whose backward returns None for it",
}
_LOSS_FN = "(loss_fn)"


@dataclass(frozen=True)
class GradientFinding:
    """One parameter with a problem: its name, owning module, the cause and a readable detail."""

    parameter: str
    module: str
    cause: str
    detail: str

    @property
    def explanation(self) -> str:
        return CAUSES[self.cause]


@dataclass
class GradientReport:
    """What diagnose_gradients found; print it for a table, use .healthy in assertions."""

    parameters: list[str]
    missing: list[GradientFinding] = field(default_factory=list)
    weak: list[GradientFinding] = field(default_factory=list)
    unregistered: list[GradientFinding] = field(default_factory=list)
    optimizer_gaps: list[GradientFinding] = field(default_factory=list)
    partial: list[GradientFinding] = field(default_factory=list)
    first_cut_module: str | None = None
    backward_error: str | None = None
    inplace_ops: list[str] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def findings(self) -> list[GradientFinding]:
        return [*self.unregistered, *self.missing, *self.partial, *self.weak, *self.optimizer_gaps]

    @property
    def healthy(self) -> bool:
        """True when every parameter is registered, got a finite, non-vanishing gradient through every path
        it takes to the loss and, when an optimizer was given, is in one of its param groups with a non-zero lr.

        Stale gradients (`.grad` already holding a gradient) do not count: a loop that calls zero_grad()
        at the top of each step, or accumulates over micro-batches, holds them between steps by design,
        so only the loop can tell whether they are a bug. They are listed in `.stale`, flagged by
        `.has_stale_gradients` and printed as a warning line.
        """
        return not self.findings and self.backward_error is None

    @property
    def has_stale_gradients(self) -> bool:
        """True when some parameter's .grad already held a non-zero gradient when the report was made."""
        return bool(self.stale)

    @property
    def causes(self) -> dict[str, str]:
        """Parameter name -> cause, for every finding."""
        return {f.parameter: f.cause for f in self.findings}

    def __str__(self) -> str:
        n = len(self.parameters)
        if self.healthy:
            lines = [f"gradient flow: healthy ({n} parameters, each got a finite, non-vanishing gradient)"]
        else:
            problems = len(self.findings) + (self.backward_error is not None)
            lines = [f"gradient flow: {problems} problem(s) among {n} parameters"]
        if self.findings:
            width = max(len(f.parameter) for f in [*self.findings, GradientFinding("parameter", "", "", "")]) + 2
            cause_width = max(len(f.cause) for f in self.findings) + 2
            lines.append(f"  {'parameter':<{width}}{'cause':<{cause_width}}detail")
            lines += [f"  {f.parameter:<{width}}{f.cause:<{cause_width}}{f.detail}" for f in self.findings]
            lines.append("causes:")
            lines += [f"  {cause} = {CAUSES[cause]}" for cause in dict.fromkeys(f.cause for f in self.findings)]
        if self.first_cut_module is not None:
            lines.append(f"first module whose output lost its grad_fn: {self.first_cut_module}")
        if self.backward_error:
            lines.append(f"backward fails: {self.backward_error}")
        lines += [f"in-place op on a tensor in the graph: {op}" for op in self.inplace_ops]
        if self.stale:
            lines.append(f".grad already holds an earlier gradient: the next backward() adds to it unless "
                         f"zero_grad() runs first: {', '.join(self.stale)}")
        lines += [f"note: {note}" for note in self.notes]
        return "\n".join(lines)

    __repr__ = __str__


def _walk_plain_containers(value: Any, path: str, depth: int = 0) -> Iterator[tuple[str, Any]]:
    """(path, item) for every module or tensor inside nested plain lists, tuples, sets and dicts."""
    if depth > 3:
        return
    if isinstance(value, dict):
        items = [(f"{path}[{k!r}]", v) for k, v in value.items()]
    elif isinstance(value, (list, tuple)):
        items = [(f"{path}[{i}]", v) for i, v in enumerate(value)]
    else:
        return
    for item_path, item in items:
        if isinstance(item, (nn.Module, torch.Tensor)):
            yield item_path, item
        else:
            yield from _walk_plain_containers(item, item_path, depth + 1)


def unregistered_parameters(model: nn.Module) -> dict[str, tuple[torch.Tensor, nn.Module | None]]:
    """Trainable tensors a module holds where parameters() cannot see them, by path like blocks[1].weight."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    internals = set(vars(nn.Module()))
    registered = {id(p) for p in model.parameters()}
    found: dict[str, tuple[torch.Tensor, nn.Module | None]] = {}
    todo = [(name, m) for name, m in model.named_modules()]
    seen_modules = {id(m) for _, m in todo}
    while todo:
        prefix, module = todo.pop(0)
        dot = f"{prefix}." if prefix else ""
        for attr, value in vars(module).items():
            if attr in internals:
                continue
            candidates = [(f"{dot}{attr}", value)] if isinstance(value, torch.Tensor) \
                else _walk_plain_containers(value, f"{dot}{attr}")
            for path, item in candidates:
                if isinstance(item, nn.Module):
                    for pname, p in item.named_parameters():
                        if id(p) not in registered:
                            found[f"{path}.{pname}"] = (p, item)
                    for sub_name, sub in item.named_modules():
                        if id(sub) not in seen_modules:
                            seen_modules.add(id(sub))
                            todo.append((f"{path}.{sub_name}" if sub_name else path, sub))
                elif item.requires_grad and item.is_leaf and id(item) not in registered:
                    found[path] = (item, None)
    return found


def _probe_loss(output: Any) -> torch.Tensor:
    """A scalar from a model output: a fixed random projection, so a softmax output still gets gradient."""
    if not isinstance(output, torch.Tensor):
        raise TypeError(f"the model returned {type(output).__name__}; pass loss_fn= to turn it into a scalar loss")
    weights = torch.randn(output.shape, generator=torch.Generator().manual_seed(0)).to(output.device)
    return (output * weights.to(output.dtype)).sum() if output.is_floating_point() else output.sum()


def _check_loss(loss: Any, name: str) -> None:
    if not isinstance(loss, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(loss).__name__} "
                        "(a Python number, e.g. from loss.item(), has no graph)")
    if loss.numel() != 1:
        raise ValueError(f"{name} must be a scalar (one element), got shape {tuple(loss.shape)}: "
                         "reduce it with .mean() or .sum() first")


def _run_forward(model: nn.Module, batch: Any, loss_fn: Callable | None,
                 extra_modules: dict[str, nn.Module]) -> tuple[torch.Tensor, ForwardWatcher]:
    """One watched forward pass and loss; warnings raised on the way are kept in watcher.warnings."""
    if isinstance(batch, torch.Tensor):
        inputs, target = batch, None
    elif len(batch) in (1, 2):
        inputs, target = batch[0], (batch[1] if len(batch) == 2 else None)
    else:
        raise ValueError(f"batch must be X, (X,) or (X, y), got a {type(batch).__name__} of length {len(batch)}")
    device = model_device(model)              # the batch goes where the model is, as a training loop moves it
    if device is not None:
        inputs = to_device(inputs, device) if isinstance(inputs, torch.Tensor) else inputs
        target = to_device(target, device) if isinstance(target, torch.Tensor) else target
    watcher = ForwardWatcher()
    modules = {**dict(model.named_modules()), **extra_modules}
    handles = [h for name, m in modules.items()
               for h in (m.register_forward_pre_hook(watcher.pre_hook(name)),
                         m.register_forward_hook(watcher.post_hook(name)))]
    try:
        with warnings.catch_warnings(record=True) as caught, torch.enable_grad(), watcher:
            warnings.simplefilter("always")
            output = model(inputs)
            watcher.module_stack = [_LOSS_FN]
            if loss_fn is None:
                loss = _probe_loss(output)
            else:
                loss = loss_fn(output, target) if target is not None else loss_fn(output)
    finally:
        for h in handles:
            h.remove()
    watcher.warnings = list(dict.fromkeys(str(w.message).split("\n")[0].split(" (Triggered")[0] for w in caught))
    _check_loss(loss, "the loss computed from batch")
    return loss, watcher


def _devices_in_use(model: nn.Module, batch: Any) -> list[torch.device]:
    tensors = [*model.parameters(), *model.buffers(),
               *(t for t in tree_flatten(batch)[0] if isinstance(t, torch.Tensor))]
    return list({t.device for t in tensors})


def diagnose_gradients(model: nn.Module, loss: torch.Tensor | None = None, batch: Any = None,
                       loss_fn: Callable | None = None, vanishing: float = 1e-6,
                       allow_frozen: bool = False,
                       optimizer: torch.optim.Optimizer | None = None) -> GradientReport:
    """Report parameters with no, zero, vanishing or non-finite gradient, or left out of `optimizer`, and why."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if (loss is None) == (batch is None):
        raise ValueError("pass exactly one of loss= (a scalar loss with its graph) or batch= (X or (X, y))")
    if batch is not None and not isinstance(batch, (torch.Tensor, tuple, list)):
        raise TypeError(f"batch must be a tensor X or a tuple (X, y), got {type(batch).__name__}")
    if loss_fn is not None and not callable(loss_fn):
        raise TypeError(f"loss_fn must be callable, got {type(loss_fn).__name__}")
    if not (isinstance(vanishing, (int, float)) and 0 <= vanishing < 1):
        raise ValueError(f"vanishing must be a number in [0, 1), got {vanishing!r}")
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    named = dict(model.named_parameters())
    hidden = unregistered_parameters(model)
    if not named and not hidden:
        raise ValueError(f"model ({type(model).__name__}) has no parameters, registered or not: nothing to diagnose")
    report = GradientReport(parameters=[*named, *hidden])
    for path in hidden:
        container = path.split("[", 1)[0] if "[" in path else path
        what = "a plain tensor attribute, not an nn.Parameter" if container == path \
            else f"in the plain container `{container}`"
        report.unregistered.append(GradientFinding(path, _owner_of_path(path), "unregistered", what))
    for name, buffer in model.named_buffers():
        if buffer.requires_grad:
            report.parameters.append(name)
            report.unregistered.append(GradientFinding(name, _owner_of_path(name), "buffer",
                                                      "a buffer with requires_grad=True, not an nn.Parameter"))
    report.stale = [n for n, p in named.items() if p.grad is not None and bool(p.grad.any())]

    if loss is not None:
        _check_loss(loss, "loss")
        if not loss.requires_grad:
            raise ValueError("loss has no graph (grad_fn is None, requires_grad is False): it was computed under "
                             "no_grad/inference_mode, from detached tensors, or rebuilt from a number. Pass batch= "
                             "(and loss_fn=) instead, so the detector runs forward itself and finds the cut")
        return _fill_report(report, model, loss, None, hidden, vanishing, allow_frozen, optimizer)
    extra = {path.rsplit(".", 1)[0]: m for path, (_, m) in hidden.items() if m is not None}
    buffers = {name: b.clone() for name, b in model.named_buffers()}
    try:
        # Dropout and the like draw random numbers: restore the generator of every device in use.
        with kept_random_state(_devices_in_use(model, batch)):
            loss, watcher = _run_forward(model, batch, loss_fn, extra)
        return _fill_report(report, model, loss, watcher, hidden, vanishing, allow_frozen, optimizer)
    finally:
        with torch.no_grad():  # BatchNorm running stats and the like, as they were
            for name, b in model.named_buffers():
                if name in buffers and not torch.equal(b, buffers[name]):
                    b.copy_(buffers[name])


def _owner_of_path(path: str) -> str:
    """`blocks[1].weight` -> `blocks[1]`; a top-level attribute belongs to the model."""
    return path.rsplit(".", 1)[0] if "." in path else "(model)"


def _fill_report(report: GradientReport, model: nn.Module, loss: torch.Tensor, watcher: ForwardWatcher | None,
                 hidden: dict, vanishing: float, allow_frozen: bool,
                 optimizer: torch.optim.Optimizer | None = None) -> GradientReport:
    """Compute the gradients with autograd.grad (leaving .grad alone) and explain what is wrong."""
    named = dict(model.named_parameters())
    owner = {id(p): module_label(name) for name, m in model.named_modules() for p in m.parameters(recurse=False)}
    if watcher is not None:
        report.notes += [f"warning during forward: {m}" for m in watcher.warnings]
        report.first_cut_module = watcher.lost_grad_fn[0] if watcher.lost_grad_fn else None
    trainable = {n: p for n, p in named.items() if p.requires_grad}
    trainable.update({n: t for n, (t, _) in hidden.items() if t.requires_grad})
    grads: dict[str, torch.Tensor | None] = dict.fromkeys(trainable)
    if loss.requires_grad and trainable:
        try:
            values = torch.autograd.grad(loss, list(trainable.values()), allow_unused=True, retain_graph=True)
        except RuntimeError as err:
            if "backward through the graph a second time" in str(err):
                raise ValueError("the loss's graph was already freed by backward(): call diagnose_gradients "
                                 "before loss.backward(), or pass batch=") from err
            report.backward_error = str(err).split(" Hint:")[0]
            if watcher is not None:
                report.inplace_ops = list(dict.fromkeys(watcher.inplace_on_graph))
            return report
        grads = dict(zip(trainable, values))
    for name, p in named.items():
        if not p.requires_grad:
            if not allow_frozen:
                report.missing.append(GradientFinding(name, owner.get(id(p), "(model)"), "frozen",
                                                      "requires_grad=False"))
        elif grads[name] is None:
            report.missing.append(_explain_missing(name, owner.get(id(p), "(model)"), p, watcher, loss))
    if watcher is not None:
        _flag_partial_cuts(report, watcher, loss, {n: p for n, p in named.items() if grads.get(n) is not None}, owner)
    _flag_weak(report, {n: g for n, g in grads.items() if n in named}, owner, named, vanishing)
    if optimizer is not None:
        _flag_optimizer_gaps(report, optimizer, {n: p for n, p in named.items() if grads.get(n) is not None}, owner)
    if watcher is not None:
        for i, event in enumerate(watcher.events):
            explained = i in watcher.blamed or event.ancestors & watcher.blamed
            if event.kind in ("detach", "data", "no_grad", "round-trip") and not explained:
                report.notes.append(f"{_where(event)} left the graph; no finding above is attributed to it")
        report.notes = list(dict.fromkeys(report.notes))
    return report


def _flag_partial_cuts(report: GradientReport, watcher: ForwardWatcher, loss: torch.Tensor,
                       with_grad: dict[str, torch.Tensor], owner: dict[int, str]) -> None:
    """Parameters that got a gradient although a cut whose result reaches the loss also started from them."""
    feeding_loss = watcher.taint.get(id(loss), set())
    for i, event in enumerate(watcher.events):
        if event.kind not in ("detach", "data", "no_grad", "inference_mode", "round-trip") or i not in feeding_loss:
            continue
        leaves = set().union(*(upstream_leaves(t) for t in event.graph_inputs))
        for name, p in with_grad.items():
            if id(p) in leaves:
                watcher.blamed.add(i)
                report.partial.append(GradientFinding(name, owner.get(id(p), "(model)"), "partial",
                                                     f"{_where(event)} cut one of its paths to the loss; its gradient "
                                                     "comes through the others only"))


def _flag_optimizer_gaps(report: GradientReport, optimizer: torch.optim.Optimizer,
                         with_grad: dict[str, torch.Tensor], owner: dict[int, str]) -> None:
    """Parameters that got a gradient but that the optimizer never moves: in no param group, or lr 0."""
    lr_of = {id(p): float(group.get("lr", 0.0)) for group in optimizer.param_groups for p in group["params"]}
    for name, p in with_grad.items():
        module = owner.get(id(p), "(model)")
        if id(p) not in lr_of:
            report.optimizer_gaps.append(GradientFinding(name, module, "not-in-optimizer",
                                                        f"in none of the {len(optimizer.param_groups)} param group(s)"))
        elif lr_of[id(p)] == 0.0:
            report.optimizer_gaps.append(GradientFinding(name, module, "lr-zero", "its param group has lr 0"))


def _where(event: CutEvent) -> str:
    place = "the loss function" if event.module == _LOSS_FN else f"the forward of {module_label(event.module)}"
    return f"`{event.op}` in {place}"


def _explain_missing(name: str, module: str, p: torch.Tensor, watcher: ForwardWatcher | None,
                     loss: torch.Tensor) -> GradientFinding:
    """Why a trainable, registered parameter got no gradient."""
    if watcher is None:
        return GradientFinding(name, module, "not-in-graph", "pass batch= to find where the graph was cut")
    feeding_loss = watcher.taint.get(id(loss), set())
    upstream = [i for i, e in enumerate(watcher.events)
                if any(id(p) in upstream_leaves(t) for t in e.graph_inputs)]
    ranked = [i for i in upstream if i in feeding_loss] or upstream
    if ranked:
        event = watcher.events[ranked[0]]
        watcher.blamed.add(ranked[0])
        onward = [e for e in watcher.events if ranked[0] in e.ancestors and e.op in LEAVE_GRAPH]
        if event.kind in ("detach", "data") and onward:  # x.detach().numpy() -> torch.tensor(...)
            event = CutEvent(f"{event.op}().{onward[0].op}", "round-trip", event.module, event.graph_inputs)
        if event.kind == "custom-function":
            return GradientFinding(name, module, event.kind, f"the backward of {event.op} returns None for it")
        return GradientFinding(name, module, event.kind, _where(event))
    if id(p) not in watcher.used:
        return GradientFinding(name, module, "unused", f"{module} was never called, or this parameter never read")
    return GradientFinding(name, module, "output-unused", "its result is computed, then dropped before the loss")


def _flag_weak(report: GradientReport, grads: dict[str, torch.Tensor | None], owner: dict[int, str],
               named: dict[str, torch.Tensor], vanishing: float) -> None:
    """Add zero, vanishing and non-finite gradients to report.weak (RMS per element, so sizes compare)."""
    rms = {n: (g.detach().double().norm() / math.sqrt(max(g.numel(), 1))).item()
           for n, g in grads.items() if g is not None}
    largest = max((v for v in rms.values() if math.isfinite(v)), default=0.0)
    for name, value in rms.items():
        module = owner.get(id(named[name]), "(model)")
        if not math.isfinite(value):
            report.weak.append(GradientFinding(name, module, "non-finite", "NaN or inf in the gradient"))
        elif value == 0.0:
            report.weak.append(GradientFinding(name, module, "zero",
                                               "every element is 0 (dead ReLU, round(), sign(), x * 0?)"))
        elif value < vanishing * largest:
            report.weak.append(GradientFinding(name, module, "vanishing",
                                              f"RMS {measured(value, 2)}, under {vanishing:g} x the largest "
                                              f"({measured(largest, 2)})"))


