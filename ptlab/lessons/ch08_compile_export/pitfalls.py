"""Chapter 8 pitfalls: torch.compile, torch.export, ONNX and legacy TorchScript."""
from __future__ import annotations

import tempfile
import warnings
from pathlib import Path

import torch
from torch import nn

from ptlab.claims import Check, measured_seconds
from ptlab.compiling import count_compiles, explain_breaks, fullgraph_error
from ptlab.course.pitfall_record import Outcome, pitfall
from ptlab.exporting import export_onnx, onnx_input_shapes, onnx_session, run_onnx
from ptlab.lessons.ch08_compile_export.models import DoubleLargeBatches, SoftmaxOverSequence


class Excerpt(str):
    """A short excerpt of a long message, for a table cell; the whole message is its `.full` attribute."""

    full: str

    def __new__(cls, full: str, start: str, end: str = "") -> "Excerpt":
        """The part of `full` from `start` up to `end` (excluded), or `full` itself when `start` is not in it."""
        text = " ".join(str(full).split())
        head = text.find(start)
        if head < 0:
            excerpt = text
        else:
            tail = text.find(end, head) if end else -1
            excerpt = text[head:tail if tail > 0 else len(text)].strip()
        made = super().__new__(cls, excerpt)
        made.full = text
        return made


@pitfall(
    id="jit-trace-shape-branch", chapter=8,
    title="torch.jit.trace freezes a branch on the batch size: silently wrong for other sizes",
    symptom="traced at batch 8, the model's output at batch 32 differs from eager by more than 0.5 (it returns "
            "x, not 2x)",
    why="""`trace` runs the model on the example and records the tensor ops that ran. `x.shape[0] > 16` was
    False for the example batch, so only that branch is in the trace; at batch 32 it still runs it. The
    only sign comes at trace time: a TracerWarning for each run of the model that trace makes (the trace
    itself and its check run, so 2 here); nothing is raised or warned when the traced model runs \
(the table counts both). TorchScript itself
    is deprecated in this torch version.""",
    catch="""Use torch.compile (it guards on the shape and re-traces when the branch flips) or torch.export
    (it refuses or asks for a constraint). Compare outputs with eager at several batch sizes, and turn
    TracerWarning into an error in tests.""",
)
def jit_trace_shape_branch(buggy: bool) -> Outcome:
    model = DoubleLargeBatches()
    with warnings.catch_warnings(record=True) as at_conversion:
        warnings.simplefilter("always")
        if buggy:
            converted = torch.jit.trace(model, torch.ones(8, 2))     # BUG: the trace keeps the batch-8 branch
        else:
            converted = torch.compile(model, backend="eager")        # FIX: guards on x.shape[0], re-traces at 32
    with warnings.catch_warnings(record=True) as at_call:
        warnings.simplefilter("always")
        out = converted(torch.ones(32, 2))                           # (32, 2)
    tracer_warnings = sum(w.category.__name__ == "TracerWarning" for w in at_conversion)
    diff = (out - model(torch.ones(32, 2))).abs().max().item()
    return Outcome(
        figures={"output at batch 32": f"{out[0, 0].item():g}", "eager output": "2",
                 "max abs diff from eager": diff, "TracerWarnings at conversion": tracer_warnings,
                 "warnings at batch 32": len(at_call)},
        checks=[Check("max abs diff from eager at batch 32", diff, "> 0.5")],
    )


@pitfall(
    id="onnx-only-batch-dynamic", chapter=8,
    title="ONNX export with only the batch dim dynamic: another sequence length is rejected",
    symptom="exported with seq 10 and only the batch dim dynamic, onnxruntime refuses an input of seq 20 with "
            "an error that says 'index: 1 Got: 20 Expected: 10'",
    why="""Every dim not named in `dynamic_shapes` is fixed to the example's size in the ONNX graph: the
    input is stored as ['batch', 10, 8]. onnxruntime checks the input against that and refuses. (The table
    shows an excerpt of onnxruntime's message; its `.full` attribute holds the whole text.)""",
    catch="""Name every dim that varies in `dynamic_shapes` (batch and sequence here), read the stored input
    shape back from the session (`session.get_inputs()[0].shape`), and verify on several shapes.""",
)
def onnx_only_batch_dynamic(buggy: bool) -> Outcome:
    torch.manual_seed(0)
    model = SoftmaxOverSequence().eval()
    if buggy:
        dims = {0: "batch"}                                   # BUG: the sequence dim is fixed at 10
    else:
        dims = {0: "batch", 1: "seq"}                         # FIX: every dim that varies is dynamic
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "softmax.onnx"
        export_onnx(model, torch.randn(2, 10, 8), path, dims)
        session = onnx_session(path)
        stored = onnx_input_shapes(session)["x"]
        try:
            run_onnx(session, torch.randn(3, 20, 8))              # (3, 20, 8): another sequence length
            error = "none"
        except Exception as err:  # onnxruntime's InvalidArgument: keep the part that names the dim
            error = Excerpt(str(err), start="index:", end=" Please")
    return Outcome(
        figures={"stored input shape": str(stored), "error at (3, 20, 8)": error},
        checks=[Check("onnxruntime error at seq 20", error, "contains 'index: 1 Got: 20 Expected: 10'"),
                Check("stored input shape", str(stored), "== \"['batch', 10, 8]\"")],
    )


