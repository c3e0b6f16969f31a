"""Chapter 6: mixed precision helpers, pitfalls and exercises."""
import torch
from torch import nn

from ptlab import check
from ptlab.amp import format_op_table, format_speed_table, op_dtypes, running_sum, scale_history
from ptlab.pitfalls import all_pitfalls

AMP_IDS = {"scaler-update-forgotten", "scaler-update-before-step", "clip-without-unscale",
           "fp16-without-scaler", "deprecated-amp-spelling", "manual-half-vs-autocast"}


def test_chapter_6_registers_the_amp_pitfalls():
    assert AMP_IDS <= {p.id for p in all_pitfalls(chapter=6)}


def test_op_dtypes_matmul_low_losses_float32():
    table = {op: out for op, _, out in op_dtypes()}
    assert table["x @ w (matmul)"] == table["nn.Conv2d"] == table["F.linear"] == "bfloat16"
    assert table["F.cross_entropy"] == table["F.mse_loss"] == "float32"
    assert format_op_table(op_dtypes()).splitlines()[0].startswith("op")


def test_scale_halves_after_inf_and_grows_back():
    history = scale_history(inf_at=(3,), steps=6, growth_interval=2, init_scale=1024.0)
    scales = [s for _, s, _ in history]
    skipped = [k for _, _, k in history]
    assert scales == [1024.0, 2048.0, 1024.0, 1024.0, 2048.0, 2048.0]
    assert skipped == [False, False, True, False, False, False]


def test_bf16_running_sum_stalls_and_float32_accumulator_fixes_it():
    values = torch.full((1000,), 0.01)
    assert running_sum(values, torch.bfloat16) < 5
    assert abs(running_sum(values, torch.bfloat16, torch.float32) - 10.0) < 0.05


def test_speed_table_left_aligns_measured_figures():
    text = format_speed_table({"float32": 100.0, "bf16 autocast": 50.0}, {"float32": 0.5, "bf16 autocast": 0.5})
    assert "≈0.5 " in text and text.splitlines()[2].startswith("bf16 autocast         ≈50")


def _amp_step(model, opt, scaler, X, y, max_norm):
    opt.zero_grad()
    with torch.amp.autocast("cpu", dtype=torch.bfloat16):
        loss = nn.functional.mse_loss(model(X).float(), y)
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(opt)
    scaler.update()
    return loss


def _no_unscale(model, opt, scaler, X, y, max_norm):
    opt.zero_grad()
    with torch.amp.autocast("cpu", dtype=torch.bfloat16):
        loss = nn.functional.mse_loss(model(X).float(), y)
    scaler.scale(loss).backward()
    nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(opt)
    scaler.update()
    return loss


def _no_update(model, opt, scaler, X, y, max_norm):
    opt.zero_grad()
    scaler.scale(nn.functional.mse_loss(model(X), y)).backward()
    scaler.step(opt)
    return torch.tensor(0.0)


def test_amp_step_exercise(capsys):
    assert check("ch6-amp-step", ...) == "not attempted"
    assert check("ch6-amp-step", _amp_step) == "correct"
    assert check("ch6-amp-step", _no_unscale) == "wrong"
    assert check("ch6-amp-step", _no_update) == "wrong"
    assert "update()" in capsys.readouterr().out


def test_fp32_accumulator_exercise():
    assert check("ch6-fp32-accumulator", lambda v: v.float().sum()) == "correct"
    assert check("ch6-fp32-accumulator", lambda v: v.sum()) == "wrong"


def test_speed_comparison_returns_three_positive_speeds():
    from ptlab.amp import speed_comparison
    from ptlab.models import SmallCNN

    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(4, 3, 16, 16, generator=g), torch.tensor([0, 1, 2, 3])) for _ in range(2)]
    speeds = speed_comparison(lambda: SmallCNN(width=4), batches)
    assert list(speeds) == ["float32", "bf16 autocast", "bf16 + channels_last"]
    assert all(v > 0 for v in speeds.values())
