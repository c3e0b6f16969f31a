"""Chapter 8: torch.export, .pt2, ONNX export verified with onnxruntime, latency and quantization helpers."""
import pytest
import torch
from torch import nn

from ptlab.exporting import (
    LatencyRow,
    dynamic_shapes_for,
    export_onnx,
    export_program,
    format_diffs,
    format_latency_table,
    max_abs_diffs,
    onnx_input_shapes,
    onnx_session,
    run_onnx,
    save_and_load_pt2,
    serialized_bytes,
    time_side_by_side,
)
from ptlab.lessons.ch08_compile_export.models import SoftmaxOverSequence, TinyTransformerBlock
from ptlab.lessons.ch08_compile_export.quantization import legacy_dynamic_int8

SHAPES = [(1, 5, 8), (4, 10, 8), (3, 37, 8)]


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return SoftmaxOverSequence().eval()


def test_dynamic_shapes_for_names_dims_and_rejects_bad_input():
    spec = dynamic_shapes_for({0: "batch", 1: "seq"})
    assert list(spec) == ["x"] and sorted(spec["x"]) == [0, 1]
    with pytest.raises(TypeError, match="dim index"):
        dynamic_shapes_for({"0": "batch"})


def test_exported_program_saved_and_loaded_matches_eager_on_several_shapes(model, tmp_path):
    program = export_program(model, torch.randn(2, 10, 8), {0: "batch", 1: "seq"})
    loaded, size = save_and_load_pt2(program, tmp_path, "m.pt2")
    assert size > 0 and (tmp_path / "m.pt2").is_file()
    diffs = max_abs_diffs(model, loaded.module(), SHAPES)
    assert list(diffs) == SHAPES and max(diffs.values()) <= 1e-6
    assert "within 0.0001: True" in format_diffs(diffs, 1e-4)
    with pytest.raises(ValueError, match=".pt2"):
        save_and_load_pt2(program, tmp_path, "m.pt")


def test_export_with_a_fixed_dim_refuses_another_size(model):
    program = export_program(model, torch.randn(2, 10, 8), {0: "batch"})
    with pytest.raises(Exception, match="Guard failed"):
        program.module()(torch.randn(2, 11, 8))


def test_onnx_export_dynamic_dims_verified_with_onnxruntime(model, tmp_path):
    size = export_onnx(model, torch.randn(2, 10, 8), tmp_path / "m.onnx", {0: "batch", 1: "seq"})
    assert size > 0
    session = onnx_session(tmp_path / "m.onnx")
    assert onnx_input_shapes(session) == {"x": ["batch", "seq", 8]}
    diffs = max_abs_diffs(model, lambda t: run_onnx(session, t), SHAPES)
    assert max(diffs.values()) <= 1e-4
    with pytest.raises(ValueError, match=".onnx"):
        export_onnx(model, torch.randn(2, 10, 8), tmp_path / "m.bin", {0: "batch"})


def test_onnx_export_of_the_transformer_block_with_batch_and_seq(tmp_path):
    torch.manual_seed(0)
    block = TinyTransformerBlock(d_model=16, heads=2).eval()
    export_onnx(block, torch.randn(2, 6, 16), tmp_path / "b.onnx", {0: "batch", 1: "seq"})
    session = onnx_session(tmp_path / "b.onnx")
    diffs = max_abs_diffs(block, lambda t: run_onnx(session, t), [(1, 3, 16), (5, 17, 16)])
    assert max(diffs.values()) <= 1e-4


def test_max_abs_diffs_detects_a_difference_and_needs_shapes():
    diffs = max_abs_diffs(lambda x: x, lambda x: x + 0.5, [(2, 3)])
    assert diffs[(2, 3)] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="at least one"):
        max_abs_diffs(lambda x: x, lambda x: x, [])


def test_latency_table_runs_each_callable_and_left_aligns():
    counts = {"a": 0, "b": 0}
    rows = time_side_by_side({"a": lambda: counts.__setitem__("a", counts["a"] + 1),
                              "b": lambda: counts.__setitem__("b", counts["b"] + 1)}, repeats=4, warmup=1)
    assert counts == {"a": 5, "b": 5} and [r.name for r in rows] == ["a", "b"]
    table = format_latency_table([LatencyRow("eager", 0.002), LatencyRow("onnx", 0.001)])
    assert table.splitlines()[0].endswith("speed-up vs eager")           # eager time / time: above 1 is faster
    assert table.splitlines()[2].startswith("onnx") and table.splitlines()[2].endswith("≈2")
    with pytest.raises(ValueError, match="at least two"):
        time_side_by_side({"a": lambda: None})


