"""torch.compile measured honestly: compile time, speed-up after warm-up, break-even, graph breaks, recompiles.

Every speed figure here is measured side by side on this machine (`ptlab.timing.compare`); what a
notebook claims about it is a ratio with a wide margin, never an absolute time.
"""
from __future__ import annotations

import contextlib
import copy
import io
import itertools
import logging
import math
import os
import re
import sys
import time
import tokenize
import types
from dataclasses import dataclass, field
from typing import Callable, Iterable

import torch
import torch.nn.functional as F
from torch import nn

from .claims import measured, measured_seconds
from .timing import compare

# Loggers that print compile-time notes to stderr (a missing CUDA runtime, a graph break from .item(),
# a recompile limit); quiet_compile_logs() silences them for the duration of a block only.
_NOISY_LOGGERS = ("torch._dynamo", "torch._inductor", "torch.utils.cpp_extension", "torch.fx.experimental")


@contextlib.contextmanager
def quiet_compile_logs(level: int = logging.ERROR):
    """Raise the level of torch's compile loggers inside the block; restore it afterwards."""
    loggers = [logging.getLogger(name) for name in _NOISY_LOGGERS]
    before = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(level)
    try:
        yield
    finally:
        for lg, old in zip(loggers, before):
            lg.setLevel(old)


def use_inductor_cache_per_cpu_capability() -> str:
    """Give Inductor's on-disk cache a directory per CPU capability (under the temp dir); return its name.

    In torch 2.14 the cache can hand back C++ generated for one vector ISA after ATEN_CPU_CAPABILITY
    selected another, and the build then fails ('at::vec has not been declared'). A directory per
    capability keeps each cache warm and right. A TORCHINDUCTOR_CACHE_DIR already set is left alone.
    Call it before the first compile, and before `import torch._dynamo`: that import sets the variable to
    Inductor's default directory, which this function would then leave alone.
    """
    import getpass
    import os
    import re
    import tempfile

    if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
        try:
            user = re.sub(r"[^A-Za-z0-9_.-]", "_", getpass.getuser())
        except (KeyError, OSError):   # no user name (some containers)
            user = "user"
        name = f"torchinductor_{user}_{torch.backends.cpu.get_cpu_capability().lower()}"
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(tempfile.gettempdir(), name)
    return os.path.basename(os.environ["TORCHINDUCTOR_CACHE_DIR"])


def inductor_vectorizes() -> bool:
    """Whether Inductor emits SIMD C++ here (False under ATEN_CPU_CAPABILITY=default: scalar code)."""
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    with quiet_compile_logs():
        return bool(pick_vec_isa())


def compile_threads_rule(environ: dict[str, str] | None = None, platform: str | None = None,
                         usable_cpus: int | None = None) -> tuple[int, str]:
    """Inductor's compile_threads as torch decides it (decide_compile_threads), and which case decided it.

    TORCHINDUCTOR_COMPILE_THREADS wins; else 1 on Windows; else min(32, CPUs this process may run on:
    len(os.sched_getaffinity(0)) where the OS has it, os.cpu_count() elsewhere). The defaults read this process.
    (Inside Meta's fbcode builds torch has another rule.)
    """
    environ = os.environ if environ is None else environ
    platform = sys.platform if platform is None else platform
    if "TORCHINDUCTOR_COMPILE_THREADS" in environ:
        return int(environ["TORCHINDUCTOR_COMPILE_THREADS"]), "TORCHINDUCTOR_COMPILE_THREADS"
    if platform == "win32":
        return 1, "Windows"
    if usable_cpus is None:
        usable_cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return min(32, usable_cpus), f"min(32, {usable_cpus} usable CPUs)"


def compile_pools_started() -> dict[str, bool]:
    """Which compile pools Inductor started in this process: 'threads' (C++ builds) and 'subprocesses' (Triton's)."""
    from torch._inductor.async_compile import AsyncCompile

    return {"threads": AsyncCompile.pool.cache_info().currsize > 0,
            "subprocesses": AsyncCompile.process_pool.cache_info().currsize > 0}


