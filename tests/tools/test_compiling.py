"""Chapter 8: torch.compile measurement helpers, graph breaks, recompile counts, pitfalls and exercises."""
import logging
import math

import pytest
import torch
from torch import nn

from ptlab.compiling import (
    CompileReport,
    count_compiles,
    explain_breaks,
    format_compile_table,
    fullgraph_error,
    inference_call,
    measure_compile,
    quiet_compile_logs,
    training_step,
)
from ptlab.course.pitfalls import all_pitfalls
from ptlab.lessons.ch08_compile_export.models import TinyTransformerBlock, make_mlp

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


def test_explain_breaks_names_the_line_of_each_break():
    def with_branch(x):
        y = torch.sin(x)
        if y.sum() > 0:
            return y * 2
        return y

    found = explain_breaks(with_branch, torch.ones(3))
    assert found.reasons == ["generic_jump TensorVariable()"] and found.lines == ["if y.sum() > 0:"]
    assert str(found).splitlines()[-1] == "    at: if y.sum() > 0:"


def test_fullgraph_error_names_data_dependent_branching_and_is_empty_when_clean():
    def branch(x):
        if x.sum() > 0:
            return x * 2
        return x

    assert fullgraph_error(branch, torch.ones(3)) == "Unsupported: Data-dependent branching"
    assert fullgraph_error(lambda x: x * 2, torch.ones(3)) == ""


def test_fullgraph_captures_item_while_explain_reports_it_as_a_break():
    """In this torch version fullgraph=True turns on capture_scalar_outputs: .item() raises nothing there."""
    def with_item(x):
        return x * x.sum().item()

    x = torch.ones(3)
    assert fullgraph_error(with_item, x) == ""
    assert explain_breaks(with_item, x).break_count == 1


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

def test_count_compiles_collects_the_recompile_limit_warning_and_counts_compiled_runs(capfd):
    def f(x):
        return torch.relu(x).sum(0)

    limit = torch._dynamo.config.recompile_limit
    sizes = list(range(2, limit + 6)) + [2]                # more sizes than the limit, then the first again
    counted = count_compiles(f, [(torch.randn(b, 3),) for b in sizes], dynamic=False)
    assert counted.graphs == limit and counted.recompiles == limit - 1
    assert counted.graph_runs == limit + 1                   # the sizes past the limit ran eagerly; 2 ran its graph
    assert counted.warnings == (f"torch._dynamo hit config.recompile_limit ({limit})",)
    assert "recompile_limit" not in capfd.readouterr().err, "collected, not printed"
    assert count_compiles(f, [(torch.randn(2, 3),)]).warnings == ()


def test_count_compiles_restores_the_dynamo_logger():
    logger = logging.getLogger("torch._dynamo")
    before = logger.level, list(logger.handlers), logger.propagate
    count_compiles(lambda x: x + 1, [(torch.ones(2),)])
    assert (logger.level, list(logger.handlers), logger.propagate) == before


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


def test_doctor_looks_for_the_compiler_inductor_runs(monkeypatch):
    import torch._inductor.config as inductor_config

    from ptlab.course import doctor

    assert doctor._inductor_cxx() == inductor_config.cpp.cxx[1], "the same rule as torch._inductor.config.cpp.cxx"
    monkeypatch.setenv("CXX", "no-such-compiler-here")
    check = doctor.inductor_compiler_check()
    assert not check.ok and "no-such-compiler-here" in check.finding


def test_doctor_compiles_chapter_8s_first_function_on_the_chapters_thread_count():
    import json
    from pathlib import Path

    from ptlab.course import doctor

    notebook = Path(__file__).resolve().parents[2] / "notebooks" / "08_compile_export.ipynb"
    cells = ["".join(c["source"]) for c in json.loads(notebook.read_text(encoding="utf-8"))["cells"]
             if c["cell_type"] == "code"]
    setup = next(c for c in cells if "use_inductor_cache_per_cpu_capability()" in c)
    first = next(c for c in cells if "first_compile = " in c)
    assert f"torch.set_num_threads({doctor.CHAPTER_8_THREADS})" in setup
    assert f"torch.set_num_threads({doctor.CHAPTER_8_THREADS})" in doctor._FIRST_COMPILE
    assert "torch.randn(8)" in first and "torch.randn(8)" in doctor._FIRST_COMPILE
    assert "torch.compile(lambda x: torch.sin(x) + 1)" in first
    assert "torch.compile(lambda x: torch.sin(x) + 1)" in doctor._FIRST_COMPILE