@pitfall(
    id="export-in-train-mode", chapter=8,
    title="Exporting a model left in train mode: BatchNorm uses the batch's statistics in the exported graph",
    symptom="the exported program differs from the eval-mode model by more than 0.1, and one sample's "
            "output changes when the other samples in its batch change",
    why="""`torch.export` records the model as it is: in train mode BatchNorm normalises with the current
    batch's mean and variance (and updates its running statistics), so each output depends on the rest of
    the batch. The program cannot be switched afterwards (`ep.module().eval()` raises NotImplementedError):
    export again. The ONNX exporter differs: it warns about train mode and writes BatchNorm with its
    running statistics.""",
    catch="""Call `model.eval()` before exporting, and compare the exported program with the eval-mode model
    on a few inputs; a sample whose output depends on its batch-mates is the telltale.""",
)
def export_in_train_mode(buggy: bool) -> Outcome:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 2))
    for _ in range(20):                                      # "training": running stats of shifted data
        model(2 * torch.randn(64, 8) + 3)
    if not buggy:
        model.eval()                                         # FIX: inference behaviour before export
    # BUG: without model.eval() the graph keeps BatchNorm's train-mode behaviour
    exported = torch.export.export(model, (torch.randn(16, 8),)).module()
    model.eval()
    x, other = torch.randn(16, 8), 2 * torch.randn(16, 8) + 3   # (16, 8) each: new data, and other batch-mates
    with torch.no_grad():
        diff = (exported(x) - model(x)).abs().max().item()
        mixed = torch.cat([x[:1], other[1:]])                # same sample 0, different batch-mates
        drift = (exported(x)[0] - exported(mixed)[0]).abs().max().item()
    return Outcome(
        figures={"max abs diff from eval model": diff, "sample 0 change with other batch-mates": drift},
        checks=[Check("max abs diff from the eval-mode model", diff, "> 0.1"),
                Check("sample 0's output change when its batch-mates change", drift, "> 0.01")],
    )


@pitfall(
    id="graph-break-item", chapter=8,
    title=".item() in forward breaks the compiled graph in two (by default, without fullgraph=True)",
    symptom="torch._dynamo.explain finds 2 graphs and 1 break, whose reason names Tensor.item()",
    why="""`.item()` turns a tensor into a Python number, which Dynamo cannot keep in the graph (by default):
    it compiles the part before, runs the call in Python, and compiles the rest as a second graph. Each
    break costs a return to Python and stops fusion across it; a break inside a loop multiplies that.""",
    catch="""Run `torch._dynamo.explain(fn)(x)` (or `ptlab.compiling.explain_breaks`, which also shows each
    break's line) and read `break_reasons`. `fullgraph=True` does not catch this one in this torch version:
    it captures `.item()` into the graph instead of raising (the table shows it). Keep values as 0-dim
    tensors.""",
)
def graph_break_item(buggy: bool) -> Outcome:
    x = torch.randn(64, 32, generator=torch.Generator().manual_seed(0))

    def forward(x: torch.Tensor) -> torch.Tensor:
        if buggy:
            scale = x.abs().max().item()                     # BUG: a Python float leaves the graph
        else:
            scale = x.abs().max()                            # FIX: a 0-dim tensor stays in the graph
        return torch.tanh(x / scale) * scale

    breaks = explain_breaks(forward, x)
    return Outcome(
        figures={"graphs": breaks.graph_count, "breaks": breaks.break_count,
                 "first reason": breaks.reasons[0] if breaks.reasons else "none",
                 "fullgraph=True raises": fullgraph_error(forward, x) or "nothing"},
        checks=[Check("graph breaks", breaks.break_count, "== 1"),
                Check("graphs compiled", breaks.graph_count, "== 2"),
                Check("first break reason", breaks.reasons[0] if breaks.reasons else "none",
                      "contains 'Tensor.item()'")],
    )