# ---------------------------------------------------------------------------------- compile vs eager
@dataclass(frozen=True)
class CompileReport:
    """One model's compile cost and pay-off: first compiled call, then medians of eager and compiled calls."""

    name: str
    compile_seconds: float     # the first compiled call: tracing, code generation and the C++ build (or loading
                               # them from Inductor's cache), then one run
    eager_seconds: float       # median eager call after warm-up
    compiled_seconds: float    # median compiled call after warm-up

    @property
    def speedup(self) -> float:
        """eager / compiled time per call: above 1, compiling made each call faster."""
        return self.eager_seconds / self.compiled_seconds

    @property
    def break_even_calls(self) -> float:
        """Calls after which the compile time is paid back (inf when compiled calls are not faster)."""
        saved = self.eager_seconds - self.compiled_seconds
        return math.inf if saved <= 0 else math.ceil(self.compile_seconds / saved)


def inference_call(model: nn.Module, x: torch.Tensor) -> Callable[[], torch.Tensor]:
    """A no-argument callable: the model's forward on x without autograd."""
    def call() -> torch.Tensor:
        with torch.no_grad():
            return model(x)
    return call


def training_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, lr: float = 0.01) -> Callable[[], float]:
    """A no-argument callable: one SGD step of cross-entropy on (x, y); returns the loss."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)

    def step() -> float:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        return loss.item()
    return step


def measure_compile(name: str, eager: Callable[[], object], compiled: Callable[[], object], *,
                    repeats: int = 7, warmup: int = 2) -> CompileReport:
    """Time the first compiled call, then eager against compiled side by side (interleaved)."""
    if not (callable(eager) and callable(compiled)):
        raise TypeError("measure_compile needs two callables: the eager call and the compiled one")
    with quiet_compile_logs():
        start = time.perf_counter()
        compiled()
        first = time.perf_counter() - start
        comparison = compare(eager, compiled, warmup=warmup, repeats=repeats, names=("eager", "compiled"))
    return CompileReport(name, first, comparison.a.median, comparison.b.median)


def format_compile_table(reports: Iterable[CompileReport]) -> str:
    """A left-aligned table: compile time, eager and compiled per call, speed-up, break-even calls.

    A break-even of ≈inf means the compiled calls were not faster in this run: the compile never pays back.
    """
    head = f"{'model':<22}{'compile':<12}{'eager/call':<12}{'compiled/call':<15}{'speed-up':<10}break-even calls"
    lines = [head]
    for r in reports:
        lines.append(f"{r.name:<22}{measured_seconds(r.compile_seconds):<12}{measured_seconds(r.eager_seconds):<12}"
                     f"{measured_seconds(r.compiled_seconds):<15}{measured(r.speedup, 3):<10}"
                     f"{measured(float(r.break_even_calls), 3)}")
    return "\n".join(lines)


@dataclass(frozen=True)
class TrainingDrift:
    """How far a compiled copy of a model drifted from the eager one over the same SGD steps."""

    max_abs_diff: float                  # largest |compiled weight - eager weight| over every parameter
    max_abs_weight: float                # largest |eager weight|: the scale of the weights
    max_abs_update: float                # largest |eager weight after - before|: how far training moved them
    eager_losses: tuple[float, ...]
    compiled_losses: tuple[float, ...]

    @property
    def relative_diff(self) -> float:
        """max_abs_diff / max_abs_weight."""
        return self.max_abs_diff / self.max_abs_weight


def compiled_training_drift(model: nn.Module, batches: Iterable[tuple[torch.Tensor, torch.Tensor]], *,
                            lr: float = 0.01, seed: int = 0, **compile_kwargs: object) -> TrainingDrift:
    """Train two copies of model with SGD and cross-entropy on the same batches, one eager, one torch.compile'd.

    Both start from model's weights (model itself is left as it is) and from the same random state (`seed`, the
    caller's state restored after). Random ops such as Dropout still differ: Inductor draws its own random numbers
    unless torch._inductor.config.fallback_random is True. compile_kwargs go to torch.compile.
    """
    batches = list(batches)
    if not batches:
        raise ValueError("compiled_training_drift needs at least one (x, y) batch")
    eager, compiled = copy.deepcopy(model), copy.deepcopy(model)
    losses = []
    with quiet_compile_logs():
        for copy_, call in ((eager, eager), (compiled, torch.compile(compiled, **compile_kwargs))):
            optimizer = torch.optim.SGD(copy_.parameters(), lr=lr)
            losses.append([])
            with torch.random.fork_rng():
                torch.manual_seed(seed)                   # both copies start from the same random state
                for x, y in batches:
                    optimizer.zero_grad()
                    loss = F.cross_entropy(call(x), y)
                    loss.backward()
                    optimizer.step()
                    losses[-1].append(loss.item())
    return TrainingDrift(_largest_diff(eager, compiled), max(w.abs().max().item() for w in eager.parameters()),
                         _largest_diff(eager, model), tuple(losses[0]), tuple(losses[1]))


def _largest_diff(a: nn.Module, b: nn.Module) -> float:
    with torch.no_grad():
        return max((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters()))


# ------------------------------------------------------------------------------------- graph breaks
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


# ----------------------------------------------------------------------------------------- recompiles
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


@dataclass(frozen=True)
class CompileCount:
    """Graphs Dynamo compiled over a sequence of calls, how many were recompiles, and what Dynamo warned."""

    graphs: int            # every graph compiled: a graph break splits a function into two
    seconds: float         # wall time of all the calls: tracing and running, with the counting backend (no Inductor)
    recompiles: int = 0    # graphs compiled again for code compiled before: its guards failed on a new input
    graph_runs: int = 0    # times a compiled graph ran; a call that Dynamo left to eager mode runs none
    warnings: tuple[str, ...] = ()   # first line of each warning Dynamo logged (e.g. the recompile limit), in order
    outputs: tuple = ()    # what each call returned, in order (to compare with eager)


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.first_lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        first = record.getMessage().strip().splitlines()[0] if record.getMessage().strip() else ""
        if first and first not in self.first_lines:
            self.first_lines.append(first)


@contextlib.contextmanager
def _dynamo_warnings_collected():
    """Inside the block, torch._dynamo's warnings go to a list instead of stderr; the other loggers stay quiet."""
    collect = _Collect()
    with quiet_compile_logs(), _routed([logging.getLogger("torch._dynamo")], collect, logging.WARNING):
        yield collect.first_lines