_CACHE_PROBE = """
import sys, torch
from torch._dynamo.utils import counters
from ptlab.compiling import quiet_compile_logs
torch.set_num_threads(int(sys.argv[1]))
with quiet_compile_logs():
    torch.compile(lambda x: torch.sin(x) + 1)(torch.randn(8))
print(counters["inductor"]["fxgraph_cache_hit"], counters["inductor"]["fxgraph_cache_miss"])
"""


@pytest.mark.slow
def test_the_doctors_compile_warms_the_cache_for_chapter_8_and_only_at_its_thread_count(tmp_path):
    """make doctor's one-line compile, then the chapter's: a cache hit on one thread, a miss on two."""
    import os
    import subprocess
    import sys

    from ptlab.course import doctor

    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}   # a cold graph cache
    subprocess.run([sys.executable, "-c", doctor._FIRST_COMPILE], env=env, check=True, capture_output=True,
                   timeout=600)

    def hits_and_misses(threads: int) -> list[int]:
        done = subprocess.run([sys.executable, "-c", _CACHE_PROBE, str(threads)], env=env, check=True,
                              capture_output=True, text=True, timeout=600)
        return [int(n) for n in done.stdout.split()]

    assert hits_and_misses(doctor.CHAPTER_8_THREADS) == [1, 0]
    assert hits_and_misses(2) == [0, 1], "Inductor keys a CPU graph on the thread count"


def test_excerpt_keeps_the_part_that_names_the_dim_and_the_whole_message():
    from ptlab.lessons.ch08_compile_export.pitfalls import Excerpt

    message = ("[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : Got invalid dimensions for input: x for the following "
               "indices\n index: 1 Got: 20 Expected: 10\n Please fix either the inputs/outputs or the model.")
    short = Excerpt(message, start="index:", end=" Please")
    assert short == "index: 1 Got: 20 Expected: 10" and isinstance(short, str)
    assert short.full.startswith("[ONNXRuntimeError]") and short.full.endswith("or the model.")
    assert Excerpt("no such words", start="index:") == "no such words"


def test_explain_breaks_throws_away_what_was_compiled_before():
    compiles = []

    def backend(gm, example_inputs):
        compiles.append(1)
        return gm.forward

    def double(x):
        return x * 2

    compiled = torch.compile(double, backend=backend)
    x = torch.ones(3)
    compiled(x)
    compiled(x)
    assert len(compiles) == 1                      # cached: the second call compiled nothing
    explain_breaks(lambda t: t + 1, x)
    compiled(x)
    assert len(compiles) == 2, "the docstring says explain resets Dynamo: the function must compile again"


def test_count_compiles_returns_what_each_call_returned():
    def f(x):
        return x * 2

    calls = [(torch.ones(2),), (torch.full((3,), 5.0),)]
    counted = count_compiles(f, calls)
    assert len(counted.outputs) == 2
    assert torch.equal(counted.outputs[0], torch.full((2,), 2.0))
    assert torch.equal(counted.outputs[1], torch.full((3,), 10.0))


