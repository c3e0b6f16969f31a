"""Chapter 6 exercises: right answers accepted, typical wrong ones rejected with the hint that names the fault."""
import torch
from torch import nn

from ptlab import check


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
