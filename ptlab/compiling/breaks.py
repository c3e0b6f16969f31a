"""Graph breaks: where Dynamo splits a function and why (explain), and what fullgraph=True raises."""
from __future__ import annotations

import contextlib
import io
import itertools
import tokenize
import types
from dataclasses import dataclass, field
from typing import Callable

import torch

from .logs import quiet_compile_logs


@dataclass(frozen=True)
class GraphBreaks:
    """What torch._dynamo.explain found: graphs, breaks, each break's reason (its first line) and source line."""

    graph_count: int
    break_count: int
    reasons: list[str]
    lines: list[str] = field(default_factory=list)   # the source line of each break, as Python shows it

    def __str__(self) -> str:
        out = [f"{self.graph_count} graph(s), {self.break_count} break(s)"]
        for i, reason in enumerate(self.reasons):
            out.append(f"  break {i + 1}: {reason}")
            if i < len(self.lines) and self.lines[i]:
                out.append(f"    at: {self.lines[i]}")
        return "\n".join(out)


def explain_breaks(fn: Callable, *args: object) -> GraphBreaks:
    """Run torch._dynamo.explain on fn(*args) and keep the counts, each reason's first line and its source line.

    explain runs in the default mode (fullgraph=False), where every break shows, `.item()` included.
    It calls torch._dynamo.reset() before and after: whatever was compiled earlier in the process
    compiles again on its next call. What fn prints while it is traced is swallowed; the compile loggers are quiet
    during the call.
    """
    if not callable(fn):
        raise TypeError(f"explain_breaks needs a callable, got {type(fn).__name__}")
    with quiet_compile_logs(), contextlib.redirect_stdout(io.StringIO()):
        result = torch._dynamo.explain(_fresh_copy(fn))(*args)
    reasons = [str(b.reason).strip().splitlines()[0] for b in result.break_reasons]
    lines = [_code_of(b.user_stack[-1].line or "") if b.user_stack else "" for b in result.break_reasons]
    return GraphBreaks(result.graph_count, result.graph_break_count, reasons, lines)


def _code_of(line: str) -> str:
    """A source line without its trailing comment and surrounding blanks."""
    try:
        for token in tokenize.generate_tokens(io.StringIO(line.strip()).readline):
            if token.type == tokenize.COMMENT:
                return line.strip()[:token.start[1]].rstrip()
    except (tokenize.TokenError, SyntaxError):   # a line that opens a bracket it does not close
        pass
    return line.strip()


def fullgraph_error(fn: Callable, *args: object) -> str:
    """The error torch.compile(fullgraph=True) raises on fn(*args), as 'Type: first line'; '' if none.

    In this torch version fullgraph=True also turns on capture_scalar_outputs: `.item()` is captured
    into the graph as a symbolic number and raises nothing, unlike a print or a branch on a tensor's value.
    """
    try:
        with quiet_compile_logs(), contextlib.redirect_stdout(io.StringIO()):
            torch.compile(_fresh_copy(fn), backend="eager", fullgraph=True)(*args)
    except Exception as error:  # dynamo raises torch._dynamo.exc.Unsupported and friends
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        return f"{type(error).__name__}: {first}"
    return ""


_copies = itertools.count()


def _fresh_copy(fn: Callable) -> Callable:
    """A copy of a plain function with its own code object and name, so Dynamo keeps no state from earlier calls.

    Dynamo caches compiled graphs on the code object and remembers which dims changed by function name
    and line; a fresh copy makes every count start from zero, without torch._dynamo.reset(), which would
    also throw away every other compiled model in the session.
    """
    if not isinstance(fn, types.FunctionType):
        return fn
    code = fn.__code__.replace(co_name=f"{fn.__name__}_copy{next(_copies)}")
    copy = types.FunctionType(code, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    copy.__kwdefaults__ = fn.__kwdefaults__
    return copy