def test_compile_threads_rule_follows_torchs_decide_compile_threads(monkeypatch):
    import os
    import sys

    import torch._inductor.config as inductor_config

    from ptlab.compiling import compile_threads_rule

    assert compile_threads_rule({"TORCHINDUCTOR_COMPILE_THREADS": "3"}, "linux", 8) == (3,
                                                                                        "TORCHINDUCTOR_COMPILE_THREADS")
    assert compile_threads_rule({}, "win32", 8) == (1, "Windows")
    assert compile_threads_rule({}, "linux", 64) == (32, "min(32, 64 usable CPUs)")
    assert compile_threads_rule({}, "darwin", 2) == (2, "min(32, 2 usable CPUs)")
    # torch's own rule, in this process and with the variable set: the same numbers
    monkeypatch.delenv("TORCHINDUCTOR_COMPILE_THREADS", raising=False)
    assert compile_threads_rule()[0] == inductor_config.decide_compile_threads()
    monkeypatch.setenv("TORCHINDUCTOR_COMPILE_THREADS", "1")
    assert compile_threads_rule() == (1, "TORCHINDUCTOR_COMPILE_THREADS")
    assert inductor_config.decide_compile_threads() == 1
    monkeypatch.delenv("TORCHINDUCTOR_COMPILE_THREADS")
    monkeypatch.setattr(sys, "platform", "win32")
    assert compile_threads_rule()[0] == inductor_config.decide_compile_threads() == 1
    monkeypatch.setattr(sys, "platform", "linux")
    if hasattr(os, "sched_getaffinity"):
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2})
        assert compile_threads_rule() == (3, "min(32, 3 usable CPUs)")
        assert inductor_config.decide_compile_threads() == 3


@pytest.mark.slow
def test_a_kernel_build_starts_the_thread_pool_exactly_when_compile_threads_is_above_one():
    """Two fresh processes, caches off: compile_threads 2 builds on a thread pool, 1 starts no pool at all."""
    import os
    import subprocess
    import sys

    probe = ("import torch, warnings\nfrom ptlab.compiling import compile_pools_started, quiet_compile_logs\n"
             "before = compile_pools_started()\nwarnings.simplefilter('ignore')\n"
             "with quiet_compile_logs(), torch.compiler.config.patch(force_disable_caches=True):\n"
             "    torch.compile(lambda x: torch.cos(x) * 3)(torch.randn(5))\nprint(before, compile_pools_started())")
    for threads, pools in (("2", {"threads": True, "subprocesses": False}),
                           ("1", {"threads": False, "subprocesses": False})):
        env = {**os.environ, "TORCHINDUCTOR_COMPILE_THREADS": threads}
        done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=600,
                              check=True)
        assert done.stdout.split("} {")[0] + "}" == str({"threads": False, "subprocesses": False})
        assert done.stdout.strip().endswith(str(pools)), done.stdout


def test_compiled_training_drift_matches_eager_and_leaves_the_model_alone():
    from ptlab.compiling import compiled_training_drift

    torch.manual_seed(0)
    model = make_mlp(in_features=8, hidden=16, num_classes=3)
    before = [p.detach().clone() for p in model.parameters()]
    batches = [(torch.randn(16, 8), torch.randint(0, 3, (16,))) for _ in range(3)]
    drift = compiled_training_drift(model, batches, lr=0.1, backend="aot_eager")
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters())), "the model itself is not trained"
    assert len(drift.eager_losses) == len(drift.compiled_losses) == 3
    assert drift.compiled_losses == pytest.approx(drift.eager_losses, abs=1e-6)
    assert drift.max_abs_diff <= 1e-6 and drift.max_abs_update > 1e-3     # trained, the same way
    assert drift.relative_diff == drift.max_abs_diff / drift.max_abs_weight
    # the eager side is plain SGD: redo its steps by hand and compare
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in batches:
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    assert drift.max_abs_update == max((a - b).abs().max().item() for a, b in zip(model.parameters(), before))
    with pytest.raises(ValueError, match="at least one"):
        compiled_training_drift(model, [])


def test_compiled_training_drift_sees_a_compiled_model_that_trains_differently():
    from ptlab.compiling import compiled_training_drift

    class DropsUnderCompile(nn.Module):                      # a different computation when traced
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(4, 2)

        def forward(self, x):
            return self.linear(x * 0.5 if torch.compiler.is_compiling() else x)

    torch.manual_seed(0)
    drift = compiled_training_drift(DropsUnderCompile(), [(torch.randn(8, 4), torch.randint(0, 2, (8,)))] * 3,
                                    lr=0.5, backend="eager")
    assert drift.max_abs_diff > 1e-3 and drift.compiled_losses[0] != drift.eager_losses[0]