def test_legacy_int8_shrinks_linear_weights_and_reports_the_deprecation():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)).eval()
    quantized, messages = legacy_dynamic_int8(model)
    assert serialized_bytes(quantized) < 0.4 * serialized_bytes(model)
    assert any(m.startswith("DeprecationWarning:") and "torchao" in m for m in messages)
    x = torch.randn(16, 64)
    with torch.no_grad():
        assert (quantized(x) - model(x)).abs().max().item() < 0.05


def test_onnx_export_of_a_sequential_takes_the_input_name_from_its_forward(tmp_path):
    torch.manual_seed(0)
    sequential = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3)).eval()   # forward(self, input)
    export_onnx(sequential, torch.randn(2, 8), tmp_path / "s.onnx", {0: "batch"})
    session = onnx_session(tmp_path / "s.onnx")
    assert onnx_input_shapes(session) == {"input": ["batch", 8]}
    assert max(max_abs_diffs(sequential, lambda t: run_onnx(session, t), [(1, 8), (7, 8)]).values()) <= 1e-5


class _Images(nn.Module):
    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return images.flatten(1).sum(1, keepdim=True)


def test_onnx_export_of_a_model_whose_argument_is_not_x(tmp_path):
    export_onnx(_Images().eval(), torch.randn(2, 3, 4, 4), tmp_path / "i.onnx", {0: "batch"})
    assert onnx_input_shapes(onnx_session(tmp_path / "i.onnx")) == {"images": ["batch", 3, 4, 4]}


def test_onnx_export_lets_the_train_mode_warning_reach_the_caller(tmp_path):
    train_mode = SoftmaxOverSequence().train()
    with pytest.warns(UserWarning, match="Exporting a model while it is in training mode"):
        export_onnx(train_mode, torch.randn(2, 10, 8), tmp_path / "t.onnx", {0: "batch"})


class _Warns(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import warnings

        warnings.warn("my own warning from forward", UserWarning)
        warnings.warn("# The axis name: seq will not be used, since it shares the same shape constraints with "
                      "another axis: batch.", UserWarning)          # the exporter's note on dim names
        return x * 2


def test_onnx_export_hides_only_the_exporters_notes(tmp_path):
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        export_onnx(_Warns().eval(), torch.randn(2, 3), tmp_path / "w.onnx", {0: "batch"})
    messages = [str(w.message) for w in caught]
    assert "my own warning from forward" in messages
    assert not any("will not be used" in m for m in messages)


def test_onnx_export_of_a_train_mode_batchnorm_uses_the_running_statistics(tmp_path):
    """Unlike torch.export, the ONNX exporter writes BatchNorm in inference form (and warns about train mode)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 2))
    for _ in range(20):
        model(2 * torch.randn(64, 8) + 3)
    with pytest.warns(UserWarning, match="training mode"):
        export_onnx(model, torch.randn(16, 8), tmp_path / "bn.onnx", {})
    session = onnx_session(tmp_path / "bn.onnx")
    model.eval()
    assert max_abs_diffs(model, lambda t: run_onnx(session, t), [(16, 8)])[(16, 8)] <= 1e-4


def test_function_module_exports_a_plain_function_and_export_is_non_strict(capsys):
    from ptlab.lessons.ch08_compile_export.models import FunctionModule

    def with_print(x):
        print("traced")
        return x * 2

    program = torch.export.export(FunctionModule(with_print), (torch.ones(2, 3),))
    assert capsys.readouterr().out == "traced\n"                # the print ran once, at export
    assert torch.equal(program.module()(torch.ones(2, 3)), 2 * torch.ones(2, 3))
    assert capsys.readouterr().out == "", "the print is not in the program"
    with pytest.raises(TypeError, match="callable"):
        FunctionModule(3)


def test_an_exported_program_cannot_be_switched_to_eval_afterwards():
    """What export-in-train-mode's why says: export again in eval mode, the program cannot be switched."""
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16)).train()
    program = torch.export.export(model, (torch.randn(4, 8),))
    with pytest.raises(NotImplementedError, match="eval"):
        program.module().eval()


def test_onnx_session_runs_on_the_threads_it_is_given(model, tmp_path):
    export_onnx(model, torch.randn(2, 10, 8), tmp_path / "t.onnx", {0: "batch", 1: "seq"})
    one = onnx_session(tmp_path / "t.onnx", threads=1).get_session_options()
    assert (one.intra_op_num_threads, one.inter_op_num_threads) == (1, 1)
    assert onnx_session(tmp_path / "t.onnx").get_session_options().intra_op_num_threads == 0   # onnxruntime's own
    with pytest.raises(ValueError, match="threads"):
        onnx_session(tmp_path / "t.onnx", threads=0)
