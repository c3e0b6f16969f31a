"""Chapter 8 exercises: a forward without graph breaks, and an export that accepts batches of 1 to 1,024 and
sequences of 2 to 512."""
from __future__ import annotations

import torch

from ptlab.compiling import explain_breaks, fullgraph_error
from ptlab.course.exercises import Wrong, calls_stub, exercise
from ptlab.lessons.ch08_compile_export.models import SoftmaxOverSequence


def _reference_normalise(x: torch.Tensor) -> torch.Tensor:
    peak = x.abs().max()
    if peak.item() > 1:          # the data-dependent branch the learner removes
        return x / peak
    return x


@exercise(
    id="ch8-no-graph-break", chapter=8,
    task="write normalise(x): divide x by its largest absolute value when that value exceeds 1, else return x "
         "unchanged; it must compile as ONE graph with no break: explain_breaks(normalise, x) finds 1 graph and "
         "0 breaks (and torch.compile(normalise, fullgraph=True) does not raise)",
    hint="a Python `if` on a tensor's value (or .item()) needs the value in Python, which breaks the graph. "
         "Can you compute both outcomes with tensor ops, so that no Python decision is left?",
)
def check_no_graph_break(normalise) -> None:
    generator = torch.Generator().manual_seed(0)
    large, small = 5 * torch.randn(8, 4, generator=generator), 0.1 * torch.randn(8, 4, generator=generator)
    for name, x in (("an input with values above 1", large), ("an input within [-1, 1]", small)):
        out = calls_stub(normalise, x.clone())
        if not isinstance(out, torch.Tensor) or out.shape != x.shape:
            raise Wrong(f"for {name}, return a tensor of the input's shape {tuple(x.shape)}.")
        if not torch.allclose(out, _reference_normalise(x), atol=1e-6):
            raise Wrong(f"for {name} the values differ from the task's: inputs within [-1, 1] stay as they are, "
                        "larger ones are divided by their largest absolute value.")
    breaks = explain_breaks(normalise, large)
    if breaks.break_count:
        where = f" at `{breaks.lines[0]}`" if breaks.lines and breaks.lines[0] else ""
        reason = breaks.reasons[0]
        if reason.startswith("generic_jump"):
            reason += " (Dynamo's words for a Python `if` on a tensor's value)"
        raise Wrong(f"the graph still breaks {breaks.break_count} time(s); the first break is{where}: {reason}")
    error = fullgraph_error(normalise, small)
    if error:
        raise Wrong(f"fullgraph=True raises {error}")


@exercise(
    id="ch8-dynamic-export", chapter=8,
    task="write export_any_length(model, example): torch.export.export a model that takes x of shape (B, T, 8) so "
         "that the ExportedProgram runs at any batch size B from 1 to 1,024 and any sequence length T from 2 to 512; "
         "return the program",
    hint="torch.export fixes every dim of the example input unless dynamic_shapes declares it. Which dims of x "
         "change between calls, and does each of them get its own Dim whose range covers the sizes the task names?",
)
def check_dynamic_export(export_any_length) -> None:
    torch.manual_seed(0)
    model = SoftmaxOverSequence().eval()
    program = calls_stub(export_any_length, model, torch.randn(2, 10, 8))
    if not isinstance(program, torch.export.ExportedProgram):
        raise Wrong(f"return what torch.export.export returns (an ExportedProgram), not {type(program).__name__}.")
    module = program.module()
    generator = torch.Generator().manual_seed(1)
    for shape in ((1, 10, 8), (1024, 10, 8), (3, 37, 8), (7, 512, 8), (4, 2, 8)):   # both ends of both ranges
        x = torch.randn(*shape, generator=generator)
        try:
            out = module(x)
        except Exception as err:  # a guard on a fixed dim fails with AssertionError or RuntimeError
            first = str(err).strip().splitlines()[0][:120]
            raise Wrong(f"the program refuses input {shape}: {first}. Which dims did the export fix?") from None
        if (out - model(x)).abs().max().item() > 1e-5:
            raise Wrong(f"at input {shape} the program's output differs from the model's.")