def relu_projection(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return torch.relu(x @ weight).sum(dim=1)                 # (B, F) @ (F, H) -> (B,)


@pitfall(
    id="recompile-every-batch-size", chapter=8,
    title="A static-shape compile recompiles for every new batch size",
    symptom="with dynamic=False, 6 batch sizes give 6 compiled graphs (5 recompiles)",
    why="""Dynamo specialises a graph to the input shapes it saw and guards on them; a new batch size fails the
    guard and compiles again. It keeps at most `recompile_limit` (8) graphs per function; past that it logs
    a warning ('torch._dynamo hit config.recompile_limit (8)') and runs inputs that no kept graph accepts
    in eager mode. `dynamic=False` makes no dim symbolic on its own (a dim marked with
    `torch._dynamo.mark_dynamic` still becomes one). By default (`dynamic=None`) Dynamo makes
    a dim symbolic after it changes once, so it costs 2 compiles, not 1. The time in the table is tracing
    with a counting backend (no Inductor): with Inductor every graph also costs a C++ build.""",
    catch="""Mark the varying dims dynamic (`dynamic=True`, or `torch._dynamo.mark_dynamic(x, 0)`), though a batch
    of 1 still gets a graph of its own, since Dynamo specialises dims of size 0 and 1; or keep batch sizes
    fixed (`drop_last=True`, padding). `TORCH_LOGS="recompiles"` prints each recompile's reason.""",
)
def recompile_every_batch_size(buggy: bool) -> Outcome:
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(16, 8, generator=generator)                                     # (F, H)
    calls = [(torch.randn(batch, 16, generator=generator), weight) for batch in range(2, 8)]  # 6 sizes
    if buggy:
        counted = count_compiles(relu_projection, calls, dynamic=False)   # BUG: one graph per batch size
    else:
        counted = count_compiles(relu_projection, calls, dynamic=True)    # FIX: a symbolic batch size
    return Outcome(
        figures={"batch sizes": len(calls), "graphs compiled": counted.graphs, "recompiles": counted.recompiles,
                 "6 calls, tracing included": measured_seconds(counted.seconds)},
        checks=[Check("graphs compiled for 6 batch sizes", counted.graphs, "== 6"),
                Check("recompiles", counted.recompiles, "== 5")],
    )


def _plain_classifier() -> nn.Sequential:
    """(B, 8) -> (B, 2): the model as an evaluation script builds it."""
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))


@pitfall(
    id="compiled-state-dict-prefix", chapter=8,
    title="A compiled model's state_dict() prefixes every key with '_orig_mod.': the plain model refuses it",
    symptom="all 4 keys saved from torch.compile(model) start with '_orig_mod.', and a strict load into the plain "
            "model raises RuntimeError whose message names '_orig_mod.0.weight' as unexpected and '0.weight' as "
            "missing",
    why="""`torch.compile(model)` returns an `OptimizedModule`, a module that holds yours as its submodule
    `_orig_mod`. Like any parent module, its state_dict() names each entry by the path to it, so `0.weight`
    becomes `_orig_mod.0.weight`. That happens at wrapping: the model here is never called, so nothing is
    compiled, and the keys are prefixed all the same. The tensors are your model's own; only the names
    differ, which is enough for a strict `load_state_dict` on a plain model to refuse the file, and for
    `strict=False` to load none of it.""",
    catch="""Save the model you compiled, not the wrapper: `model.state_dict()` (keep a reference to it) or
    `compiled._orig_mod.state_dict()`; or compile in place with `model.compile()`, which adds no wrapper and no
    prefix. For files already saved,
    `torch.nn.modules.utils.consume_prefix_in_state_dict_if_present(state, "_orig_mod.")` strips the prefix.
    Keep `strict=True`, so a mismatch raises instead of loading nothing.""",
)
def compiled_state_dict_prefix(buggy: bool) -> Outcome:
    torch.manual_seed(0)
    model = _plain_classifier()
    compiled = torch.compile(model)                       # a wrapper; nothing compiles until it is called
    if buggy:
        state = compiled.state_dict()                     # BUG: the wrapper's keys: '_orig_mod.0.weight', ...
    else:
        state = compiled._orig_mod.state_dict()           # FIX: the model's own keys (model.state_dict() too)
    with tempfile.TemporaryDirectory() as folder:
        torch.save(state, Path(folder, "model.pt"))
        saved = torch.load(Path(folder, "model.pt"), weights_only=True)
    try:
        _plain_classifier().load_state_dict(saved)        # strict=True, the default
        error = "none"
    except RuntimeError as err:
        lines = [line.strip() for line in str(err).splitlines()]
        error = " ".join(line.split(",")[0] + ", ..." for line in lines if line.startswith(("Missing", "Unexpected")))
    prefixed = sum(key.startswith("_orig_mod.") for key in saved)
    return Outcome(
        figures={"first saved key": next(iter(saved)), "the wrapper's type": type(compiled).__name__,
                 "compiled._orig_mod is model": compiled._orig_mod is model, "strict load into the plain model": error},
        checks=[Check("saved keys starting with '_orig_mod.' (of 4)", prefixed, "== 4"),
                Check("strict load into the plain model: the error lists unexpected keys", error,
                      "contains 'Unexpected key(s) in state_dict: \"_orig_mod.0.weight\"'"),
                Check("strict load into the plain model: the error lists missing keys", error,
                      "contains 'Missing key(s) in state_dict: \"0.weight\"'")])
