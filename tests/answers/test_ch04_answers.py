"""Chapter 4 exercises: right answers accepted, typical wrong ones rejected with the hint that names the fault."""
import pytest
import torch
from torch import nn

from ptlab import check
from ptlab.lessons.ch04_cnn_training.exercises import _variant, mystery_setup, reference_train_steps
from ptlab.models import SmallCNN
from ptlab.overfit import OverfitFailed, overfit_one_batch


def test_chapter_4_exercises_accept_right_and_reject_wrong_answers(capsys) -> None:
    assert check("ch4-fix-training-loop", reference_train_steps) == "correct"
    assert check("ch4-fix-training-loop", lambda m, o, b: _variant(m, o, b, zero_grad=False)) == "wrong"
    assert "zero_grad" in capsys.readouterr().out
    assert check("ch4-fix-training-loop", lambda m, o, b: _variant(m, o, b, softmax=True)) == "wrong"
    assert "logits" in capsys.readouterr().out

    def no_eval(model, batches):
        with torch.no_grad():
            return sum(int((model(X).argmax(1) == y).sum()) for X, y in batches) / 64

    assert check("ch4-evaluate-without-side-effects", no_eval) == "wrong"
    assert "model.eval()" in capsys.readouterr().out
    model, batch = mystery_setup()
    with pytest.raises(OverfitFailed) as failure:
        overfit_one_batch(model, batch)
    assert list(failure.value.report.causes) == ["frozen parameters"]
    assert check("ch4-overfit-cause", lambda m: m.requires_grad_(True)) == "correct"
    assert check("ch4-overfit-cause", lambda m: m) == "wrong"                       # still frozen
    assert "frozen parameters" in capsys.readouterr().out
    assert check("ch4-overfit-cause", lambda m: SmallCNN(width=8)) == "wrong"       # a new model is not a repair
    assert check("ch4-overfit-cause", lambda m: m.apply(lambda mod: mod.reset_parameters()
                                                        if isinstance(mod, nn.Linear) else None).requires_grad_(True)) == "wrong"
    assert "weights changed" in capsys.readouterr().out
