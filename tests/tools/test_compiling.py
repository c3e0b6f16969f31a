"""Chapter 8: torch.compile measurement helpers, graph breaks, recompile counts, pitfalls and exercises."""
import logging
import math

import pytest
import torch
from torch import nn

from ptlab.compiling import (
    CompileReport,
    TinyTransformerBlock,
    count_compiles,
    explain_breaks,
    format_compile_table,
    fullgraph_error,
    inference_call,
    make_mlp,
    measure_compile,
    quiet_compile_logs,
    training_step,
)
from ptlab.course.pitfalls import all_pitfalls

CH8_IDS = {"jit-trace-shape-branch", "onnx-only-batch-dynamic", "export-in-train-mode", "graph-break-item",
           "recompile-every-batch-size"}


def test_chapter_8_registers_its_pitfalls():
    assert CH8_IDS <= {p.id for p in all_pitfalls(chapter=8)}


def test_break_even_and_speedup_arithmetic():
    paying = CompileReport("m", compile_seconds=2.0, eager_seconds=0.010, compiled_seconds=0.006)
    assert paying.speedup == pytest.approx(10 / 6)
    assert paying.break_even_calls == 500                     # 2 s / 4 ms saved per call
    slower = CompileReport("m", compile_seconds=2.0, eager_seconds=0.005, compiled_seconds=0.006)
    assert math.isinf(slower.break_even_calls)
    table = format_compile_table([paying, slower])
    assert table.splitlines()[2].endswith("≈inf") and table.splitlines()[1].endswith("≈500")


def test_measure_compile_times_both_callables_and_rejects_non_callables():
    calls = {"eager": 0, "compiled": 0}

    def eager():
        calls["eager"] += 1

    def compiled():
        calls["compiled"] += 1

    report = measure_compile("counting", eager, compiled, repeats=3, warmup=1)
    assert calls == {"eager": 4, "compiled": 5}               # first call + warm-up + repeats
    assert report.compile_seconds >= 0 and report.eager_seconds > 0
    with pytest.raises(TypeError, match="two callables"):
        measure_compile("x", eager, 3)


def test_training_step_lowers_the_loss_and_inference_call_needs_no_grad():
    torch.manual_seed(0)
    model = make_mlp(in_features=8, hidden=16, num_classes=3)
    x, y = torch.randn(32, 8), torch.randint(0, 3, (32,))
    step = training_step(model, x, y, lr=0.1)
    losses = [step() for _ in range(20)]
    assert losses[-1] < losses[0]
    assert not inference_call(model, x)().requires_grad


def test_tiny_transformer_block_keeps_the_shape_and_is_causal():
    torch.manual_seed(0)
    block = TinyTransformerBlock(d_model=16, heads=2).eval()
    x = torch.randn(2, 5, 16)
    out = block(x)
    assert out.shape == (2, 5, 16)
    changed = x.clone()
    changed[:, -1] += 1.0                                       # the last token cannot affect earlier ones
    assert torch.allclose(block(changed)[:, :-1], out[:, :-1], atol=1e-6)
    with pytest.raises(ValueError, match="multiple of heads"):
        TinyTransformerBlock(d_model=10, heads=4)


def test_explain_breaks_counts_each_kind_of_break():
    def clean(x):
        return torch.sin(x) * 2

    def with_item(x):
        return x * x.sum().item()

    def with_print(x):
        y = x + 1
        print("hi")
        return y * 2

    x = torch.randn(4, 4)
    assert (explain_breaks(clean, x).graph_count, explain_breaks(clean, x).break_count) == (1, 0)
    item = explain_breaks(with_item, x)
    assert item.break_count == 1 and item.reasons[0].startswith("Unsupported Tensor.item() call")
    assert explain_breaks(with_print, x).reasons == ["Failed to trace builtin operator"]
    assert "1 break(s)" in str(item)


