"""Private to ptlab.diagnose: a TorchFunctionMode that watches one forward pass and records where the graph was cut."""
from __future__ import annotations

import inspect
import sys
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

LEAVE_GRAPH = {"item", "tolist", "numpy", "__float__", "__int__", "__index__"}


REWRAP = {"tensor", "as_tensor", "from_numpy", "asarray"}


MUTATING_DUNDERS = {"__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__", "__ipow__"}


@dataclass
class CutEvent:
    """A torch call inside forward whose input carried the graph and whose result does not."""

    op: str
    kind: str
    module: str
    graph_inputs: list[torch.Tensor]
    ancestors: frozenset[int] = frozenset()     # earlier cut events its input descends from


def module_label(name: str) -> str:
    return name if name else "(model)"


class ForwardWatcher(TorchFunctionMode):
    """Logs, during one forward pass, every torch call that cuts the graph and the module it ran in."""

    def __init__(self) -> None:
        super().__init__()
        self.module_stack: list[str] = []
        self.events: list[CutEvent] = []
        self.used: set[int] = set()               # ids of tensors that entered any torch call
        self.taint: dict[int, set[int]] = {}       # id(tensor) -> indices of cut events it descends from
        self.keep_alive: list[Any] = []            # so ids stay unique while we look them up
        self.inplace_on_graph: list[str] = []      # in-place ops on tensors that carried the graph
        self.lost_grad_fn: list[str] = []          # modules whose output lost the graph, in order
        self.paused = False
        self.warnings: list[str] = []
        self.blamed: set[int] = set()              # events that explain a missing gradient

    @property
    def current_module(self) -> str:
        return self.module_stack[-1] if self.module_stack else ""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.paused:
            return func(*args, **kwargs)
        name = getattr(func, "__name__", str(func))
        owner = getattr(getattr(func, "__self__", None), "__name__", None)
        if name == "__get__" and owner != "data":  # attribute reads (.shape, .T, .mT ...) cut nothing
            result = func(*args, **kwargs)
            taint = self.taint.get(id(args[0])) if args and isinstance(args[0], torch.Tensor) else None
            if taint and isinstance(result, torch.Tensor):     # a view such as .T carries what it came from
                self.taint[id(result)] = taint
                self.keep_alive.append(result)
            return result
        op = "data" if name == "__get__" else name
        inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        self.used.update(id(t) for t in inputs)
        graph_inputs = [t for t in inputs if t.requires_grad]
        if graph_inputs and inputs[0].requires_grad:
            if op in MUTATING_DUNDERS or (op.endswith("_") and not op.startswith("_")):
                self.inplace_on_graph.append(f"`{op}` in the forward of {module_label(self.current_module)}")
            elif asks_inplace(func, args, kwargs):   # F.relu(x, inplace=True), nn.ReLU(inplace=True), F.dropout
                self.inplace_on_graph.append(f"`{op}(inplace=True)` in the forward of "
                                             f"{module_label(self.current_module)}")
        result = func(*args, **kwargs)
        outputs = [t for t in tree_flatten(result)[0] if isinstance(t, torch.Tensor)]
        taint = set().union(*(self.taint.get(id(t), set()) for t in inputs)) if inputs else set()
        kind = self._cut_kind(op, graph_inputs, outputs)
        if kind is None and op in LEAVE_GRAPH and taint:  # x.detach().numpy(): the second half of a round trip
            kind = "round-trip"
        if kind is not None:
            name = (custom_function_running() or op) if kind == "custom-function" else op
            self.events.append(CutEvent(name, kind, self.current_module, graph_inputs, frozenset(taint)))
            taint = taint | {len(self.events) - 1}
        elif op in REWRAP and not graph_inputs:  # torch.tensor(number): came back from a round trip?
            taint = taint | {i for i, e in enumerate(self.events) if e.kind == "round-trip"}
        if taint:
            for t in outputs:
                self.taint[id(t)] = taint
                self.keep_alive.append(t)
        return result

    def _cut_kind(self, op: str, graph_inputs: list, outputs: list) -> str | None:
        if not graph_inputs or op.endswith("_like") or op.startswith("new_"):
            return None
        if op in LEAVE_GRAPH:
            return "round-trip"
        if not outputs or any(t.requires_grad for t in outputs):
            return None
        if op in ("detach", "detach_"):
            return "detach"
        if op == "data":
            return "data"
        if torch.is_inference_mode_enabled():
            return "inference_mode"
        if not torch.is_grad_enabled():
            return "custom-function" if custom_function_running() else "no_grad"
        if not any(t.is_floating_point() or t.is_complex() for t in outputs):
            return "non-differentiable"
        return None

    def pre_hook(self, name: str):
        def hook(module, args):
            self.module_stack.append(name)
        return hook

    def post_hook(self, name: str):
        def hook(module, args, output):
            self.paused = True
            try:
                should_carry = any(isinstance(a, torch.Tensor) and a.requires_grad for a in tree_flatten(args)[0]) \
                    or any(p.requires_grad for p in module.parameters())
                outs = [t for t in tree_flatten(output)[0] if isinstance(t, torch.Tensor) and t.is_floating_point()]
                if should_carry and outs and not any(t.requires_grad for t in outs):
                    self.lost_grad_fn.append(module_label(name))
            finally:
                self.paused = False
                if self.module_stack:
                    self.module_stack.pop()
        return hook


@lru_cache(maxsize=None)
def _signature(func: Any) -> inspect.Signature | None:
    try:
        return inspect.signature(func)
    except (TypeError, ValueError):        # a builtin without a signature
        return None


def asks_inplace(func: Any, args: tuple, kwargs: dict) -> bool:
    """Whether a call passes inplace=True, by keyword or by position (nn.Dropout calls F.dropout(x, p, t, inplace))."""
    if kwargs.get("inplace") is True:
        return True
    try:
        signature = _signature(func)
    except TypeError:                      # an unhashable callable
        signature = None
    if signature is None or "inplace" not in signature.parameters:
        return False
    try:
        return signature.bind_partial(*args, **kwargs).arguments.get("inplace") is True
    except TypeError:
        return False


def custom_function_running() -> str | None:
    """The name of the custom autograd.Function whose forward is running, if one is (its ctx is in a frame)."""
    frame = sys._getframe(1)
    for _ in range(40):
        if frame is None:
            return None
        ctx = frame.f_locals.get("ctx") if frame.f_code.co_name == "forward" else None
        if isinstance(ctx, torch.autograd.function.FunctionCtx):
            return type(ctx).__name__.removesuffix("Backward")
        frame = frame.f_back
    return None


def upstream_leaves(t: torch.Tensor) -> set[int]:
    """ids of the leaf tensors (parameters) a tensor's graph reaches back to."""
    if t.grad_fn is None:
        return {id(t)} if t.requires_grad else set()
    found, seen, todo = set(), set(), [t.grad_fn]
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        variable = getattr(node, "variable", None)
        if variable is not None:
            found.add(id(variable))
        todo.extend(next_node for next_node, _ in node.next_functions)
    return found