def test_capture_compile_logs_names_breaks_and_one_recompile_per_new_size():
    from ptlab.compiling import capture_compile_logs

    def with_branch(x):
        y = torch.sin(x)
        if y.sum() > 0:
            return torch.cos(y)
        return torch.exp(y)

    def double(x):
        return x * 2

    logs = capture_compile_logs(with_branch, [(torch.ones(3),)])
    assert logs.break_reasons == ["Data-dependent branching"] and logs.recompiles == ()
    assert logs.graph_breaks[0].startswith("Graph break in user code at ")
    again = capture_compile_logs(with_branch, [(torch.ones(3),)])            # Dynamo shortens a repeated break
    assert again.break_reasons == ["Data-dependent branching"]
    static = capture_compile_logs(double, [(torch.ones(b),) for b in (2, 3, 4)], dynamic=False)
    assert static.graph_breaks == () and len(static.recompiles) == 2           # one per new size
    assert static.recompile_reasons[0] == ["tensor 'x' size mismatch at index 0. expected 2, actual 3"]
    assert len(static.recompile_reasons[1]) == 2                              # batch 4 failed both graphs' guards
    assert str(static).splitlines()[0] == "recompile:   tensor 'x' size mismatch at index 0. expected 2, actual 3"
    assert len(capture_compile_logs(double, [(torch.ones(b),) for b in (2, 3, 4)]).recompiles) == 1   # then dynamic
    assert str(capture_compile_logs(double, [(torch.ones(2),)])) == "nothing logged"
    with pytest.raises(ValueError, match="at least one call"):
        capture_compile_logs(double, [])
    with pytest.raises(TypeError, match="callable"):
        capture_compile_logs(3, [(torch.ones(2),)])


def test_capture_compile_logs_prints_nothing_and_leaves_torchs_logging_as_it_was(capfd):
    from torch._logging import _internal

    from ptlab.compiling import capture_compile_logs

    def double(x):
        return x * 2

    capture_compile_logs(double, [(torch.ones(2),)])                        # dynamo's loggers exist from here on
    loggers = [logging.getLogger(q) for q in _internal.log_registry.get_artifact_log_qnames()]
    before = [(lg.name, lg.level, list(lg.handlers), lg.propagate) for lg in loggers]
    artifacts = set(_internal.log_state.artifact_names)
    capfd.readouterr()
    logs = capture_compile_logs(double, [(torch.ones(b),) for b in (2, 3)], dynamic=False)
    assert len(logs.recompiles) == 1
    assert [(lg.name, lg.level, list(lg.handlers), lg.propagate) for lg in loggers] == before
    assert _internal.log_state.artifact_names == artifacts
    assert "Recompiling" not in capfd.readouterr().err, "collected, not printed"
    later = torch.compile(lambda x: x + 1, backend="eager", dynamic=False)   # after the capture: nothing logged
    later(torch.ones(2))
    later(torch.ones(3))
    assert "Recompiling" not in capfd.readouterr().err


@pytest.mark.slow
def test_compiled_training_drift_with_dropout_needs_inductors_fallback_random():
    from ptlab.compiling import compiled_training_drift

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.5), nn.Linear(32, 4))
    batches = [(torch.randn(32, 16), torch.randint(0, 4, (32,))) for _ in range(3)]
    state = torch.get_rng_state()
    with torch._inductor.config.patch(fallback_random=True):     # Inductor draws from eager's generator
        same = compiled_training_drift(model, batches, lr=0.1)
    assert torch.equal(torch.get_rng_state(), state), "the caller's random state is restored"
    torch._dynamo.reset()              # Dynamo's guards do not cover Inductor's config: forget the graph above
    own = compiled_training_drift(model, batches, lr=0.1)            # Inductor's own random numbers
    assert same.max_abs_diff <= 1e-6 < 1e-4 <= own.max_abs_diff