def test_fullgraph_error_names_data_dependent_branching_and_is_empty_when_clean():
    def branch(x):
        if x.sum() > 0:
            return x * 2
        return x

    assert fullgraph_error(branch, torch.ones(3)) == "Unsupported: Data-dependent branching"
    assert fullgraph_error(lambda x: x * 2, torch.ones(3)) == ""


def test_count_compiles_by_dynamic_setting_and_repeatable():
    def f(x):
        return torch.relu(x).sum(1)

    calls = [(torch.randn(b, 4),) for b in range(2, 7)]       # 5 batch sizes
    assert count_compiles(f, calls, dynamic=False).graphs == 5
    assert count_compiles(f, calls).graphs == 2                # automatic dynamic after one change
    assert count_compiles(f, calls, dynamic=True).graphs == 1
    # Counting again starts from zero: no compiled graph or remembered dynamism leaks between counts.
    assert count_compiles(f, calls, dynamic=False).graphs == 5
    assert count_compiles(f, calls).graphs == 2
    assert count_compiles(f, [(c[0].clone(),) for c in calls], mark_dynamic_dims={0: 0}).graphs == 1
    assert count_compiles(f, calls, dynamic=False).recompiles == 4


def test_count_compiles_tells_a_graph_break_from_a_recompile():
    def with_break(x):
        y = torch.relu(x)
        print("a graph break")
        return y.sum(1)

    one_shape = count_compiles(with_break, [(torch.randn(3, 4),), (torch.randn(3, 4),)], dynamic=False)
    assert (one_shape.graphs, one_shape.recompiles) == (2, 0)          # two graphs around the break, compiled once
    two_shapes = count_compiles(with_break, [(torch.randn(3, 4),), (torch.randn(5, 4),)], dynamic=False)
    assert (two_shapes.graphs, two_shapes.recompiles) == (4, 2)        # the new shape fails both graphs' guards

def test_count_compiles_rejects_bad_input():
    with pytest.raises(TypeError, match="plain Python function"):
        count_compiles(nn.Linear(2, 2), [(torch.randn(1, 2),)])
    with pytest.raises(ValueError, match="at least one call"):
        count_compiles(lambda x: x, [])


def test_quiet_compile_logs_restores_levels():
    logger = logging.getLogger("torch._dynamo")
    before = logger.level
    with quiet_compile_logs():
        assert logger.level == logging.ERROR
    assert logger.level == before


@pytest.mark.slow
def test_inductor_compiles_and_matches_eager():
    """One real Inductor compile (needs a C++ compiler): same values as eager."""
    def f(x):
        return torch.tanh(x) * 2 + 1

    x = torch.randn(16)
    with quiet_compile_logs():
        assert torch.allclose(torch.compile(f)(x), f(x), atol=1e-6)


def test_inductor_cache_dir_is_per_capability_outside_the_repo_and_respects_a_choice(monkeypatch, tmp_path):
    import os
    import tempfile

    from ptlab.compiling import use_inductor_cache_per_cpu_capability

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    name = use_inductor_cache_per_cpu_capability()
    chosen = os.environ["TORCHINDUCTOR_CACHE_DIR"]
    assert chosen.startswith(tempfile.gettempdir()) and os.path.basename(chosen) == name
    assert name.endswith("_" + torch.backends.cpu.get_cpu_capability().lower())
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    assert use_inductor_cache_per_cpu_capability() == "mine"


def test_inductor_vectorizes_follows_the_aten_capability():
    from ptlab.compiling import inductor_vectorizes

    vectorizes = inductor_vectorizes()
    assert isinstance(vectorizes, bool)
    capability = torch.backends.cpu.get_cpu_capability()
    if capability == "DEFAULT":                                 # ATEN_CPU_CAPABILITY=default: scalar C++
        assert vectorizes is False
    elif capability in ("AVX2", "AVX512"):                      # both have Inductor vector ISAs
        assert vectorizes is True
