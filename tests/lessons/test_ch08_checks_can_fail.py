"""Chapter 8's checks that replaced checks that could not fail: each one fails on the mistake it is about."""
import torch
from torch import nn

from ptlab.exporting import max_abs_diffs, serialized_bytes
from ptlab.lessons.ch08_compile_export.models import FunctionModule, make_mlp


def _refusal(fn):
    """What 08's export cell records: the program, or the exception export raised."""
    try:
        return torch.export.export(FunctionModule(fn), (torch.randn(8, 8),))
    except Exception as err:                     # the notebook's try_export
        return err


def test_the_refusal_check_names_the_data_dependent_guard_not_any_exception():
    """08: 'the branch on a tensor's value is refused: GuardOnDataDependentSymNode' (it was: any Exception)."""
    def data_branch(x):
        return torch.cos(x) if torch.sin(x).sum() > 0 else torch.exp(x)

    def broken(x):                               # refused too, for another reason: a mistake in the function
        return torch.sin(x) @ torch.ones(3, 3)

    assert type(_refusal(data_branch)).__name__ == "GuardOnDataDependentSymNode"
    wrong_reason = _refusal(broken)
    assert isinstance(wrong_reason, Exception)                                   # the old check passed on it
    assert type(wrong_reason).__name__ != "GuardOnDataDependentSymNode"         # the new one fails on it


def test_the_int8_size_check_fails_when_nothing_was_quantized():
    """08: 'size on disk, int8 / float32 in [0.2, 0.35]' (it was: the 3 Linear layers hold qint8 weights, which the
    call itself guarantees). A quantize_dynamic call aimed at the wrong layer type quantizes nothing."""
    import warnings

    torch.manual_seed(0)
    model = make_mlp(in_features=64, hidden=256, num_classes=10).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")          # the API's deprecation warnings
        right = torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)
        wrong = torch.ao.quantization.quantize_dynamic(model, {nn.Conv2d}, dtype=torch.qint8)
    size = serialized_bytes(model)
    assert 0.2 <= serialized_bytes(right) / size <= 0.35
    assert not 0.2 <= serialized_bytes(wrong) / size <= 0.35


def test_the_pt2_check_catches_a_program_exported_in_train_mode(tmp_path):
    """08: 'the loaded ExportedProgram matches eager within 1e-4' is 0 for the right program; it fails on one that
    computes something else, like a BatchNorm model exported in train mode."""
    from ptlab.exporting import save_and_load_pt2

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 2))
    for _ in range(20):
        model(2 * torch.randn(64, 8) + 3)        # running statistics of shifted data
    program = torch.export.export(model, (torch.randn(16, 8),))   # BUG: still in train mode
    loaded, _ = save_and_load_pt2(program, tmp_path, "bn.pt2")
    model.eval()
    assert max(max_abs_diffs(model, loaded.module(), [(16, 8)]).values()) > 1e-4