@contextlib.contextmanager
def _routed(loggers: list[logging.Logger], handler: logging.Handler, level: int):
    """Inside the block, the loggers send records from `level` up to `handler` alone; afterwards all is as it was."""
    saved = [(lg.level, lg.handlers[:], lg.propagate) for lg in loggers]
    for lg in loggers:
        lg.setLevel(level)
        lg.handlers[:] = [handler]
        lg.propagate = False
    try:
        yield
    finally:
        for lg, (old_level, handlers, propagate) in zip(loggers, saved):
            lg.setLevel(old_level)
            lg.handlers[:] = handlers
            lg.propagate = propagate


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


# ------------------------------------------------------------------------------- TORCH_LOGS in-process
_LOGGED = ("graph_breaks", "recompiles")


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


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[tuple[str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append((record.name.rpartition(".__")[2], record.getMessage()))


@contextlib.contextmanager
def _artifacts_logged():
    """Inside the block, Dynamo's graph_breaks and recompiles logs go to a list; afterwards all is as it was."""
    import torch._dynamo  # noqa: F401  (its modules create the artifact loggers)
    from torch._logging import _internal

    loggers = [logging.getLogger(q) for q in _internal.log_registry.get_artifact_log_qnames()]
    loggers = [lg for lg in loggers if getattr(lg, "artifact_name", None) in _LOGGED]
    handler = _Records()
    added = set(_LOGGED) - _internal.log_state.artifact_names      # left enabled afterwards if TORCH_LOGS set them
    _internal.log_state.artifact_names.update(added)
    try:
        with _routed(loggers, handler, logging.DEBUG):
            yield handler.records
    finally:
        _internal.log_state.artifact_names.difference_update(added)


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
