"""Graphs and recompiles counted over a sequence of calls, and TORCH_LOGS="graph_breaks,recompiles" in-process."""
from __future__ import annotations

import re
import time
import types
from dataclasses import dataclass
from typing import Callable, Iterable

import torch

from .breaks import _fresh_copy
from .logs import _artifacts_logged, _dynamo_warnings_collected, quiet_compile_logs


@dataclass(frozen=True)
class CompileCount:
    """Graphs Dynamo compiled over a sequence of calls, how many were recompiles, and what Dynamo warned."""

    graphs: int            # every graph compiled: a graph break splits a function into two
    seconds: float         # wall time of all the calls: tracing and running, with the counting backend (no Inductor)
    recompiles: int = 0    # graphs compiled again for code compiled before: its guards failed on a new input
    graph_runs: int = 0    # times a compiled graph ran; a call that Dynamo left to eager mode runs none
    warnings: tuple[str, ...] = ()   # first line of each warning Dynamo logged (e.g. the recompile limit), in order
    outputs: tuple = ()    # what each call returned, in order (to compare with eager)


def count_compiles(fn: Callable, calls: Iterable[tuple], *, dynamic: bool | None = None,
                   fullgraph: bool = False, mark_dynamic_dims: dict[int, int] | None = None) -> CompileCount:
    """Compile a plain function with a counting backend, call it on each args tuple, count graphs and recompiles.

    The backend runs each captured graph as it is (no Inductor), so counting costs tracing only.
    `mark_dynamic_dims={arg_index: dim}` calls torch._dynamo.mark_dynamic on that argument of the first call.
    Dynamo's warnings during the calls (such as 'torch._dynamo hit config.recompile_limit (8)') are
    collected in the result instead of printed, and so is what each call returned.
    """
    from torch._guards import CompileContext

    if not isinstance(fn, types.FunctionType):
        raise TypeError(f"count_compiles takes a plain Python function, got {type(fn).__name__}")
    calls = [tuple(c) for c in calls]
    if not calls:
        raise ValueError("count_compiles needs at least one call (a tuple of arguments)")
    compiles: list[int] = []   # per graph: how many times Dynamo had compiled its code (frame) before
    runs = [0]

    def counting_backend(gm: torch.fx.GraphModule, example_inputs):
        compile_id = CompileContext.current_compile_id()
        compiles.append(compile_id.frame_compile_id if compile_id is not None else 0)

        def run(*args):
            runs[0] += 1
            return gm.forward(*args)
        return run

    compiled = torch.compile(_fresh_copy(fn), backend=counting_backend, dynamic=dynamic, fullgraph=fullgraph)
    for arg_index, dim in (mark_dynamic_dims or {}).items():
        torch._dynamo.mark_dynamic(calls[0][arg_index], dim)
    start = time.perf_counter()
    with _dynamo_warnings_collected() as logged:
        outputs = tuple(compiled(*args) for args in calls)
    return CompileCount(len(compiles), time.perf_counter() - start, sum(1 for n in compiles if n > 0), runs[0],
                        tuple(logged), outputs)


@dataclass(frozen=True)
class CompileLogs:
    """What TORCH_LOGS="graph_breaks,recompiles" logged over some calls: each message whole, and its reasons."""

    graph_breaks: tuple[str, ...]   # each graph-break message, whole (it names files and lines of this machine)
    recompiles: tuple[str, ...]     # each recompile message, whole

    @property
    def break_reasons(self) -> list[str]:
        """Per graph break, its kind: the line before '  Explanation:' (the reason without paths)."""
        reasons = []
        for message in self.graph_breaks:
            lines = [line for line in message.splitlines() if line.strip()]
            at = next((i for i, line in enumerate(lines) if line.startswith("  Explanation:")), 0)
            reasons.append(lines[at - 1].removeprefix("Graph Break Reason: ").strip() if at else lines[0])
        return reasons

    @property
    def recompile_reasons(self) -> list[list[str]]:
        """Per recompile, the guard failures that caused it, without Dynamo's frame/graph ids ('0/1: ')."""
        return [[re.sub(r"^- \d+/\d+: ", "", line.strip()) for line in message.splitlines()
                 if line.strip().startswith("- ")] for message in self.recompiles]

    def __str__(self) -> str:
        out = [f"graph break: {reason}" for reason in self.break_reasons]
        out += [f"recompile:   {'; '.join(failures)}" for failures in self.recompile_reasons]
        return "\n".join(out) or "nothing logged"


def capture_compile_logs(fn: Callable, calls: Iterable[tuple], *, dynamic: bool | None = None,
                         backend: str = "eager") -> CompileLogs:
    """Compile fn, call it on each args tuple, and return what TORCH_LOGS="graph_breaks,recompiles" would print.

    The logs are collected in-process instead of printed, and torch's logging is left as it was. A plain
    function is compiled as a fresh copy, so nothing compiled before counts. backend="eager" traces, breaks and
    recompiles as Dynamo does for Inductor, without code generation.
    """
    if not callable(fn):
        raise TypeError(f"capture_compile_logs needs a callable, got {type(fn).__name__}")
    calls = [tuple(c) for c in calls]
    if not calls:
        raise ValueError("capture_compile_logs needs at least one call (a tuple of arguments)")
    compiled = torch.compile(_fresh_copy(fn), backend=backend, dynamic=dynamic)
    with quiet_compile_logs(), _artifacts_logged() as records:
        for args in calls:
            compiled(*args)
    return CompileLogs(tuple(m for name, m in records if name == "graph_breaks"),
                       tuple(m for name, m in records if name == "recompiles"))
