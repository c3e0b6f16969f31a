"""Chapter 8 exercises: right answers accepted, typical wrong ones rejected with the hint that names the fault."""
import torch

from ptlab import check


def test_no_graph_break_exercise_accepts_branchless_and_rejects_python_if():
    assert check("ch8-no-graph-break", lambda x: x / x.abs().max().clamp(min=1.0)) == "correct"
    assert check("ch8-no-graph-break", lambda x: torch.where(x.abs().max() > 1, x / x.abs().max(), x)) == "correct"

    def with_if(x):
        peak = x.abs().max()
        return x / peak if peak > 1 else x

    assert check("ch8-no-graph-break", with_if) == "wrong"

    def with_item(x):                                  # fullgraph=True accepts it; explain still finds the break
        return x / x.abs().max().clamp(min=1.0).item()

    assert check("ch8-no-graph-break", with_item) == "wrong"
    assert check("ch8-no-graph-break", lambda x: x / x.abs().max()) == "wrong"   # divides small inputs too

    def stub(x):
        return ...

    assert check("ch8-no-graph-break", stub) == "not attempted"


def test_dynamic_export_exercise_needs_both_dims():
    def both(model, example):
        dims = {0: torch.export.Dim("batch", max=1024), 1: torch.export.Dim("seq", max=1024)}
        return torch.export.export(model, (example,), dynamic_shapes={"x": dims})

    def batch_only(model, example):
        return torch.export.export(model, (example,), dynamic_shapes={"x": {0: torch.export.Dim("batch")}})

    assert check("ch8-dynamic-export", both) == "correct"
    assert check("ch8-dynamic-export", batch_only) == "wrong"
    assert check("ch8-dynamic-export", lambda m, x: m) == "wrong"          # not an ExportedProgram

    def batch_up_to_8(model, example):
        dims = {0: torch.export.Dim("batch", max=8), 1: torch.export.Dim("seq", min=2, max=512)}
        return torch.export.export(model, (example,), dynamic_shapes={"x": dims})

    assert check("ch8-dynamic-export", batch_up_to_8) == "wrong"           # the task says batches up to 1,024


def test_no_graph_break_feedback_names_the_line_and_explains_dynamos_words(capsys):
    def with_if(x):
        peak = x.abs().max()
        return x / peak if peak > 1 else x

    check("ch8-no-graph-break", with_if)
    out = capsys.readouterr().out
    assert "the first break is at `return x / peak if peak > 1 else x`" in out
    assert "generic_jump TensorVariable() (Dynamo's words for a Python `if` on a tensor's value)" in out
