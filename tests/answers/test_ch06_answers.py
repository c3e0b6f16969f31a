"""Chapter 6 exercises: right answers accepted, typical wrong ones rejected with the message that names the fault."""
import pytest
import torch
from torch import nn

from ptlab import check
from ptlab.lessons.ch06_amp.exercises import _batches, _setup

F = nn.functional


def _make_step(zero_grad="start", autocast_dtype=torch.float16, loss_fn=F.mse_loss, unscale=True, clip=True,
               step="scaler", update=True, returned="loss", unscale_after_step=False):
    """An amp_step with one thing changed from the right answer (the defaults are the right answer)."""

    def amp_step(model, opt, scaler, X, y, max_norm):
        if zero_grad == "start":
            opt.zero_grad()
        with torch.amp.autocast("cpu", dtype=autocast_dtype or torch.float16, enabled=autocast_dtype is not None):
            loss = loss_fn(model(X), y)
        scaled = scaler.scale(loss)
        scaled.backward()
        for _ in range({True: 1, False: 0, "twice": 2}[unscale]):
            scaler.unscale_(opt)
        if clip:
            nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        if step in ("scaler", "twice"):
            for _ in range(2 if step == "twice" else 1):
                scaler.step(opt)
        else:
            opt.step()
        if unscale_after_step:
            scaler.unscale_(opt)
        for _ in range({True: 1, False: 0, "twice": 2}[update]):
            scaler.update()
        if zero_grad == "end":
            opt.zero_grad()
        return scaled if returned == "scaled" else loss

    return amp_step


def _steps(amp_step):
    """Run amp_step on the check's three batches: the first loss, the weights and the scale after each step."""
    model, opt, scaler, X, y = _setup()
    losses, weights, scales = [], [], []
    for X_step, y_step in _batches(X, y):
        losses.append(amp_step(model, opt, scaler, X_step, y_step, 1.0).item())
        weights.append(torch.cat([p.detach().flatten() for p in model.parameters()]).tolist())
        scales.append(scaler.get_scale())
    return losses[0], weights, scales


def _amp_step_figures():
    loss, weights, scales = _steps(_make_step())
    figures = {"loss at step 1": loss, "weights after each step": weights, "scale after each step": scales}
    for name, mistake in (("without zero_grad", dict(zero_grad=None)), ("without unscale_", dict(unscale=False)),
                          ("without clipping", dict(clip=False))):
        figures[f"weights after each step {name}"] = _steps(_make_step(**mistake))[1]
    return figures


FIGURES = {"ch6-amp-step": _amp_step_figures}   # how each stored figure is made (test_stored_figures.py)


def test_amp_step_accepts_the_right_answers(capsys):
    assert check("ch6-amp-step", ...) == "not attempted"
    assert check("ch6-amp-step", _make_step()) == "correct"

    def with_float_output(model, opt, scaler, X, y, max_norm):     # model(X).float() and set_to_none spelled out
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.mse_loss(model(X).float(), y)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        scaler.step(opt)
        scaler.update()
        return loss

    assert check("ch6-amp-step", with_float_output) == "correct"


@pytest.mark.parametrize("mistake, message", [
    (dict(zero_grad=None), "a gradient left in .grad from before your step"),
    (dict(zero_grad="end"), "a gradient left in .grad from before your step"),
    (dict(unscale=False), "clip_grad_norm_ measured the scaled gradients"),
    (dict(clip=False), "the update was not clipped to max_norm"),
    (dict(update=False), "scaler.update() is missing"),
    (dict(unscale="twice"), "scaler.unscale_(opt) ran twice before update()"),
    (dict(update="twice"), "call it once per step, after scaler.step(opt)"),
    (dict(step="optimizer"), "which call skips a step whose gradients hold inf or NaN?"),
    (dict(step="optimizer", unscale=False), "scaler.update() found no inf/NaN checks"),
    (dict(autocast_dtype=torch.bfloat16), "autocast ran in torch.bfloat16: the task asks for torch.float16"),
    (dict(autocast_dtype=None), "model(X) ran without autocast"),
    (dict(returned="scaled"), "you returned the scaled loss"),
    (dict(loss_fn=F.l1_loss), "the task asks for nn.functional.mse_loss(model(X), y)"),
    (dict(loss_fn=F.cross_entropy), "the task asks for nn.functional.mse_loss(model(X), y)"),
])
def test_amp_step_rejects_each_mistake_with_its_own_message(capsys, mistake, message):
    assert check("ch6-amp-step", _make_step(**mistake)) == "wrong"
    out = capsys.readouterr().out
    assert message in out, out
    assert "could not use your answer" not in out


@pytest.mark.parametrize("mistake, message", [
    (dict(unscale="twice"), "scaler.unscale_(opt) ran twice before update()"),
    (dict(step="twice"), "scaler.step(opt) ran twice in one step"),
    (dict(unscale=False, unscale_after_step=True), "scaler.unscale_(opt) came after scaler.step(opt)"),
])
def test_an_answer_that_calls_update_is_not_told_it_is_missing(capsys, mistake, message):
    """Round 3 and round 4: torch's messages for a double unscale_, a double step and unscale_ after step all
    mention update(); each answer below calls update() once, so 'update() is missing' would be false."""
    assert check("ch6-amp-step", _make_step(**mistake)) == "wrong"
    out = capsys.readouterr().out
    assert message in out and "update() is missing" not in out, out


def test_fp32_accumulator_exercise(capsys):
    assert check("ch6-fp32-accumulator", ...) == "not attempted"
    assert check("ch6-fp32-accumulator", lambda v: v.float().sum()) == "correct"
    assert check("ch6-fp32-accumulator", lambda v: v.sum(dtype=torch.float32)) == "correct"
    capsys.readouterr()
    assert check("ch6-fp32-accumulator", lambda v: v.sum()) == "wrong"
    assert "only multiples of 4" in capsys.readouterr().out
    assert check("ch6-fp32-accumulator", lambda v: v.sum().float()) == "wrong"
    assert "the bfloat16 total converted afterwards" in capsys.readouterr().out
    assert check("ch6-fp32-accumulator", lambda v: v.double().sum()) == "wrong"
    out = capsys.readouterr().out
    assert "torch.float64, and the task asks for a float32 tensor." in out and "multiples of 4" not in out


def test_bfloat16_spacing_the_messages_state():
    """Between 512 and 1024 bfloat16 values are 4 apart (8 significant bits), from 1024 on 8 apart."""
    assert torch.tensor(1004.0).bfloat16().item() == 1004.0 and torch.tensor(1002.0).bfloat16().item() == 1000.0
    assert torch.tensor(1028.0).bfloat16().item() == 1024.0


def test_grads_cleared_between_backward_and_step_are_named_as_such(capsys):
    def cleared(model, opt, scaler, X, y, max_norm):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.mse_loss(model(X), y)
        scaler.scale(loss).backward()
        opt.zero_grad()                                  # the bug: .grad is gone before the step
        scaler.unscale_(opt)
        nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        scaler.step(opt)
        scaler.update()
        return loss

    assert check("ch6-amp-step", cleared) == "wrong"
    out = capsys.readouterr().out
    assert "did something clear .grad" in out and "(not opt.step())" not in out
